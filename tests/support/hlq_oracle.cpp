// The f64 oracle of HLQ's quantised backward products (hlq_oracle.h).
#include "hlq_oracle.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/grad/hla.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "testing.h"

namespace ht::test {
namespace {

using Vec = std::vector<double>;

int64_t low_pow2(int64_t v) { return v & -v; }

// Sylvester Hadamard entry H[k][t] = (−1)^popcount(k AND t) (hlq.md §1), independent of the library's butterfly.
double hadamard(int64_t k, int64_t t) { return (std::popcount(static_cast<uint64_t>(k & t)) & 1) ? -1.0 : 1.0; }

// v (rows, C) row-major, T dividing C: every run of T values along C times H_T (x·H_T, H_T symmetric).
Vec rotate(const Vec& v, int64_t T) {
  Vec out(v.size(), 0.0);
  for (std::size_t base = 0; base < v.size(); base += static_cast<std::size_t>(T))
    for (int64_t j = 0; j < T; ++j) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += hadamard(t, j) * v[base + static_cast<std::size_t>(t)];
      out[base + static_cast<std::size_t>(j)] = s;
    }
  return out;
}

// v (B, L, C) -> (B, R, C), R = (L/n)·r: out[b, p·r + i, c] = Σ_t H_n[rows[i]][t] · v[b, p·n + t, c] (Note [HLA
// projection]), with the plan's kept natural rows.
Vec project(const Vec& v, int64_t B, int64_t L, int64_t C, const grad::HlaPlan& plan) {
  const int64_t n = plan.block, r = plan.kept(), R = plan.projected_length();
  Vec out(static_cast<std::size_t>(B * R * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < L / n; ++p)
      for (int64_t i = 0; i < r; ++i)
        for (int64_t t = 0; t < n; ++t) {
          const double h = hadamard(plan.rows[static_cast<std::size_t>(i)], t);
          const double* src = &v[static_cast<std::size_t>((b * L + p * n + t) * C)];
          double* dst = &out[static_cast<std::size_t>((b * R + p * r + i) * C)];
          for (int64_t c = 0; c < C; ++c) dst[c] += h * src[c];
        }
  return out;
}

// The quantiser's output as f64 codes (row-major in the input's layout) and scales.
struct Codes {
  Vec q, s;
  int64_t group_len = 0;  // consecutive elements per scale
};

Codes codes_of(const Tensor& values_source, const grad::QuantSpec& spec) {
  grad::QuantSpec q = spec;
  q.values_dtype = DType::i8;
  q.layout = grad::ValuesLayout::natural;  // same codes and noise indices as the transposed layout
  const grad::Quantized r = grad::quantize(values_source, q);
  Codes c{r.values.to_vector<double>(), r.scale.to_vector<double>(), 0};
  c.group_len = static_cast<int64_t>(c.q.size() / c.s.size());
  return c;
}

// Checks the codes and scales of one operand against its f64 values `v` (the same layout), per hlq.md §3.3, §3.5
// (absmax: s = max|v| / qmax; SAWB: α = 12.1·sqrt(mean v²) − 12.2·mean|v|, absmax when α <= 0; s = α / qmax;
// nearest: |code − clamp(v)/s| <= 1/2; stochastic: code is clamp(v)/s rounded down or up).
void check_codes(const std::string& what, const Codes& c, const Vec& v, const grad::QuantSpec& spec,
                 std::vector<std::string>& problems) {
  const int qmax = grad::qmax_of(spec.bits);
  int reported = 0;
  auto report = [&](const std::string& msg) {
    if (reported++ < 4) problems.push_back(what + ": " + msg);
  };
  if (c.q.size() != v.size()) {
    report(fmt::format("{} codes for {} values", c.q.size(), v.size()));
    return;
  }
  for (std::size_t g = 0; g < c.s.size(); ++g) {
    const std::size_t begin = g * static_cast<std::size_t>(c.group_len), end = begin + c.group_len;
    double amax = 0, s1 = 0, s2 = 0;
    for (std::size_t k = begin; k < end; ++k) {
      amax = std::max(amax, std::abs(v[k]));
      s1 += std::abs(v[k]);
      s2 += v[k] * v[k];
    }
    double m = amax;
    if (spec.scale_rule == grad::ScaleRule::sawb) {
      const double dn = static_cast<double>(c.group_len);
      const double alpha = 12.1 * std::sqrt(s2 / dn) - 12.2 * (s1 / dn);
      if (std::isfinite(alpha) && alpha > 0) m = alpha;
    }
    const double s = m / qmax;
    // The quantiser works in f32 from f32 inputs: its scale agrees to a few f32 roundings of the f64 one.
    if (std::abs(c.s[g] - s) > 1e-5 * s) {
      report(fmt::format("group {}: scale {} but the data give {} (m {} / qmax {})", g, c.s[g], s, m, qmax));
      continue;
    }
    for (std::size_t k = begin; k < end; ++k) {
      const double code = c.q[k];
      if (std::abs(code) > qmax || code != std::round(code)) {
        report(fmt::format("element {}: code {} outside −{}..{}", k, code, qmax, qmax));
        continue;
      }
      if (s == 0) {
        if (code != 0) report(fmt::format("element {}: code {} in an all-zero group", k, code));
        continue;
      }
      const double x = std::clamp(v[k], -m, m) / s;
      // The quantiser's input is f32 (hla_project's sums of n terms): next to a rounding boundary its value / scale
      // may fall on the other side of the f64 one, by a few f32 roundings of the value.
      const double eps = 1e-4 + 2e-5 * std::abs(x);
      const bool ok = spec.rounding == grad::Rounding::nearest
                          ? std::abs(code - x) <= 0.5 + eps
                          : code >= std::floor(x - eps) && code <= std::ceil(x + eps);
      if (!ok)
        report(fmt::format("element {}: code {} for value / scale {} ({} rounding)", k, code, x,
                           spec.rounding == grad::Rounding::nearest ? "nearest" : "stochastic"));
    }
  }
}

Vec values_f64(const Tensor& t) { return t.contiguous().to(DType::f64).to_vector<double>(); }

double rel_norm_error(const Vec& a, const Vec& ref) {
  double num = 0, den = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    num += (a[k] - ref[k]) * (a[k] - ref[k]);
    den += ref[k] * ref[k];
  }
  return std::sqrt(num / den);
}

}  // namespace

