// CUDA optimiser steps (fused SGD / AdamW), global-norm clipping, dropout, rotary embedding, attention
// and cat against the CPU reference: same inputs on both devices, outputs and gradients compared with
// the dtype tolerance table (dropout masks and cat bit for bit), outputs poisoned so unwritten elements
// fail.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <functional>
#include <memory>

#include "hadatrain/optim/optimizer.h"

using namespace ht;
using namespace ht::optim;

namespace {

using test::leaf;

// ---- optimisers ----

struct ParamSpec {
  Shape shape;
  DType dtype;
  bool decay;
  bool transposed_grad;  // the gradient is a non-contiguous (transposed) view
};

const std::vector<ParamSpec> kParamSpecs = {
    {{7, 13}, DType::f32, true, true},  {{13}, DType::f32, false, false}, {{1}, DType::f32, false, false},
    {{100003}, DType::f32, true, false}, {{5, 3}, DType::f64, true, true}, {{1001}, DType::f64, false, false},
};

// Runs 3 steps of the optimiser `make` on the CPU and on CUDA with the same gradients; "" when the
// parameters and every state tensor agree (f64 to 1e-14, f32 to about one ulp).
std::string check_optimizer(const std::function<std::unique_ptr<Optimizer>(std::vector<ParamRef>)>& make) {
  std::vector<Tensor> cpu, gpu;
  for (std::size_t i = 0; i < kParamSpecs.size(); ++i) {
    const Tensor init = test::random_input(kParamSpecs[i].shape, 100 + i, kParamSpecs[i].dtype);
    cpu.push_back(leaf(init, Device::cpu()));
    gpu.push_back(leaf(init, test::kCuda));
  }
  std::vector<ParamRef> cpu_refs, gpu_refs;
  for (std::size_t i = 0; i < kParamSpecs.size(); ++i) {
    cpu_refs.push_back({fmt::format("p{}", i), &cpu[i], kParamSpecs[i].decay});
    gpu_refs.push_back({fmt::format("p{}", i), &gpu[i], kParamSpecs[i].decay});
  }
  auto opt_cpu = make(cpu_refs), opt_gpu = make(gpu_refs);
  const double lrs[3] = {0.1, 0.05, 0.02};
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < kParamSpecs.size(); ++i) {
      const ParamSpec& s = kParamSpecs[i];
      Tensor g;
      if (s.transposed_grad) {
        g = test::random_input({s.shape[1], s.shape[0]}, 1000 + 10 * step + i, s.dtype).transpose(0, 1);
      } else {
        g = test::random_input(s.shape, 1000 + 10 * step + i, s.dtype);
      }
      cpu[i].set_grad(g);
      gpu[i].set_grad(g.to(test::kCuda));
    }
    opt_cpu->step(lrs[step]);
    opt_gpu->step(lrs[step]);
  }
  auto tol = [](DType dt) { return dt == DType::f64 ? test::Tolerance{1e-14, 1e-15} : test::Tolerance{2e-7, 1e-8}; };
  for (std::size_t i = 0; i < kParamSpecs.size(); ++i) {
    const std::string msg = test::compare_to_cpu(gpu[i], cpu[i], tol(kParamSpecs[i].dtype));
    if (!msg.empty()) return fmt::format("parameter {}: {}", i, msg);
  }
  const auto sc = opt_cpu->state_tensors(), sg = opt_gpu->state_tensors();
  if (sc.size() != sg.size()) return fmt::format("{} state tensors on the CPU, {} on CUDA", sc.size(), sg.size());
  for (const auto& [name, t] : sc) {
    auto it = sg.find(name);
    if (it == sg.end()) return "no CUDA state " + name;
    const std::string msg = test::compare_to_cpu(it->second, t, tol(t.dtype()));
    if (!msg.empty()) return fmt::format("state {}: {}", name, msg);
  }
  return {};
}

// ---- attention ----

struct AttnCase {
  const char* name;
  int64_t B, Hq, Hkv, T, S, D, Dv;
  AttentionOptions opts;
};

}  // namespace

TEST_CASE("SGD steps on CUDA equal the CPU steps (momentum, Nesterov, dampening, decay groups)", "[gpu][optim]") {
  const std::vector<std::pair<const char*, SgdOptions>> configs = {
      {"plain", SgdOptions{}},
      {"plain with decay", SgdOptions{.weight_decay = 0.1}},
      {"momentum + decay", SgdOptions{.momentum = 0.9, .weight_decay = 0.05}},
      {"momentum + dampening", SgdOptions{.momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01}},
      {"nesterov", SgdOptions{.momentum = 0.9, .weight_decay = 0.1, .nesterov = true}},
  };
  for (const auto& [name, o] : configs) {
    INFO(name);
    CHECK(check_optimizer([o = o](std::vector<ParamRef> refs) { return make_sgd(std::move(refs), o); }) == "");
  }
}

