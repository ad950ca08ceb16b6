// Test helpers: random tensors and comparisons.
#include "testing.h"

#include <stdlib.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ht::test {

TempDir::TempDir(const std::string& tag) {
  std::string pattern = (std::filesystem::temp_directory_path() / ("ht_" + tag + "_XXXXXX")).string();
  HT_CHECK(::mkdtemp(pattern.data()) != nullptr, "TempDir: mkdtemp({}) failed", pattern);
  path = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  Generator gen(seed);
  return uniform(shape, lo, hi, gen, {dtype});
}

std::string compare(const Tensor& actual, const std::vector<double>& expected, double rtol, double atol) {
  const auto a = actual.to_vector<double>();
  if (a.size() != expected.size())
    return fmt::format("size mismatch: actual {} has {} elements, expected {}", actual.describe(), a.size(),
                       expected.size());
  std::string msg;
  int shown = 0;
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], e = expected[i];
    const bool both_nan = std::isnan(x) && std::isnan(e);
    const bool same_inf = std::isinf(x) && std::isinf(e) && (x > 0) == (e > 0);
    if (both_nan || same_inf) continue;
    const double err = std::abs(x - e);
    if (!(err <= atol + rtol * std::abs(e))) {
      ++bad;
      worst = std::max(worst, err);
      if (shown++ < 5) msg += fmt::format("  [{}] actual {:.10g} expected {:.10g}\n", i, x, e);
    }
  }
  if (bad == 0) return {};
  return fmt::format("{} of {} elements differ (worst abs error {:.3g}; rtol {}, atol {}):\n{}", bad, a.size(), worst,
                     rtol, atol, msg);
}

std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (!(actual.shape() == expected.shape()))
    return fmt::format("shape mismatch: actual {} vs expected {}", actual.describe(), expected.describe());
  return compare(actual, expected.to_vector<double>(), rtol, atol);
}

double rel_error(const Tensor& actual, const Tensor& reference) {
  const std::vector<double> a = actual.to(Device::cpu()).to_vector<double>();
  const std::vector<double> r = reference.to(Device::cpu()).to_vector<double>();
  if (a.size() != r.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - r[i]) * (a[i] - r[i]);
    den += r[i] * r[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

}  // namespace ht::test
