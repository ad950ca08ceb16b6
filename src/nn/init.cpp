// Initialisers. Values are generated on the host from Philox (so they do not depend on the device) and
// copied into the parameter.
#include "hadatrain/nn/init.h"

#include <algorithm>
#include <cmath>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"

namespace ht::nn::init {
namespace {
void assign(Tensor& t, const Tensor& host_values) {
  NoGradGuard ng;
  copy_(t.detach(), host_values);
}

// Inverse of the standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9), refined by one
// Newton step on erfc.
double normal_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01,  -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double plow = 0.02425;
  double x;
  if (p < plow) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - plow) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
}  // namespace

int64_t fan_in(const Tensor& w) {
  HT_CHECK(w.dim() >= 2, "fan_in: expected a weight with at least 2 dims, got {}", w.describe());
  return w.numel() / w.size(0);
}
int64_t fan_out(const Tensor& w) {
  HT_CHECK(w.dim() >= 2, "fan_out: expected a weight with at least 2 dims, got {}", w.describe());
  return w.numel() / w.size(1);
}

void uniform_(Tensor& t, double low, double high, Generator& gen) {
  assign(t, uniform(t.shape(), low, high, gen, {DType::f64}));
}

void normal_(Tensor& t, double mean, double std, Generator& gen) { assign(t, normal(t.shape(), mean, std, gen, {DType::f64})); }

void trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator& gen) {
  HT_CHECK(std > 0 && a < b, "trunc_normal_: need std > 0 and a < b, got std {}, [{}, {}]", std, a, b);
  const double lo = normal_cdf((a - mean) / std), hi = normal_cdf((b - mean) / std);
  Tensor u = uniform(t.shape(), 0.0, 1.0, gen, {DType::f64});
  double* p = u.data<double>();
  for (int64_t i = 0; i < u.numel(); ++i) {
    const double q = std::clamp(lo + (hi - lo) * p[i], 1e-300, 1.0 - 1e-16);
    p[i] = std::clamp(mean + std * normal_quantile(q), a, b);
  }
  assign(t, u);
}

void constant_(Tensor& t, double value) {
  NoGradGuard ng;
  fill_(t.detach(), value);
}

void default_linear_weight_(Tensor& w, Generator& gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in(w)));
  uniform_(w, -bound, bound, gen);
}

void default_linear_bias_(Tensor& b, int64_t fan_in_value, Generator& gen) {
  const double bound = fan_in_value > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in_value)) : 0.0;
  uniform_(b, -bound, bound, gen);
}

void kaiming_normal_fan_out_(Tensor& w, Generator& gen) {
  normal_(w, 0.0, std::sqrt(2.0 / static_cast<double>(fan_out(w))), gen);
}

}  // namespace ht::nn::init