TEST_CASE("AdamW steps on CUDA equal the CPU steps (bias correction, decoupled decay)", "[gpu][optim]") {
  const std::vector<std::pair<const char*, AdamWOptions>> configs = {
      {"defaults", AdamWOptions{}},
      {"strong decay, other betas", AdamWOptions{.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.3}},
      {"no decay", AdamWOptions{.weight_decay = 0.0}},
  };
  for (const auto& [name, o] : configs) {
    INFO(name);
    CHECK(check_optimizer([o = o](std::vector<ParamRef> refs) { return make_adamw(std::move(refs), o); }) == "");
  }
}

TEST_CASE("clip_grad_norm on CUDA gives the CPU norm and scaled gradients", "[gpu][optim]") {
  Tensor a_cpu = leaf(test::random_input({7, 13}, 1, DType::f32), Device::cpu());
  Tensor b_cpu = leaf(test::random_input({1001}, 2, DType::f64), Device::cpu());
  Tensor a_gpu = leaf(a_cpu, test::kCuda), b_gpu = leaf(b_cpu, test::kCuda);
  const Tensor ga = test::random_input({7, 13}, 3, DType::f32), gb = test::random_input({1001}, 4, DType::f64);
  a_cpu.set_grad(ga.clone());
  b_cpu.set_grad(gb.clone());
  a_gpu.set_grad(ga.to(test::kCuda));
  b_gpu.set_grad(gb.to(test::kCuda));
  const double n_cpu = clip_grad_norm({{"a", &a_cpu, true}, {"b", &b_cpu, true}}, 1.0);
  const double n_gpu = clip_grad_norm({{"a", &a_gpu, true}, {"b", &b_gpu, true}}, 1.0);
  CHECK(n_cpu > 1.0);  // clipping happened
  CHECK(n_gpu == Approx(n_cpu).epsilon(1e-6));
  CHECK(test::compare_to_cpu(a_gpu.grad(), a_cpu.grad(), {1e-5, 1e-7}) == "");
  CHECK(test::compare_to_cpu(b_gpu.grad(), b_cpu.grad(), {1e-6, 1e-9}) == "");
}

