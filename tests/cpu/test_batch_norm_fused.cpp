// Fused batch norm + ReLU (BatchNormOptions::activation = relu) and batch_norm_add_relu against the
// compositions batch_norm -> relu and relu(batch_norm + residual): outputs, gradients (the residual's too) and
// running stats are identical (f64, f32, bf16; train and eval; NCHW and (M, C)); the fused ops pass gradcheck
// in f64; BatchNorm2d's activation option and forward_add_relu in both layouts; ResNet-18s built with
// ResNetFusion::bn_relu and bn_add_relu give the logits and every parameter gradient of one built with
// ResNetFusion::none.
#include <map>
#include <string>
#include <tuple>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;

namespace {

struct BnRun {
  Tensor y, gx, gw, gb, gr, rm, rv;
};

// batch_norm of a fresh leaf copy of x with weight / bias leaves and fresh copies of the running stats, then
// backward with g; act relu: the op's fused relu, none: a separate relu op (the reference composition).
// res (undefined: none) is added before the relu: batch_norm_add_relu when fused.
BnRun run_bn(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm0, const Tensor& rv0,
             BatchNormMode mode, BatchNormActivation act, const Tensor& g, const Tensor& res = Tensor()) {
  BnRun r;
  Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
  Tensor bl = b.clone().set_requires_grad(true);
  Tensor rl = res.defined() ? res.clone().set_requires_grad(true) : Tensor();
  r.rm = rm0.clone();
  r.rv = rv0.clone();
  BatchNormOptions o{mode, 0.1, 1e-5};
  o.activation = act;
  if (act == BatchNormActivation::none) {
    r.y = batch_norm(xl, wl, bl, r.rm, r.rv, o);
    r.y = relu(rl.defined() ? add(r.y, rl) : r.y);
  } else {
    r.y = rl.defined() ? batch_norm_add_relu(xl, rl, {wl, bl, r.rm, r.rv}, o) : batch_norm(xl, wl, bl, r.rm, r.rv, o);
  }
  r.y.backward(g);
  r.gx = xl.grad();
  r.gw = wl.grad();
  r.gb = bl.grad();
  if (rl.defined()) r.gr = rl.grad();
  return r;
}

void check_fused_equals_composition(const Shape& shape, DType dt, BatchNormMode mode, uint64_t seed,
                                    bool with_residual) {
  const int64_t C = shape[1];
  // Shifted inputs and biases of both signs: a good share of the outputs is zero and the mask matters.
  const Tensor x = test::random_tensor(shape, seed, dt, -2.0, 3.0);
  const Tensor w = test::random_tensor({C}, seed + 1, DType::f32, 0.5, 1.5);
  const Tensor b = test::random_tensor({C}, seed + 2, DType::f32, -0.5, 0.5);
  const Tensor rm = test::random_tensor({C}, seed + 3, DType::f32);
  const Tensor rv = test::random_tensor({C}, seed + 4, DType::f32, 0.5, 2.0);
  const Tensor g = test::random_tensor(shape, seed + 5, dt);
  const Tensor res = with_residual ? test::random_tensor(shape, seed + 6, dt, -1.0, 1.0) : Tensor();
  const BnRun f = run_bn(x, w, b, rm, rv, mode, BatchNormActivation::relu, g, res);
  const BnRun c = run_bn(x, w, b, rm, rv, mode, BatchNormActivation::none, g, res);
  if (with_residual) {
    REQUIRE(f.gr.defined());
    CHECK(f.gr.dtype() == dt);
    CHECK(test::compare(f.gr, c.gr, 0, 0) == "");
  }
  CHECK(f.y.dtype() == dt);
  const double zeros_frac =
      sum(eq(f.y.to(DType::f64), 0.0).to(DType::f64)).item() / static_cast<double>(f.y.numel());
  CHECK(zeros_frac > 0.1);
  CHECK(zeros_frac < 0.9);
  CHECK(test::compare(f.y, c.y, 0, 0) == "");
  CHECK(test::compare(f.gx, c.gx, 0, 0) == "");
  CHECK(test::compare(f.gw, c.gw, 0, 0) == "");
  CHECK(test::compare(f.gb, c.gb, 0, 0) == "");
  CHECK(test::compare(f.rm, c.rm, 0, 0) == "");
  CHECK(test::compare(f.rv, c.rv, 0, 0) == "");
}

}  // namespace

