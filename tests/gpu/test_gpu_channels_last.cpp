// Channels-last (NHWC) conv2d through cuDNN against the CPU reference (which permutes to NCHW): forward and
// the gradients of x, weight and bias in f32, f64 and bf16 (f64 may take the NCHW fallback inside the CUDA
// glue when cuDNN has no NHWC f64 algorithm; the result must be the same), and the CUDA NHWC result against
// the CUDA NCHW one; then a ResNet-18 bf16 training step channels last vs NCHW on the GPU (same weights:
// losses and the head's gradient close, two SGD steps).
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <memory>

#include "hadatrain/models/resnet.h"
#include "hadatrain/optim/optimizer.h"

using namespace ht;

namespace {

struct Case {
  const char* name;
  int64_t N, C, H, W, O, K;
  Conv2dParams p;
  bool bias;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  auto params = [](int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
    Conv2dParams p;
    p.stride_h = p.stride_w = stride;
    p.pad_h = p.pad_w = pad;
    p.dilation_h = p.dilation_w = dil;
    p.groups = groups;
    p.layout = ConvLayout::nhwc;
    return p;
  };
  cs.push_back({"3x3 pad 1", 2, 3, 7, 9, 4, 3, params(1, 1, 1, 1), true});
  cs.push_back({"3x3 stride 2 pad 1", 3, 8, 11, 10, 16, 3, params(2, 1, 1, 1), true});
  cs.push_back({"1x1 stride 2, no bias", 3, 8, 5, 5, 16, 1, params(2, 0, 1, 1), false});
  cs.push_back({"groups 2", 2, 4, 9, 9, 6, 3, params(1, 1, 1, 2), true});
  cs.push_back({"dilation 2", 2, 3, 13, 11, 5, 3, params(1, 2, 2, 1), true});
  cs.push_back({"resnet 3x3 64 -> 64", 8, 64, 16, 16, 64, 3, params(1, 1, 1, 1), false});
  return cs;
}

// Relative norm error allowed per dtype: f32 leaves room for FFT / Winograd algorithms (about 1e-4 relative
// per element, test_gpu_conv.cpp), TF32 would exceed it on the larger cases; bf16 rounds its output.
double tolerance(DType dt) { return dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 1e-4 : 1e-2; }

struct Result {
  Tensor y, gx, gw, gb;
};

// y = conv2d(x, w, b) and the gradients of sum(y * r), on `dev` in `dt`, with inputs given in f64 on the CPU.
Result run(const Case& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r, Device dev, DType dt,
           ConvLayout layout) {
  auto leaf = [&](const Tensor& t) {
    Tensor l = t.to(dt).to(dev).detach();
    l.set_requires_grad(true);
    return l;
  };
  Tensor xl = leaf(layout == ConvLayout::nhwc ? x : contiguous(permute(x, {0, 3, 1, 2})));
  Tensor wl = leaf(w), bl = c.bias ? leaf(b) : Tensor();
  Conv2dParams p = c.p;
  p.layout = layout;
  Tensor y = conv2d(xl, wl, bl, p);
  if (layout == ConvLayout::nchw) y = permute(y, {0, 2, 3, 1});  // compare in (N, OH, OW, O)
  sum(mul(y, r.to(dt).to(dev))).backward();
  Tensor gx = xl.grad();
  if (layout == ConvLayout::nchw) gx = permute(gx, {0, 2, 3, 1});
  return {y, gx, wl.grad(), c.bias ? bl.grad() : Tensor()};
}

}  // namespace