HlqOracle hlq_oracle(const Tensor& x, const Tensor& w, const Tensor& g_y, const grad::HlqOptions& o,
                     const grad::NoiseKey& key, OracleX x_form) {
  HT_CHECK(x.is_cpu() && w.is_cpu() && g_y.is_cpu(), "hlq_oracle: CPU tensors expected");
  HT_CHECK(o.gx_bits > 0, "hlq_oracle: gx_bits must be > 0");
  const int64_t B = x.size(0), L = x.size(1), I = x.size(2), O = w.size(0);
  HlqOracle out;

  // ---- g_x (HQ): 4-bit rotated g_y (stochastic) and W (SAWB / absmax, nearest or stochastic) ----
  const int64_t T = std::min(o.block, low_pow2(O));
  grad::QuantSpec qg;
  qg.bits = o.gx_bits;
  qg.granularity = o.gy_scale == grad::ScaleGranularity::token    ? grad::Granularity::row
                   : o.gy_scale == grad::ScaleGranularity::sample ? grad::Granularity::sample
                                                                  : grad::Granularity::tensor;
  qg.rounding = grad::Rounding::stochastic;
  qg.noise = key.noise(kRoleGxGy);
  qg.hadamard_block = T;
  const Codes cg = codes_of(g_y, qg);
  check_codes("g_y (g_x product)", cg, rotate(values_f64(g_y), T), qg, out.problems);

  const Tensor wt = w.transpose(0, 1).contiguous();  // (I, O)
  grad::QuantSpec qw;
  qw.bits = o.gx_bits;
  qw.granularity = grad::Granularity::tensor;
  qw.scale_rule = o.w_quant == grad::WeightQuant::sawb ? grad::ScaleRule::sawb : grad::ScaleRule::absmax;
  qw.rounding = o.w_quant == grad::WeightQuant::absmax_sr ? grad::Rounding::stochastic : grad::Rounding::nearest;
  qw.noise = key.noise(kRoleGxW);
  qw.hadamard_block = T;
  const Codes cw = codes_of(wt, qw);
  check_codes("W (g_x product)", cw, rotate(values_f64(wt), T), qw, out.problems);

  Vec gx(static_cast<std::size_t>(B * L * I)), gxb(gx.size());
  const double sw = cw.s[0] / static_cast<double>(T);
  for (int64_t r = 0; r < B * L; ++r) {
    const double sg = cg.s[static_cast<std::size_t>(r * O / cg.group_len)];
    const double* a = &cg.q[static_cast<std::size_t>(r * O)];
    for (int64_t i = 0; i < I; ++i) {
      const double* b = &cw.q[static_cast<std::size_t>(i * O)];
      double s = 0, sa = 0;
      for (int64_t k = 0; k < O; ++k) {
        s += a[k] * b[k];
        sa += std::abs(a[k] * b[k]);
      }
      gx[static_cast<std::size_t>(r * I + i)] = sg * sw * s;
      gxb[static_cast<std::size_t>(r * I + i)] = std::abs(sg * sw) * sa;
    }
  }
  out.g_x = from_vector(gx, {B, L, I}, {DType::f64});
  out.g_x_bound = from_vector(gxb, {B, L, I}, {DType::f64});
  const Tensor gx_exact = matmul(g_y.to(DType::f64), w.to(DType::f64));  // (B, L, I)
  out.gx_error = rel_norm_error(gx, values_f64(gx_exact));
  if (o.gw_bits == 0) return out;

  // ---- g_w (HLA): projected g̃ (8-bit, stochastic, absmax) and x̃ (acbp bits, x_scale rule, nearest) ----
  HT_CHECK(grad::hla_block_for(L) > 1 || o.fallback == grad::HlaFallback::ref,
           "hlq_oracle: L {} without a power-of-two factor needs fallback ref", L);
  const grad::HlaPlan plan = grad::hla_plan(L, o.rank);
  const int64_t n = plan.block, R = plan.projected_length();
  const bool per_sample = o.gw_scale == grad::ScaleGranularity::sample;
  // The pipeline quantises hla_project's f32 output (the compute-dtype input itself for the identity plan).
  const Tensor gp = n == 1 ? g_y : grad::hla_project(g_y, plan);
  const Tensor xp = n == 1 ? x : grad::hla_project(x, plan);
  grad::QuantSpec qgt;
  qgt.bits = o.gw_bits;
  qgt.granularity = per_sample ? grad::Granularity::sample : grad::Granularity::tensor;
  qgt.rounding = grad::Rounding::stochastic;
  qgt.noise = key.noise(kRoleGwGy);
  const Codes cgt = codes_of(gp, qgt);
  const Vec gp64 = project(values_f64(g_y), B, L, O, plan), xp64 = project(values_f64(x), B, L, I, plan);
  check_codes("projected g_y (g_w product)", cgt, gp64, qgt, out.problems);

  grad::QuantSpec qx;
  qx.bits = o.acbp_bits > 0 ? o.acbp_bits : o.gw_bits;  // without ACBP the kept projection is quantised in backward
  qx.granularity = qgt.granularity;
  qx.scale_rule = o.x_scale;
  qx.rounding = grad::Rounding::nearest;
  Codes cx;
  if (x_form == OracleX::codes) {
    cx = codes_of(xp, qx);
    check_codes("projected x (g_w product)", cx, xp64, qx, out.problems);
  } else {  // the exact projection as "codes" with scale 1
    cx.q = xp64;
    cx.s.assign(per_sample ? static_cast<std::size_t>(B) : 1, 1.0);
    cx.group_len = static_cast<int64_t>(cx.q.size() / cx.s.size());
  }

  Vec gw(static_cast<std::size_t>(O * I), 0.0), gwb(gw.size(), 0.0), gw_proj(gw.size(), 0.0);
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t b = 0; b < B; ++b) {
    const std::size_t gs = per_sample ? static_cast<std::size_t>(b) : 0;
    const double scale = cgt.s[gs] * cx.s[gs] * inv_n;
    for (int64_t k = 0; k < R; ++k) {
      const double* a = &cgt.q[static_cast<std::size_t>((b * R + k) * O)];
      const double* xv = &cx.q[static_cast<std::size_t>((b * R + k) * I)];
      const double* ae = &gp64[static_cast<std::size_t>((b * R + k) * O)];
      const double* xe = &xp64[static_cast<std::size_t>((b * R + k) * I)];
      for (int64_t oo = 0; oo < O; ++oo)
        for (int64_t i = 0; i < I; ++i) {
          const std::size_t e = static_cast<std::size_t>(oo * I + i);
          gw[e] += scale * a[oo] * xv[i];
          gwb[e] += std::abs(scale * a[oo] * xv[i]);
          gw_proj[e] += inv_n * ae[oo] * xe[i];
        }
    }
  }
  out.g_w = from_vector(gw, {O, I}, {DType::f64});
  out.g_w_bound = from_vector(gwb, {O, I}, {DType::f64});
  out.gw_error = rel_norm_error(gw, gw_proj);
  return out;
}