TEST_CASE("batch_norm with a fused relu (and residual) equals the composition exactly", "[batch_norm][fused]") {
  for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
      for (const bool res : {false, true}) {
        INFO(dtype_name(dt) << (mode == BatchNormMode::train ? " train" : " eval") << (res ? " + residual" : ""));
        check_fused_equals_composition({3, 4, 5, 7}, dt, mode, 201, res);  // NCHW
        check_fused_equals_composition({37, 6}, dt, mode, 211, res);       // (M, C): channels last viewed as rows
      }
    }
  }
}

TEST_CASE("batch_norm with a fused relu passes the finite-difference check", "[batch_norm][fused][gradcheck]") {
  Tensor x4 = test::random_tensor({3, 2, 3, 5}, 221).set_requires_grad(true);
  Tensor x2 = test::random_tensor({7, 3}, 222).set_requires_grad(true);
  Tensor w2 = test::random_tensor({2}, 223, DType::f64, 0.5, 1.5).set_requires_grad(true);
  Tensor b2 = test::random_tensor({2}, 224, DType::f64, -0.3, 0.3).set_requires_grad(true);
  Tensor w3 = test::random_tensor({3}, 225, DType::f64, 0.5, 1.5).set_requires_grad(true);
  Tensor b3 = test::random_tensor({3}, 226, DType::f64, -0.3, 0.3).set_requires_grad(true);
  Tensor rm2 = test::random_tensor({2}, 227, DType::f64), rv2 = test::random_tensor({2}, 228, DType::f64, 0.5, 2.0);
  BatchNormOptions train{BatchNormMode::train, 0.1, 1e-5}, eval{BatchNormMode::eval, 0.1, 1e-5};
  train.activation = eval.activation = BatchNormActivation::relu;
  auto check = [](test::GradcheckFn f, const std::vector<Tensor>& in) { CHECK(test::gradcheck(f, in) == ""); };
  Tensor rm = zeros({2}), rv = ones({2}), rm3 = zeros({3}), rv3 = ones({3});
  check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm, rv, train); }, {x4, w2, b2});
  check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm3, rv3, train); }, {x2, w3, b3});
  check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, {}, {}, train); }, {x2});
  check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm2, rv2, eval); }, {x4, w2, b2});
  // through a non-contiguous view
  Tensor nhwc = test::random_tensor({2, 3, 4, 2}, 229).set_requires_grad(true);
  check([&](const std::vector<Tensor>& in) {
          return batch_norm(in[0].permute({0, 3, 1, 2}), in[1], in[2], {}, {}, train);
        },
        {nhwc, w2, b2});
  // with a residual (also through a transposed view)
  Tensor r4 = test::random_tensor({3, 2, 3, 5}, 230).set_requires_grad(true);
  Tensor r2t = test::random_tensor({3, 7}, 231).set_requires_grad(true);
  check([&](const std::vector<Tensor>& in) { return batch_norm_add_relu(in[0], in[1], {in[2], in[3], rm, rv}, train); },
        {x4, r4, w2, b2});
  check([&](const std::vector<Tensor>& in) {
          return batch_norm_add_relu(in[0], in[1], {in[2], in[3], rm2, rv2}, eval);
        },
        {x4, r4, w2, b2});
  check([&](const std::vector<Tensor>& in) {
          return batch_norm_add_relu(in[0], in[1].transpose(0, 1), {in[2], in[3], rm3, rv3}, train);
        },
        {x2, r2t, w3, b3});
}

TEST_CASE("batch_norm_add_relu rejects a residual of another shape or dtype", "[batch_norm][fused][errors]") {
  const Tensor x = test::random_tensor({4, 3}, 241);
  CHECK_THROWS_WITH(batch_norm_add_relu(x, test::random_tensor({4, 2}, 242), {}), HasSubstr("x's shape and dtype"));
  CHECK_THROWS_WITH(batch_norm_add_relu(x, test::random_tensor({4, 3}, 243, DType::f32), {}),
                    HasSubstr("x's shape and dtype"));
}

