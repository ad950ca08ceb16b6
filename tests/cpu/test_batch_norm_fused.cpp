// Fused batch norm + ReLU (BatchNormOptions::activation = relu) against the composition batch_norm -> relu:
// outputs, gradients and running stats are identical (f64, f32, bf16; train and eval; NCHW and (M, C)); the
// fused op passes gradcheck in f64; BatchNorm2d's activation option in both layouts; a ResNet-18 built with
// ResNetFusion::bn_relu gives the logits and every parameter gradient of one built with ResNetFusion::none.
#include <map>
#include <string>

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
  Tensor y, gx, gw, gb, rm, rv;
};

// batch_norm of a fresh leaf copy of x with weight / bias leaves and fresh copies of the running stats, then
// backward with g; act relu: the op's fused relu, none: a separate relu op (the reference composition).
BnRun run_bn(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm0, const Tensor& rv0,
             BatchNormMode mode, BatchNormActivation act, const Tensor& g) {
  BnRun r;
  Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
  Tensor bl = b.clone().set_requires_grad(true);
  r.rm = rm0.clone();
  r.rv = rv0.clone();
  BatchNormOptions o{mode, 0.1, 1e-5};
  o.activation = act;
  r.y = batch_norm(xl, wl, bl, r.rm, r.rv, o);
  if (act == BatchNormActivation::none) r.y = relu(r.y);
  r.y.backward(g);
  r.gx = xl.grad();
  r.gw = wl.grad();
  r.gb = bl.grad();
  return r;
}

void check_fused_equals_composition(const Shape& shape, DType dt, BatchNormMode mode, uint64_t seed) {
  const int64_t C = shape[1];
  // Shifted inputs and biases of both signs: a good share of the outputs is zero and the mask matters.
  const Tensor x = test::random_tensor(shape, seed, dt, -2.0, 3.0);
  const Tensor w = test::random_tensor({C}, seed + 1, DType::f32, 0.5, 1.5);
  const Tensor b = test::random_tensor({C}, seed + 2, DType::f32, -0.5, 0.5);
  const Tensor rm = test::random_tensor({C}, seed + 3, DType::f32);
  const Tensor rv = test::random_tensor({C}, seed + 4, DType::f32, 0.5, 2.0);
  const Tensor g = test::random_tensor(shape, seed + 5, dt);
  const BnRun f = run_bn(x, w, b, rm, rv, mode, BatchNormActivation::relu, g);
  const BnRun c = run_bn(x, w, b, rm, rv, mode, BatchNormActivation::none, g);
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

TEST_CASE("batch_norm with a fused relu equals batch_norm then relu exactly", "[batch_norm][fused]") {
  for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
      INFO(dtype_name(dt) << (mode == BatchNormMode::train ? " train" : " eval"));
      check_fused_equals_composition({3, 4, 5, 7}, dt, mode, 201);  // NCHW
      check_fused_equals_composition({37, 6}, dt, mode, 211);       // (M, C): channels last viewed as rows
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
      b.zero_grad();
      const Tensor ya = relu(a.forward(xa)), yb = b.forward(xb);
      CHECK(test::compare(yb, ya, 0, 0) == "");
      ya.backward(g);
      yb.backward(g);
      CHECK(test::compare(xb.grad(), xa.grad(), 0, 0) == "");
      CHECK(test::compare(b.weight.grad(), a.weight.grad(), 0, 0) == "");
      CHECK(test::compare(b.bias.grad(), a.bias.grad(), 0, 0) == "");
      CHECK(test::compare(b.running_var, a.running_var, 0, 0) == "");
    }
  }
}

TEST_CASE("a ResNet-18 with fused bn+relu gives the unfused model's logits and gradients", "[batch_norm][fused][models]") {
  for (const ConvLayout layout : {ConvLayout::nchw, ConvLayout::nhwc}) {
    INFO((layout == ConvLayout::nchw ? "nchw" : "nhwc"));
    models::ResNetConfig ca{models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false};
    ca.layout = layout;
    ca.fusion = models::ResNetFusion::none;
    models::ResNetConfig cb = ca;
    cb.fusion = models::ResNetFusion::bn_relu;
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
