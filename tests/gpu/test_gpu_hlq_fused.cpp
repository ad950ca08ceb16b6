// HLQ's fused passes on CUDA against the CPU reference (Note [Column sums in the g̃ pass], docs/gradient_pipelines.md):
// the transposed 8-bit quantiser that also sums the columns of its input (the bias gradient of HLQ's identity-plan
// g̃ = g_y) keeps the CPU's codes and scales bit for bit, and its column sums (f32, the strip kernel's order) agree
// with f64 sums to a bound that a wrong row, column or strip would break; the launches the strip kernel does not
// serve fall back to the sum op. Then HLQ's backward and the product node with a bias, CUDA against the CPU.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;
using namespace ht::grad;

namespace {

// "" when sums (C) is within 4e-6·Σ_rows |x| (+ rel of |Σ x|, the result dtype's rounding) of the f64 column sums of
// x (N, C) (any leading dims). The f32 sums of n terms in the strip kernel's order (4 rows, 32 lanes, then the
// 128-row strips in 8 runs) err by about (4 + 5 + n / 1024 + 8) roundings of 2^-24 times Σ |x|, so 4e-6 covers
// n up to 50 000 rows; a dropped or doubled row of random data moves a sum by far more.
std::string sums_close(const Tensor& sums, const Tensor& x, double rel) {
  const int64_t C = x.size(x.dim() - 1);
  const Tensor x64 = reshape(x.to(DType::f64), {-1, C});
  const std::vector<double> ref = sum(x64, {0}).to_vector<double>();
  const std::vector<double> mag = sum(abs(x64), {0}).to_vector<double>();
  const std::vector<double> got = sums.to(Device::cpu()).to(DType::f64).to_vector<double>();
  if (static_cast<int64_t>(got.size()) != C) return "sums " + sums.describe() + " for " + x.describe();
  for (int64_t c = 0; c < C; ++c) {
    const double bound = 4e-6 * mag[c] + rel * std::fabs(ref[c]) + 1e-30;
    if (!(std::fabs(got[c] - ref[c]) <= bound))
      return "column " + std::to_string(c) + ": " + std::to_string(got[c]) + " vs " + std::to_string(ref[c]);
  }
  return {};
}

Quantized quantize_poisoned(const Tensor& x, const QuantSpec& spec) {
  test::PoisonGuard poison;
  return quantize(x, spec);
}

}  // namespace

TEST_CASE("CUDA quantize sums the columns in the strip kernel's pass; codes and scales keep the CPU's bits",
          "[gpu][grad_quant][hlq]") {
  struct Case {
    Shape shape;
    DType dtype;
    int64_t offset;  // elements the input view starts into its storage
    bool strip;      // the strip kernel serves it (C % 8 == 0, rows % 4 == 0, 16-byte aligned): f32 sums in its pass
  };
  const std::vector<Case> cases = {
      {{64 * 197, 768}, DType::bf16, 0, true},  // ViT-B/16 g_y of one proj / fc2 layer at batch 64
      {{2, 100, 144}, DType::bf16, 0, true},    // 200 rows: a partial last strip of 72 rows
      {{132, 32}, DType::f32, 0, true},
      {{36, 48}, DType::f16, 8, true},          // a view 16 bytes into its storage
      {{70, 16}, DType::f32, 0, false},         // rows % 4 != 0: the tile kernel, then the sum op
      {{97, 72}, DType::f16, 3, false},         // unaligned: the tile kernel
      {{36, 20}, DType::bf16, 0, false},        // C % 8 != 0: quantise, then transpose
  };
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const int64_t n = numel_of(c.shape);
    const Tensor flat = test::random_input({n + c.offset}, ++seed, c.dtype);
    const Tensor xc = flat.narrow(0, c.offset, n).reshape(c.shape);
    const Tensor xg = flat.to(test::kCuda).narrow(0, c.offset, n).reshape(c.shape);
    for (const bool known : {false, true}) {  // HLQ's g̃ pass takes m from the g_x pass (known_absmax)
      QuantSpec spec;
      spec.bits = 8;
      spec.granularity = Granularity::tensor;
      spec.rounding = Rounding::stochastic;
      spec.noise = {21, 8};
      spec.layout = ValuesLayout::transposed;
      spec.report_column_sums = true;
      if (known) {
        spec.known_absmax = from_vector(std::vector<float>{max(abs(xc.to(DType::f32))).to_vector<float>()[0]}, {1});
      }
      const Quantized qc = quantize(xc, spec);
      if (known) spec.known_absmax = spec.known_absmax.to(test::kCuda);
      const Quantized qg = quantize_poisoned(xg, spec);
      CAPTURE(xc.describe(), known, c.strip);
      CHECK(test::compare_bits(qg.values, qc.values) == "");
      CHECK(test::compare_bits(qg.scale, qc.scale) == "");
      REQUIRE(qg.column_sums.defined());
      CHECK(qg.column_sums.is_cuda());
      if (c.strip) CHECK(qg.column_sums.dtype() == DType::f32);
      // The fallback's sum op rounds to the input dtype (f16 / bf16: 2^-11 / 2^-8 relative).
      const double rel = c.strip || c.dtype == DType::f32 ? 0.0 : (c.dtype == DType::f16 ? 1e-3 : 8e-3);
      CHECK(sums_close(qg.column_sums, xc, rel) == "");
    }
  }
  // A zero input: zero codes, scale 0, zero sums (the strip kernel sums even when m is 0).
  QuantSpec spec;
  spec.bits = 8;
  spec.layout = ValuesLayout::transposed;
  spec.report_column_sums = true;
  const Quantized qz = quantize_poisoned(zeros({72, 16}, {DType::f32, test::kCuda}), spec);
  CHECK(test::compare_bits(qz.values, zeros({16, 72}, {DType::i8, Device::cpu()})) == "");
  CHECK(test::compare_bits(qz.column_sums, zeros({16}, {DType::f32, Device::cpu()})) == "");
}