TEST_CASE("BatchNorm2d with activation relu equals BatchNorm2d then relu, both layouts", "[batch_norm][fused]") {
  for (const ConvLayout layout : {ConvLayout::nchw, ConvLayout::nhwc}) {
    INFO((layout == ConvLayout::nchw ? "nchw" : "nhwc"));
    nn::BatchNorm2d a(5), b(5);
    a.layout = b.layout = layout;
    b.activation = BatchNormActivation::relu;
    {
      NoGradGuard no_grad;
      copy_(a.weight, test::random_tensor({5}, 231, DType::f32, 0.5, 1.5));
      copy_(a.bias, test::random_tensor({5}, 232, DType::f32, -0.5, 0.5));
      b.load_state_dict(a.state_dict());
    }
    CHECK(b.state_dict().size() == a.state_dict().size());
    const Shape shape = layout == ConvLayout::nchw ? Shape{2, 5, 3, 4} : Shape{2, 3, 4, 5};
    const Tensor g = test::random_tensor(shape, 234, DType::f32);
    for (int step = 0; step < 2; ++step) {  // train, then eval
      if (step == 1) {
        a.eval();
        b.eval();
      }
      Tensor xa = test::random_tensor(shape, 233 + step, DType::f32, -1.0, 2.0).set_requires_grad(true);
      Tensor xb = xa.detach().clone().set_requires_grad(true);
      a.zero_grad();
      b.zero_grad();  // gradients accumulate over the two forwards of this step on both sides
      const Tensor ya = relu(a.forward(xa)), yb = b.forward(xb);
      CHECK(test::compare(yb, ya, 0, 0) == "");
      ya.backward(g);
      yb.backward(g);
      CHECK(test::compare(xb.grad(), xa.grad(), 0, 0) == "");
      // forward_add_relu against relu(bn + residual)
      Tensor ra = test::random_tensor(shape, 240 + step, DType::f32).set_requires_grad(true);
      Tensor rb = ra.detach().clone().set_requires_grad(true);
      const Tensor za = relu(add(a.forward(xa), ra)), zb = b.forward_add_relu(xb, rb);
      CHECK(test::compare(zb, za, 0, 0) == "");
      za.backward(g);
      zb.backward(g);
      CHECK(test::compare(rb.grad(), ra.grad(), 0, 0) == "");
      CHECK(test::compare(xb.grad(), xa.grad(), 0, 0) == "");
      CHECK(test::compare(b.weight.grad(), a.weight.grad(), 0, 0) == "");
      CHECK(test::compare(b.bias.grad(), a.bias.grad(), 0, 0) == "");
      CHECK(test::compare(b.running_var, a.running_var, 0, 0) == "");
    }
  }
}

TEST_CASE("ResNets with fused bn+relu and bn+add+relu give the unfused model's logits and gradients",
          "[batch_norm][fused][models]") {
  for (const auto& [layout, fusion, depth] :
       {std::tuple{ConvLayout::nchw, models::ResNetFusion::bn_relu, models::ResNetDepth::r18},
        std::tuple{ConvLayout::nhwc, models::ResNetFusion::bn_relu, models::ResNetDepth::r18},
        std::tuple{ConvLayout::nchw, models::ResNetFusion::bn_add_relu, models::ResNetDepth::r18},
        std::tuple{ConvLayout::nhwc, models::ResNetFusion::bn_add_relu, models::ResNetDepth::r18},
        std::tuple{ConvLayout::nhwc, models::ResNetFusion::bn_add_relu, models::ResNetDepth::r50}}) {
    INFO((layout == ConvLayout::nchw ? "nchw" : "nhwc")
         << (fusion == models::ResNetFusion::bn_relu ? " bn_relu" : " bn_add_relu")
         << (depth == models::ResNetDepth::r50 ? " resnet50" : " resnet18"));
    models::ResNetConfig ca{depth, models::ResNetStem::cifar, 10, 3, false};
    ca.layout = layout;
    ca.fusion = models::ResNetFusion::none;
    models::ResNetConfig cb = ca;
    cb.fusion = fusion;
    Generator g1(41), g2(41);
    models::ResNet a(ca, g1), b(cb, g2);  // same seed: same parameters
    a.to(DType::f64);
    b.to(DType::f64);
    REQUIRE(a.state_dict().size() == b.state_dict().size());
    const Tensor x = test::random_tensor({2, 3, 8, 8}, 42);
    const Tensor target = from_vector(std::vector<int64_t>{3, 7}, {2}, {DType::i64});
    const Tensor la = a.forward(x), lb = b.forward(x);
    CHECK(test::compare(lb, la, 0, 0) == "");
    cross_entropy(la, target).backward();
    cross_entropy(lb, target).backward();
    std::map<std::string, Tensor> grads_b;
    for (const auto& [n, p] : b.named_parameters()) grads_b[n] = p->grad();
    for (const auto& [n, p] : a.named_parameters()) {
      INFO(n);
      REQUIRE(grads_b[n].defined());
      CHECK(test::compare(grads_b[n], p->grad(), 0, 0) == "");
    }
    CHECK(test::compare(b.state_dict()["layer2.0.bn1.running_mean"], a.state_dict()["layer2.0.bn1.running_mean"], 0,
                        0) == "");
    a.eval();
    b.eval();
    CHECK(test::compare(b.forward(x), a.forward(x), 0, 0) == "");
  }
}