TEST_CASE("conv2d channels last on CUDA matches the CPU reference and the CUDA NCHW result", "[gpu][conv]") {
  uint64_t seed = 1000;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (const Case& c : cases()) {
      INFO(c.name << " " << dtype_name(dt));
      const Tensor x = test::random_input({c.N, c.H, c.W, c.C}, seed++, DType::f64, -1, 1);  // (N, H, W, C)
      const Tensor w = test::random_input({c.O, c.C / c.p.groups, c.K, c.K}, seed++, DType::f64, -1, 1);
      const Tensor b = test::random_input({c.O}, seed++, DType::f64, -1, 1);
      const int64_t OH = (c.H + 2 * c.p.pad_h - c.p.dilation_h * (c.K - 1) - 1) / c.p.stride_h + 1;
      const int64_t OW = (c.W + 2 * c.p.pad_w - c.p.dilation_w * (c.K - 1) - 1) / c.p.stride_w + 1;
      const Tensor r = test::random_input({c.N, OH, OW, c.O}, seed++, DType::f64, 0.5, 1.5);
      // CPU reference in f64 from the values the device run sees (rounded to dt).
      const Tensor xr = x.to(dt).to(DType::f64), wr = w.to(dt).to(DType::f64), br = b.to(dt).to(DType::f64);
      const Tensor rr = r.to(dt).to(DType::f64);
      const Result ref = run(c, xr, wr, br, rr, Device::cpu(), DType::f64, ConvLayout::nhwc);
      Result nhwc, nchw;
      {
        test::PoisonGuard poison;  // an output element cuDNN or the glue forgot to write is NaN
        nhwc = run(c, x, w, b, r, test::kCuda, dt, ConvLayout::nhwc);
        nchw = run(c, x, w, b, r, test::kCuda, dt, ConvLayout::nchw);
      }
      REQUIRE(nhwc.y.is_cuda());
      CHECK(nhwc.y.dtype() == dt);
      CHECK(nhwc.y.shape() == Shape{c.N, OH, OW, c.O});
      CHECK(nhwc.gx.shape() == Shape{c.N, c.H, c.W, c.C});
      CHECK(nhwc.gw.shape() == w.shape());
      const double tol = tolerance(dt);
      CHECK(test::rel_error(nhwc.y, ref.y) <= tol);
      CHECK(test::rel_error(nhwc.gx, ref.gx) <= tol);
      CHECK(test::rel_error(nhwc.gw, ref.gw) <= tol);
      if (c.bias) CHECK(test::rel_error(nhwc.gb, ref.gb) <= tol);
      CHECK(test::rel_error(nhwc.y, nchw.y) <= tol);
      CHECK(test::rel_error(nhwc.gx, nchw.gx) <= tol);
      CHECK(test::rel_error(nhwc.gw, nchw.gw) <= tol);
      // Again: the cached algorithm choice gives the same result.
      const Result again = run(c, x, w, b, r, test::kCuda, dt, ConvLayout::nhwc);
      CHECK(test::rel_error(again.y, ref.y) <= tol);
      CHECK(test::rel_error(again.gw, ref.gw) <= tol);
    }
}

TEST_CASE("a ResNet-18 bf16 training step channels last matches NCHW on the GPU", "[gpu][models]") {
  // Three copies of one model: NCHW bf16 (a), NHWC bf16 (b) and an NCHW f32 reference (c). In bf16 the
  // gradients of the first layers of a freshly initialised ResNet at batch 16 are far from the f32 ones for
  // either layout (rounding through 17 layers and train-mode batch norm of small batches), so the test
  // asserts that channels last is no less accurate than NCHW against the f32 reference, per parameter.
  models::ResNetConfig ca{models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false};
  models::ResNetConfig cb = ca;
  cb.layout = ConvLayout::nhwc;
  Generator g1(3), g2(3), g3(3);
  auto a = std::make_shared<models::ResNet>(ca, g1);
  auto b = std::make_shared<models::ResNet>(cb, g2);
  auto c = std::make_shared<models::ResNet>(ca, g3);
  b->load_state_dict(a->state_dict());
  c->load_state_dict(a->state_dict());
  a->to(test::kCuda);
  b->to(test::kCuda);
  c->to(test::kCuda);
  auto oa = optim::make_sgd(optim::make_param_refs(a->named_parameters()), {.momentum = 0.9});
  auto ob = optim::make_sgd(optim::make_param_refs(b->named_parameters()), {.momentum = 0.9});
  const Tensor x32 = test::random_input({16, 3, 32, 32}, 77, DType::f32, -2, 2).to(test::kCuda);
  const Tensor x = x32.to(DType::bf16);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 16; ++i) labels.push_back(i % 10);
  const Tensor y = from_vector(labels, {16}, {DType::i64, test::kCuda});
  // The f32 gradients at a model's current weights (c takes the weights; each model is compared with the
  // reference at its own weights, since after the first step a and b have taken different steps).
  auto reference = [&](models::ResNet& m) {
    c->load_state_dict(m.state_dict());
    for (auto& [name, p] : c->named_parameters()) p->zero_grad();
    cross_entropy(c->forward(x32), y).backward();
    std::vector<Tensor> g;
    for (auto& [name, p] : c->named_parameters()) g.push_back(p->grad().clone());
    return g;
  };
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const std::vector<Tensor> ref_a = reference(*a), ref_b = reference(*b);
    const Tensor la = cross_entropy(a->forward(x), y), lb = cross_entropy(b->forward(x), y);
    oa->zero_grad();
    ob->zero_grad();
    la.backward();
    lb.backward();
    const double va = la.item(), vb = lb.item();
    CHECK(std::isfinite(vb));
    CHECK(std::abs(va - vb) <= 2e-2 * std::abs(va) + 1e-3);
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    int compared = 0;
    for (std::size_t i = 0; i < pa.size(); ++i) {
      if (pa[i].first.find("weight") == std::string::npos) continue;
      INFO(pa[i].first);
      REQUIRE(pb[i].first == pa[i].first);
      REQUIRE(pb[i].second->grad().defined());
      const double ea = test::rel_error(pa[i].second->grad(), ref_a[i]);
      const double eb = test::rel_error(pb[i].second->grad(), ref_b[i]);
      INFO("NCHW bf16 error " << ea << ", NHWC bf16 error " << eb);
      CHECK(eb <= 1.5 * ea + 0.02);
      ++compared;
    }
    CHECK(compared > 20);
    oa->step(0.05);
    ob->step(0.05);
  }
}
