// The bias gradient from HLQ's g̃ pass (Note [Column sums in the g̃ pass], docs/gradient_pipelines.md): quantize's
// report_column_sums (the sums of every dim but the last, the quantised values and scales unchanged), HLQ's
// backward returning Grads::b exactly when its 8-bit quantiser reads g_y itself, and the product node using it: on
// the CPU the bias gradient keeps the bits of the node's own sum, and g_x / g_w are the same with or without it.
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

namespace {

// "" when a and b hold the same dtype, shape and bits.
std::string same(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return "undefined";
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return a.describe() + " vs " + b.describe();
  return test::compare(a.to(DType::f64), b.to(DType::f64), 0.0, 0.0);
}

grad::PipelineSpec hlq(grad::ScaleGranularity gw_scale = grad::ScaleGranularity::tensor,
                       grad::HlaFallback fallback = grad::HlaFallback::ref) {
  grad::PipelineSpec s;
  s.name = "hlq";
  s.options_as<grad::HlqOptions>().gw_scale = gw_scale;
  s.options_as<grad::HlqOptions>().fallback = fallback;
  return s;
}

}  // namespace

TEST_CASE("quantize reports the column sums of its input and leaves the codes alone", "[grad_quant]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = test::random_tensor({3, 37, 24}, 11, DType::f32).to(dt);
    grad::QuantSpec spec;
    spec.bits = 8;
    spec.granularity = grad::Granularity::tensor;
    spec.rounding = grad::Rounding::stochastic;
    spec.noise = {4, 9};
    spec.layout = grad::ValuesLayout::transposed;
    const grad::Quantized plain = grad::quantize(x, spec);
    CHECK_FALSE(plain.column_sums.defined());
    spec.report_column_sums = true;
    const grad::Quantized with = grad::quantize(x, spec);
    INFO(dtype_name(dt));
    CHECK(same(with.values, plain.values) == "");
    CHECK(same(with.scale, plain.scale) == "");
    CHECK(same(with.column_sums, sum(x, {0, 1})) == "");
    // Against f64 sums: the sum op's f32 accumulation, then dt's rounding.
    const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
    CHECK(test::compare(with.column_sums.to(DType::f64), sum(x.to(DType::f64), {0, 1}), tol, tol) == "");
  }
  grad::QuantSpec spec;
  spec.report_column_sums = true;
  CHECK_THROWS_WITH(grad::quantize(test::random_tensor({16}, 1, DType::f32), spec),
                    HasSubstr("report_column_sums needs at least two dims"));
}

TEST_CASE("hlq returns the bias gradient from its g~ pass only when that pass reads g_y itself", "[grad]") {
  struct Case {
    const char* label;
    int64_t L;
    grad::PipelineSpec spec;
    bool fused;
  };
  const std::vector<Case> cases = {
      {"identity plan (65 tokens), tensor scales", 65, hlq(), true},
      {"identity plan, per-sample scales", 65, hlq(grad::ScaleGranularity::sample), false},
      {"projected plan (64 tokens)", 64, hlq(), false},
      {"split_extra (65 = 1 + 64)", 65, hlq(grad::ScaleGranularity::tensor, grad::HlaFallback::split_extra), false},
  };
  for (const Case& c : cases) {
    INFO(c.label);
    const Tensor x = test::random_tensor({2, c.L, 24}, 1, DType::f32);
    const Tensor w = mul(test::random_tensor({16, 24}, 2, DType::f32), 0.2);
    const Tensor g = mul(test::random_tensor({2, c.L, 16}, 3, DType::f32), 0.01);
    grad::Grads got[2];
    for (int with_b = 0; with_b < 2; ++with_b) {
      auto p = grad::make_pipeline(c.spec);
      grad::ForwardResult f = p->forward(x, w, {}, grad::NoiseKey{5, 1, 2}, grad::SaveForBackward::yes);
      got[with_b] = p->backward(*f.saved, g, {true, true, with_b == 1});
    }
    CHECK_FALSE(got[0].b.defined());
    CHECK(got[1].b.defined() == c.fused);
    if (c.fused) CHECK(same(got[1].b, sum(g, {0, 1})) == "");
    // Asking for the bias changes neither product (same noise, same codes).
    CHECK(same(got[1].x, got[0].x) == "");
    CHECK(same(got[1].w, got[0].w) == "");
  }
}

TEST_CASE("grad::product takes the bias gradient from hlq's pass with the bits of its own sum", "[grad]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    grad::ProductCall call{grad::make_pipeline(hlq()), {}, grad::NoiseKey{3, 1, 4}, nullptr};
    Tensor x = test::random_tensor({2, 33, 16}, 4, DType::f32).to(dt);
    Tensor w = test::random_tensor({8, 16}, 5, DType::f32).to(dt);
    Tensor b = test::random_tensor({8}, 6, DType::f32).to(dt);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    const Tensor g = test::random_tensor({2, 33, 8}, 7, DType::f32).to(dt);
    sum(mul(grad::product(x, w, call, b), g)).backward();
    CHECK(same(b.grad(), sum(g, {0, 1}).to(dt)) == "");
    // Only the bias wants a gradient: the pipeline's backward does not run, the node sums g_y.
    Tensor x2 = x.detach(), w2 = w.detach(), b2 = b.detach();
    b2.set_requires_grad(true);
    sum(mul(grad::product(x2, w2, call, b2), g)).backward();
    CHECK(same(b2.grad(), b.grad()) == "");
  }
}