TEST_CASE("dropout on CUDA draws the CPU's masks bit for bit, forward and backward", "[gpu][dropout]") {
  uint64_t seed_in = 50;
  for (DType dt : test::kFloatDTypes) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{7}, uint64_t{0x123456789ABCDEFull}}) {
      for (int skip : {0, 3}) {  // later streams of the generator
        for (const Shape& shape : {Shape{1}, Shape{5}, Shape{7, 143}, Shape{3, 1001}}) {
          for (double p : {0.1, 0.5, 0.9}) {
            INFO(dtype_name(dt) << " seed " << seed << " skip " << skip << " shape " << shape.size() << " p " << p);
            const Tensor x = test::random_input(shape, ++seed_in, dt);
            const bool transpose = shape.size() == 2;  // a non-contiguous input view
            Generator gc(seed), gg(seed);
            for (int i = 0; i < skip; ++i) {
              gc.next_stream();
              gg.next_stream();
            }
            Tensor xc = leaf(x, Device::cpu()), xg = leaf(x, test::kCuda);
            const Tensor yc = dropout(transpose ? xc.transpose(0, 1) : xc, p, gc);
            Tensor yg;
            {
              test::PoisonGuard poison;
              yg = dropout(transpose ? xg.transpose(0, 1) : xg, p, gg);
            }
            REQUIRE(test::compare_bits(yg, yc) == "");
            const Tensor gy = test::random_input(yc.shape(), ++seed_in, dt);
            yc.backward(gy);
            {
              test::PoisonGuard poison;
              yg.backward(gy.to(test::kCuda));
            }
            REQUIRE(test::compare_bits(xg.grad(), xc.grad()) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("rotary_embedding on CUDA matches the CPU in both styles, forward and backward", "[gpu][rope]") {
  uint64_t seed = 300;
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    for (RopeStyle style : {RopeStyle::rotate_half, RopeStyle::interleaved}) {
      for (int64_t offset : {int64_t{0}, int64_t{37}}) {
        for (const Shape& shape : {Shape{2, 3, 5, 8}, Shape{1, 2, 77, 6}, Shape{1, 1, 1, 2}}) {
          INFO(dtype_name(dt) << " style " << static_cast<int>(style) << " offset " << offset << " T " << shape[2]);
          const RopeParams rp{1000.0 + static_cast<double>(offset), offset, style};
          // x stored as (B, T, H, D) and viewed as (B, H, T, D): non-contiguous
          const Tensor x = test::random_input({shape[0], shape[2], shape[1], shape[3]}, ++seed, dt);
          Tensor xc = leaf(x, Device::cpu()), xg = leaf(x, test::kCuda);
          const Tensor yc = rotary_embedding(xc.permute({0, 2, 1, 3}), rp);
          Tensor yg;
          {
            test::PoisonGuard poison;
            yg = rotary_embedding(xg.permute({0, 2, 1, 3}), rp);
          }
          CHECK(test::compare_to_cpu(yg, yc) == "");
          const Tensor gy = test::random_input(yc.shape(), ++seed, dt);
          yc.backward(gy);
          yg.backward(gy.to(test::kCuda));
          CHECK(test::compare_to_cpu(xg.grad(), xc.grad()) == "");
        }
      }
    }
  }
}

TEST_CASE("scaled_dot_product_attention on CUDA matches the CPU, forward and backward", "[gpu][attention]") {
  const std::vector<AttnCase> cases = {
      {"causal T < S, grouped kv, Dv != D", 2, 4, 2, 5, 7, 8, 6, {AttnMask::causal, 0.0}},
      {"causal T > S (empty rows), 3 heads per kv head", 1, 3, 1, 7, 5, 4, 9, {AttnMask::causal, 0.0}},
      {"no mask, custom scale", 2, 2, 2, 9, 11, 16, 16, {AttnMask::none, 0.3}},
      {"causal, keys over several tiles", 1, 2, 1, 3, 300, 12, 5, {AttnMask::causal, 0.0}},
      {"no mask, long rows", 1, 1, 1, 130, 131, 33, 7, {AttnMask::none, 0.0}},
  };
  uint64_t seed = 700;
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    // f32 and f64 compute in double like the CPU; bf16 computes in float, then rounds once
    const test::Tolerance tol = dt == DType::f64   ? test::Tolerance{1e-10, 1e-12}
                                : dt == DType::f32 ? test::Tolerance{1e-5, 1e-6}
                                                   : test::Tolerance{1.6e-2, 2e-3};
    for (const AttnCase& c : cases) {
      INFO(dtype_name(dt) << ": " << c.name);
      // q stored as (B, T, Hq, D) and viewed as (B, Hq, T, D): non-contiguous
      const Tensor q = test::random_input({c.B, c.T, c.Hq, c.D}, ++seed, dt);
      const Tensor k = test::random_input({c.B, c.Hkv, c.S, c.D}, ++seed, dt);
      const Tensor v = test::random_input({c.B, c.Hkv, c.S, c.Dv}, ++seed, dt);
      Tensor qc = leaf(q, Device::cpu()), kc = leaf(k, Device::cpu()), vc = leaf(v, Device::cpu());
      Tensor qg = leaf(q, test::kCuda), kg = leaf(k, test::kCuda), vg = leaf(v, test::kCuda);
      const Tensor oc = scaled_dot_product_attention(qc.permute({0, 2, 1, 3}), kc, vc, c.opts);
      Tensor og;
      {
        test::PoisonGuard poison;
        og = scaled_dot_product_attention(qg.permute({0, 2, 1, 3}), kg, vg, c.opts);
      }
      CHECK(test::compare_to_cpu(og, oc, tol) == "");
      const Tensor go = test::random_input(oc.shape(), ++seed, dt);
      oc.backward(go);
      {
        test::PoisonGuard poison;
        og.backward(go.to(test::kCuda));
      }
      CHECK(test::compare_to_cpu(qg.grad(), qc.grad(), tol) == "");
      CHECK(test::compare_to_cpu(kg.grad(), kc.grad(), tol) == "");
      CHECK(test::compare_to_cpu(vg.grad(), vc.grad(), tol) == "");
    }
  }
}

TEST_CASE("cat and stack on CUDA equal the CPU bit for bit, with backward", "[gpu][cat]") {
  const Tensor a = test::random_input({3, 5, 4}, 1, DType::f32);
  const Tensor b = test::random_input({4, 3, 7}, 2, DType::bf16);  // viewed as (3, 7, 4): strided, promoted
  const Tensor c = test::random_input({3, 1, 4}, 3, DType::f32);
  Tensor ac = leaf(a, Device::cpu()), bc = leaf(b, Device::cpu()), cc = leaf(c, Device::cpu());
  Tensor ag = leaf(a, test::kCuda), bg = leaf(b, test::kCuda), cg = leaf(c, test::kCuda);
  const Tensor yc = cat({ac, bc.permute({1, 2, 0}), cc}, 1);
  Tensor yg;
  {
    test::PoisonGuard poison;
    yg = cat({ag, bg.permute({1, 2, 0}), cg}, 1);
  }
  REQUIRE(yg.is_cuda());
  CHECK(test::compare_bits(yg, yc) == "");
  const Tensor gy = test::random_input(yc.shape(), 4, DType::f32);
  yc.backward(gy);
  yg.backward(gy.to(test::kCuda));
  CHECK(test::compare_bits(ag.grad(), ac.grad()) == "");
  CHECK(test::compare_bits(bg.grad(), bc.grad()) == "");
  CHECK(test::compare_bits(cg.grad(), cc.grad()) == "");

  const Tensor s = test::random_input({2, 3}, 5, DType::f64);
  const Tensor t = test::random_input({3, 2}, 6, DType::f64);
  CHECK(test::compare_bits(stack({s.to(test::kCuda), t.to(test::kCuda).transpose(0, 1)}, -1),
                           stack({s, t.transpose(0, 1)}, -1)) == "");
  // the last dim: many small slices
  CHECK(test::compare_bits(cat({a.to(test::kCuda), c.to(test::kCuda).expand({3, 5, 4})}, 2),
                           cat({a, c.expand({3, 5, 4})}, 2)) == "");
}