std::string within_bound(const Tensor& got, const Tensor& ref, const Tensor& bound, double rel) {
  if (!(got.shape() == ref.shape()) || !(ref.shape() == bound.shape()))
    return fmt::format("shapes differ: got {}, oracle {}, bound {}", got.describe(), ref.describe(), bound.describe());
  const Vec g = values_f64(got.to(Device::cpu())), r = values_f64(ref), b = values_f64(bound);
  std::string msg;
  int64_t bad = 0;
  double worst = 0;
  for (std::size_t k = 0; k < g.size(); ++k) {
    const double err = std::abs(g[k] - r[k]);
    const double ratio = b[k] > 0 ? err / b[k] : (err == 0 ? 0.0 : INFINITY);
    worst = std::max(worst, std::isnan(err) ? INFINITY : ratio);
    if (!(err <= rel * b[k])) {
      if (bad++ < 5) msg += fmt::format("  [{}] got {}, oracle {}, |diff| / bound {:.3g}\n", k, g[k], r[k], ratio);
    }
  }
  if (bad == 0) return {};
  return fmt::format("{} of {} elements differ from the oracle by more than {:.3g} of their bound (worst {:.3g}):\n{}",
                     bad, g.size(), rel, worst, msg);
}

}  // namespace ht::test

namespace ht::test {

std::vector<OracleCase> hlq_oracle_cases() {
  std::vector<OracleCase> cases;
  OracleCase c;
  c.name = "Linear, defaults (per-token g_y, fp8 carrier, SAWB W, tensor-scale HLA, 8-bit ACBP)";
  cases.push_back(c);

  c = OracleCase{};
  c.name = "Linear, per-sample g_y, int8 carrier, absmax W, per-sample HLA scales";
  c.options.gy_scale = grad::ScaleGranularity::sample;
  c.options.carrier = grad::Carrier::int8;
  c.options.w_quant = grad::WeightQuant::absmax;
  c.options.gw_scale = grad::ScaleGranularity::sample;
  c.B = 3;
  c.rel_w = 2e-5;  // per-sample scales: scaled codes split into two bf16 halves (|error| <= 2^-18 per term)
  cases.push_back(c);

  c = OracleCase{};
  c.name = "Linear, tensor g_y, stochastic absmax W, 4-bit ACBP, absmax x̃, n 16 (L 16), T 4 (O 12)";
  c.options.gy_scale = grad::ScaleGranularity::tensor;
  c.options.w_quant = grad::WeightQuant::absmax_sr;
  c.options.acbp_bits = 4;
  c.options.x_scale = grad::ScaleRule::absmax;
  c.L = 16;
  c.O = 12;
  cases.push_back(c);

  c = OracleCase{};
  c.name = "Linear, 13 tokens (identity HLA, fallback ref), T 1 (O 7), int8 carrier";
  c.options.carrier = grad::Carrier::int8;
  c.L = 13;
  c.O = 7;
  cases.push_back(c);

  c = OracleCase{};
  c.name = "Conv2d, the default columns products (conv_gx columns, conv_gw columns: the specification's)";
  c.conv_channels = 3;
  c.side = 8;
  c.O = 16;
  cases.push_back(c);

  c = OracleCase{};
  c.name = "Conv2d, conv_gx dgrad_simulated (scaled codes rounded to f32, then the convolution backward)";
  c.options.conv_gx = grad::ConvGx::dgrad_simulated;
  c.conv_channels = 4;
  c.side = 8;
  c.O = 32;
  c.rel_x = 2e-5;
  cases.push_back(c);
  return cases;
}

OracleRun run_oracle_case(const OracleCase& c, Device device) {
  const bool conv = c.conv_channels > 0;
  const int64_t L = conv ? c.side * c.side : c.L, I = conv ? c.conv_channels * 9 : c.I;
  const uint64_t seed = 1000 + static_cast<uint64_t>(c.B * 131 + L * 17 + I * 7 + c.O);
  Unfold2dParams window;
  window.kernel_h = window.kernel_w = 3;
  window.pad_h = window.pad_w = 1;
  Tensor image, x;
  if (conv) {
    image = random_tensor({c.B, c.conv_channels, c.side, c.side}, seed, DType::f32);
    x = unfold2d(image, window);  // (B, L, I)
  } else {
    x = random_tensor({c.B, L, I}, seed, DType::f32);
  }
  const Tensor w = random_tensor({c.O, I}, seed + 1, DType::f32);
  // g_y with a few large entries per sample, as real output gradients have (the rotation spreads them).
  std::vector<float> gv = random_tensor({c.B, L, c.O}, seed + 2, DType::f32).to_vector<float>();
  for (std::size_t k = 0; k < gv.size(); k += 37) gv[k] *= 10.0f;
  const Tensor g_y = from_vector(gv, {c.B, L, c.O}, {DType::f32});

  grad::PipelineSpec spec;
  spec.name = "hlq";
  spec.options = c.options;
  auto pipeline = grad::make_pipeline(spec);
  const grad::NoiseKey key{11, 5, 3};
  grad::ForwardResult f;
  if (conv) {
    grad::ProductInfo info;
    info.grid_h = info.grid_w = c.side;
    info.image = image.to(device);
    info.window = window;
    f = pipeline->forward_conv(w.to(device), info, key, grad::SaveForBackward::yes);
  } else {
    f = pipeline->forward(x.to(device), w.to(device), {}, key, grad::SaveForBackward::yes);
  }
  const grad::Grads g = pipeline->backward(*f.saved, g_y.to(device), {true, true});

  const HlqOracle oracle = hlq_oracle(x, w, g_y, c.options, key);
  OracleRun run;
  for (const std::string& p : oracle.problems) run.quantiser += p + "\n";
  run.gx_error = oracle.gx_error;
  run.gw_error = oracle.gw_error;
  Tensor gx_ref = oracle.g_x, gx_bound = oracle.g_x_bound;
  if (g.x_is_image) {  // the image's gradient: the columns' folded (fold2d adds in f64 for f64)
    const Fold2dParams fp{c.conv_channels, c.side, c.side, window};
    gx_ref = fold2d(gx_ref, fp);
    gx_bound = fold2d(gx_bound, fp);
  }
  run.g_x = within_bound(g.x, gx_ref, gx_bound, c.rel_x);
  run.g_w = within_bound(g.w, oracle.g_w, oracle.g_w_bound, c.rel_w);
  const double off = 1.0 + 1.0 / 64.0;
  if (within_bound(g.x, mul(gx_ref, off), gx_bound, c.rel_x).empty())
    run.sensitivity += "g_x also matches the oracle scaled by 1 + 2^-6\n";
  if (within_bound(g.w, mul(oracle.g_w, off), oracle.g_w_bound, c.rel_w).empty())
    run.sensitivity += "g_w also matches the oracle scaled by 1 + 2^-6\n";
  return run;
}

}  // namespace ht::test