TEST_CASE("hlq on CUDA: the bias gradient from the g~ pass matches the CPU, g_x and g_w unchanged by it",
          "[gpu][grad][hlq]") {
  test::PoisonGuard poison;
  for (DType dt : {DType::f32, DType::bf16}) {
    // 65 tokens: the identity HLA plan (fallback ref), where the g̃ quantiser reads g_y itself.
    const Tensor x = test::random_input({4, 65, 48}, 1, DType::f32).to(dt);
    const Tensor w = mul(test::random_input({64, 48}, 2, DType::f32), 0.1).to(dt);
    const Tensor g = mul(test::random_input({4, 65, 64}, 3, DType::f32), 0.01).to(dt);
    grad::PipelineSpec spec;
    spec.name = "hlq";
    const grad::NoiseKey key{11, 2, 5};
    grad::Grads out[3];  // CPU with b, CUDA without, CUDA with
    for (int run = 0; run < 3; ++run) {
      const Device dev = run == 0 ? Device::cpu() : test::kCuda;
      auto p = grad::make_pipeline(spec);
      grad::ForwardResult f = p->forward(x.to(dev), w.to(dev), {}, key, grad::SaveForBackward::yes);
      out[run] = p->backward(*f.saved, g.to(dev), {true, true, run != 1});
    }
    INFO(dtype_name(dt));
    REQUIRE(out[0].b.defined());
    REQUIRE(out[2].b.defined());
    CHECK_FALSE(out[1].b.defined());
    CHECK(out[2].b.dtype() == DType::f32);  // the strip kernel's sums (260 rows, 64 columns)
    CHECK(sums_close(out[2].b, g, 0.0) == "");
    CHECK(test::compare_bits(out[2].x, out[1].x.to(Device::cpu())) == "");
    CHECK(test::compare_bits(out[2].w, out[1].w.to(Device::cpu())) == "");
    const double tol = dt == DType::f32 ? 1e-4 : 1.5e-2;
    CHECK(test::rel_error(out[2].x, out[0].x) < tol);
    CHECK(test::rel_error(out[2].w, out[0].w) < tol);
  }
}

TEST_CASE("grad::product with a bias on CUDA: hlq's bias gradient matches the CPU's sum", "[gpu][grad][hlq]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    Tensor gb[2];
    for (int dev = 0; dev < 2; ++dev) {
      const Device d = dev == 0 ? Device::cpu() : test::kCuda;
      grad::PipelineSpec spec;
      spec.name = "hlq";
      grad::ProductCall call{grad::make_pipeline(spec), {}, grad::NoiseKey{3, 1, 4}, nullptr};
      // 4·33 = 132 rows (a multiple of 4) and 24 columns: the strip kernel sums them on CUDA.
      Tensor x = test::leaf(test::random_input({4, 33, 32}, 4, DType::f32).to(dt), d);
      Tensor w = test::leaf(test::random_input({24, 32}, 5, DType::f32).to(dt), d);
      Tensor b = test::leaf(test::random_input({24}, 6, DType::f32).to(dt), d);
      const Tensor g = test::random_input({4, 33, 24}, 7, DType::f32).to(dt).to(d);
      sum(mul(grad::product(x, w, call, b), g)).backward();
      gb[dev] = b.grad();
      CHECK(gb[dev].dtype() == dt);
    }
    // One rounding of nearly equal f32 sums to the bias dtype: one bf16 ulp at most.
    CHECK(test::rel_error(gb[1], gb[0]) < (dt == DType::f32 ? 1e-5 : 1e-2));
  }
}
