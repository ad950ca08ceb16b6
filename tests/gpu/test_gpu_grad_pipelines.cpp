// Gradient pipelines on CUDA against the CPU reference with the same noise key: the quantised integers are
// bit-identical on both backends (tests/gpu/test_gpu_grad_quant.cpp, test_gpu_grad_hla.cpp), so g_x and g_w
// differ only by the accumulation order of the products and by the final rounding to the input dtype.
// Every pipeline and the main options, f32 and bf16 inputs, shapes with T = 16 / 4 and n = 64 / 1 (the
// fallbacks), poisoned CUDA allocations. Also an end-to-end Linear + Conv2d step through bound pipelines.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"

using namespace ht;

namespace {

double rel_err(const Tensor& a, const Tensor& ref) {
  const Tensor d = sub(a.to(Device::cpu()).to(DType::f64), ref.to(Device::cpu()).to(DType::f64));
  const Tensor r = ref.to(Device::cpu()).to(DType::f64);
  const double rr = sum(mul(r, r)).item();
  return std::sqrt(sum(mul(d, d)).item() / (rr > 0 ? rr : 1.0));
}

struct Case {
  std::string label;
  grad::PipelineSpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  grad::PipelineSpec s;
  c.push_back({"exact", s});
  s.name = "hlq";
  c.push_back({"hlq default", s});
  grad::PipelineSpec t = s;
  t.hlq.gy_scale = grad::ScaleGranularity::sample;
  t.hlq.carrier = grad::Carrier::int8;
  t.hlq.w_quant = grad::WeightQuant::absmax_sr;
  t.hlq.gw_scale = grad::ScaleGranularity::sample;
  c.push_back({"hlq sample int8 absmax_sr", t});
  t = s;
  t.hlq.gy_scale = grad::ScaleGranularity::tensor;
  t.hlq.gw_scale = grad::ScaleGranularity::tensor;
  t.hlq.acbp_bits = 4;
  t.hlq.fallback = grad::HlaFallback::split_extra;
  c.push_back({"hlq tensor acbp4 split_extra", t});
  t = s;
  t.hlq.fallback = grad::HlaFallback::pad;
  t.hlq.x_scale = grad::ScaleRule::absmax;
  t.hlq.acbp_bits = 0;
  c.push_back({"hlq pad no-acbp", t});
  grad::PipelineSpec l;
  l.name = "lbp_wht";
  c.push_back({"lbp_wht", l});
  grad::PipelineSpec q;
  q.name = "luq";
  c.push_back({"luq", q});
  return c;
}

}  // namespace

TEST_CASE("every pipeline: CUDA gradients match the CPU reference with the same noise", "[gpu][grad]") {
  test::PoisonGuard poison;
  struct Shape3 {
    int64_t B, L, I, O;
  };
  // L 64 (n 64; 8×8 grid), L 65 (n 1: fallbacks; class token + 8×8), O 100 (T 4), odd I.
  for (const Shape3 sh : {Shape3{3, 64, 48, 32}, Shape3{2, 65, 37, 100}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = test::random_input({sh.B, sh.L, sh.I}, 1, DType::f32).to(dt);
      const Tensor w = mul(test::random_input({sh.O, sh.I}, 2, DType::f32), 0.1).to(dt);
      const Tensor g = mul(test::random_input({sh.B, sh.L, sh.O}, 3, DType::f32), 0.01).to(dt);
      for (const Case& c : cases()) {
        auto pc = grad::make_pipeline(c.spec);
        auto pg = grad::make_pipeline(c.spec);
        const grad::NoiseKey key{11, 2, 5};
        grad::ForwardResult fc = pc->forward(x, w, {}, key, true);
        grad::ForwardResult fg = pg->forward(x.to(test::kCuda), w.to(test::kCuda), {}, key, true);
        const grad::Grads gc = pc->backward(*fc.saved, g, {true, true});
        const grad::Grads gg = pg->backward(*fg.saved, g.to(test::kCuda), {true, true});
        INFO(c.label << ", " << dtype_name(dt) << ", B " << sh.B << " L " << sh.L << " I " << sh.I << " O " << sh.O);
        CHECK(fg.saved->bytes == fc.saved->bytes);
        CHECK(gg.x.is_cuda());
        CHECK(gg.x.dtype() == dt);
        CHECK(gg.w.dtype() == dt);
        // f32: the products differ in accumulation order only; bf16: plus one rounding of the result.
        const double tol = dt == DType::f32 ? 1e-4 : 1.5e-2;
        CHECK(rel_err(fg.y, fc.y) < tol);
        CHECK(rel_err(gg.x, gc.x) < tol);
        CHECK(rel_err(gg.w, gc.w) < tol);
      }
    }
  }
}

TEST_CASE("bound pipelines train a Linear + Conv2d step on CUDA like on the CPU", "[gpu][grad]") {
  test::PoisonGuard poison;
  for (const std::string name : {"hlq", "lbp_wht", "luq"}) {
    std::vector<Tensor> grads[2];
    for (int dev = 0; dev < 2; ++dev) {
      Generator gen(4);
      nn::Conv2dOptions o;
      o.in_channels = 3;
      o.out_channels = 16;
      o.padding = 1;
      auto conv = std::make_shared<nn::Conv2d>(o, gen);
      auto lin = std::make_shared<nn::Linear>(16, 10, nn::Bias::yes, gen);
      grad::PipelineConfig cfg;
      cfg.default_spec.name = name;
      auto clock = std::make_shared<grad::StepClock>();
      nn::bind_pipelines(*conv, cfg, clock);
      nn::bind_pipelines(*lin, cfg, clock);
      Tensor x = test::random_input({4, 3, 8, 8}, 9, DType::f32);
      if (dev == 1) {
        conv->to(test::kCuda);
        lin->to(test::kCuda);
        x = x.to(test::kCuda);
      }
      const Tensor h = relu(conv->forward(x));                     // (4, 16, 8, 8)
      const Tensor y = lin->forward(permute(h, {0, 2, 3, 1}));      // (4, 8, 8, 10): tokens through Linear
      sum(mul(y, y)).backward();
      grads[dev] = {conv->weight.grad(), conv->bias.grad(), lin->weight.grad(), lin->bias.grad()};
    }
    INFO(name);
    for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(rel_err(grads[1][i], grads[0][i]) < 1e-4);
  }
}
