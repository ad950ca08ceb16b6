// Channels-last (NHWC) convolution, batch norm and ResNet against their NCHW versions on the CPU: conv2d
// with ConvLayout::nhwc equals the permuted NCHW result exactly in f64 (stride, padding, groups, 1x1,
// dilation, bias) and passes gradcheck; BatchNorm2d channels last equals NCHW batch norm (train and eval,
// running stats, gradients); a channels-last ResNet-18 gives the NCHW model's logits and parameter gradients,
// also after loading the NCHW model's state dict; pipeline-routed convs work channels last; the
// model.channels_last config key is validated.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/autograd/node.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/image_classification.h"
#include "hadatrain/train/trainer_config.h"
#include "src/train/trainer_setup.h"

using namespace ht;

namespace {

Tensor to_nhwc(const Tensor& t) { return contiguous(permute(t, {0, 2, 3, 1})); }  // (N, C, H, W) -> (N, H, W, C)
Tensor to_nchw(const Tensor& t) { return contiguous(permute(t, {0, 3, 1, 2})); }

struct ConvCase {
  const char* name;
  int64_t N, C, H, W, O, K;
  Conv2dParams p;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3 stride 2 pad 1", 2, 3, 7, 6, 5, 3, {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}, true},
      {"groups 2, pad (1, 0)", 2, 4, 5, 6, 6, 3, {.pad_h = 1, .groups = 2}, true},
      {"1x1", 3, 5, 4, 3, 7, 1, {}, false},
      {"dilation 2, stride (1, 2)", 1, 3, 8, 9, 4, 3,
       {.stride_w = 2, .pad_h = 2, .pad_w = 2, .dilation_h = 2, .dilation_w = 2}, true},
  };
}

}  // namespace

TEST_CASE("conv2d nhwc equals the permuted NCHW result exactly in f64", "[channels_last]") {
  uint64_t seed = 10;
  for (const ConvCase& c : conv_cases()) {
    INFO(c.name);
    const Tensor x = test::random_tensor({c.N, c.C, c.H, c.W}, seed++);
    const Tensor w = test::random_tensor({c.O, c.C / c.p.groups, c.K, c.K}, seed++);
    const Tensor b = c.bias ? test::random_tensor({c.O}, seed++) : Tensor();
    const Tensor ref = conv2d(x, w, b, c.p);  // (N, O, OH, OW)
    Conv2dParams q = c.p;
    q.layout = ConvLayout::nhwc;
    const Tensor y = conv2d(to_nhwc(x), w, b, q);  // (N, OH, OW, O)
    REQUIRE(y.shape() == Shape{ref.size(0), ref.size(2), ref.size(3), ref.size(1)});
    CHECK(y.is_contiguous());
    CHECK(test::compare(y, to_nhwc(ref), 0.0, 0.0) == "");
    // A non-contiguous channels-last view (a permuted NCHW tensor) gives the same result.
    CHECK(test::compare(conv2d(permute(x, {0, 2, 3, 1}), w, b, q), to_nhwc(ref), 0.0, 0.0) == "");
    // f32 within rounding of f64.
    const Tensor y32 = conv2d(to_nhwc(x).to(DType::f32), w.to(DType::f32),
                              c.bias ? b.to(DType::f32) : Tensor(), q);
    CHECK(y32.dtype() == DType::f32);
    CHECK(test::rel_error(y32, y) < 1e-6);
  }
}

TEST_CASE("conv2d nhwc passes gradcheck through x, weight and bias", "[channels_last]") {
  uint64_t seed = 30;
  for (const ConvCase& c : conv_cases()) {
    INFO(c.name);
    Conv2dParams q = c.p;
    q.layout = ConvLayout::nhwc;
    Tensor x = test::random_tensor({c.N, c.H, c.W, c.C}, seed++);
    Tensor w = test::random_tensor({c.O, c.C / c.p.groups, c.K, c.K}, seed++);
    Tensor b = test::random_tensor({c.O}, seed++);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], q); },
                          {x, w, b}) == "");
    // Through a non-contiguous channels-last view of an NCHW leaf.
    Tensor xn = test::random_tensor({c.N, c.C, c.H, c.W}, seed++);
    xn.set_requires_grad(true);
    CHECK(test::gradcheck(
              [&](const std::vector<Tensor>& in) { return conv2d(permute(in[0], {0, 2, 3, 1}), in[1], Tensor(), q); },
              {xn, w}) == "");
  }
}

TEST_CASE("to_dtype_in_order casts into channels-last memory and its gradient comes back contiguous",
          "[channels_last]") {
  Tensor w = test::random_tensor({4, 3, 2, 5}, 31, DType::f32, -2, 2);
  w.set_requires_grad(true);
  const Tensor c = to_dtype_in_order(w, DType::f64, {0, 2, 3, 1});
  CHECK(c.shape() == w.shape());
  CHECK(c.dtype() == DType::f64);
  CHECK(c.strides() == Strides{30, 1, 15, 3});  // (O, KH, KW, C) memory
  CHECK(permute(c, {0, 2, 3, 1}).is_contiguous());
  CHECK(test::close(c, w.to(DType::f64), 0, 0));
  // The gradient reaches the f32 master contiguous, whatever the layout it arrives in.
  const Tensor g = test::random_tensor({4, 3, 2, 5}, 32, DType::f64, -1, 1);
  sum(mul(c, g)).backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::f32);
  CHECK(w.grad().is_contiguous());
  CHECK(test::close(w.grad(), g.to(DType::f32), 0, 0));
  CHECK_THROWS_WITH(to_dtype_in_order(w, DType::f64, {0, 2, 2, 1}), HasSubstr("not a permutation"));
  CHECK_THROWS_WITH(to_dtype_in_order(w, DType::f64, {0, 2, 1}), HasSubstr("order has 3 dims"));
  // A cast with the channels_last hint lays out 4-d weights only; the master itself when no cast is needed.
  CHECK(nn::cast_master(w.detach(), DType::f64, nn::WeightLayout::channels_last).strides() == Strides{30, 1, 15, 3});
  CHECK(nn::cast_master(w.detach(), DType::f32, nn::WeightLayout::channels_last).strides() == w.strides());
}

TEST_CASE("conv2d nhwc checks the channel dim at the end", "[channels_last]") {
  Conv2dParams q;
  q.layout = ConvLayout::nhwc;
  const Tensor w = test::random_tensor({4, 3, 3, 3}, 1);
  // (N, C, H, W) passed where (N, H, W, C) is expected: C is read from the last dim (8 != 3).
  CHECK_THROWS_WITH(conv2d(test::random_tensor({2, 3, 8, 8}, 2), w, Tensor(), q),
                    HasSubstr("has 3 input channels per group"));
  CHECK_THROWS_WITH(conv2d(test::random_tensor({2, 8, 8}, 3), w, Tensor(), q), HasSubstr("(N, H, W, C)"));
}

TEST_CASE("BatchNorm2d channels last equals NCHW batch norm in train and eval mode", "[channels_last]") {
  const int64_t N = 3, C = 5, H = 4, W = 3;
  nn::BatchNorm2d a(C), b(C);
  b.layout = ConvLayout::nhwc;
  for (nn::BatchNorm2d* m : {&a, &b}) {
    m->to(DType::f64);
    NoGradGuard no_grad;
    copy_(m->weight, test::random_tensor({C}, 4));
    copy_(m->bias, test::random_tensor({C}, 5));
  }
  for (int step = 0; step < 2; ++step) {
    INFO("train step " << step);
    const Tensor x = test::random_tensor({N, C, H, W}, 6 + step, DType::f64, -2.0, 3.0);
    const Tensor g = test::random_tensor({N, C, H, W}, 8 + step);
    Tensor xa = x.clone(), xb = to_nhwc(x);
    xa.set_requires_grad(true);
    xb.set_requires_grad(true);
    a.zero_grad();
    b.zero_grad();
    const Tensor ya = a.forward(xa), yb = b.forward(xb);
    REQUIRE(yb.shape() == Shape{N, H, W, C});
    CHECK(test::compare(yb, to_nhwc(ya), 1e-12, 1e-12) == "");
    sum(mul(ya, g)).backward();
    sum(mul(yb, to_nhwc(g))).backward();
    CHECK(test::compare(xb.grad(), to_nhwc(xa.grad()), 1e-10, 1e-12) == "");
    CHECK(test::compare(b.weight.grad(), a.weight.grad(), 1e-10, 1e-12) == "");
    CHECK(test::compare(b.bias.grad(), a.bias.grad(), 1e-10, 1e-12) == "");
    CHECK(test::compare(b.running_mean, a.running_mean, 1e-12, 1e-12) == "");
    CHECK(test::compare(b.running_var, a.running_var, 1e-12, 1e-12) == "");
    CHECK(b.num_batches_tracked.item() == step + 1);
  }
  // The running stats moved away from their initial (0, 1), so eval mode tests them.
  CHECK(std::abs(a.running_mean.to_vector<double>()[0]) > 1e-3);
  a.eval();
  b.eval();
  const Tensor x = test::random_tensor({N, C, H, W}, 12);
  CHECK(test::compare(b.forward(to_nhwc(x)), to_nhwc(a.forward(x)), 1e-12, 1e-12) == "");
  CHECK_THROWS_WITH(b.forward(x), HasSubstr("layout nhwc"));  // NCHW input: last dim 3 != C = 5
}

TEST_CASE("a channels-last ResNet-18 gives the NCHW model's logits and gradients", "[channels_last]") {
  for (const models::ResNetStem stem : {models::ResNetStem::cifar, models::ResNetStem::imagenet}) {
    INFO((stem == models::ResNetStem::cifar ? "cifar stem" : "imagenet stem"));
    models::ResNetConfig ca{models::ResNetDepth::r18, stem, 10, 3, false};
    models::ResNetConfig cb = ca;
    cb.layout = ConvLayout::nhwc;
    Generator g1(21), g2(21);
    models::ResNet a(ca, g1), b(cb, g2);  // same seed: same initial parameters
    a.to(DType::f64);
    b.to(DType::f64);
    // Same names and shapes; and loading the NCHW state dict into the NHWC model changes nothing.
    const auto sa = a.state_dict(), sb = b.state_dict();
    REQUIRE(sa.size() == sb.size());
    for (const auto& [n, t] : sa) {
      INFO(n);
      REQUIRE(sb.count(n) == 1);
      CHECK(sb.at(n).shape() == t.shape());
    }
    b.load_state_dict(sa);
    const int64_t hw = stem == models::ResNetStem::cifar ? 16 : 32;
    const Tensor x = test::random_tensor({2, 3, hw, hw}, 22);
    const Tensor target = from_vector(std::vector<int64_t>{3, 7}, {2}, {DType::i64});
    const Tensor la = a.forward(x), lb = b.forward(x);  // both take NCHW input
    REQUIRE(lb.shape() == Shape{2, 10});
    CHECK(test::compare(lb, la, 1e-10, 1e-12) == "");
    cross_entropy(la, target).backward();
    cross_entropy(lb, target).backward();
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    std::map<std::string, Tensor> grads_b;
    for (const auto& [n, p] : pb) grads_b[n] = p->grad();
    for (const auto& [n, p] : pa) {
      INFO(n);
      REQUIRE(grads_b[n].defined());
      CHECK(test::compare(grads_b[n], p->grad(), 1e-8, 1e-11) == "");
    }
    // Running stats agree after the training step; eval logits agree.
    CHECK(test::compare(b.state_dict()["layer4.1.bn2.running_var"], a.state_dict()["layer4.1.bn2.running_var"],
                        1e-10, 1e-12) == "");
    a.eval();
    b.eval();
    CHECK(test::compare(b.forward(x), a.forward(x), 1e-10, 1e-12) == "");
  }
  // f32: a checkpoint of an NCHW model loads into an NHWC one and gives the same logits within f32 rounding.
  Generator g3(31), g4(32);
  models::ResNet a({models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false}, g3);
  models::ResNetConfig cb{models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false};
  cb.layout = ConvLayout::nhwc;
  models::ResNet b(cb, g4);  // different seed: the weights come only from the state dict
  b.load_state_dict(a.state_dict());
  a.eval();
  b.eval();
  const Tensor x = test::random_tensor({2, 3, 16, 16}, 33, DType::f32);
  CHECK(test::rel_error(b.forward(x), a.forward(x)) < 1e-5);
}

// A 3x3 stride-2 window (folded) and a 1x1 stride-1 one (the columns are the channels-last image gradient itself).
TEST_CASE("pipeline-routed convs give the NCHW results in channels-last layout", "[channels_last]") {
  for (const auto& [name, k] : std::vector<std::pair<std::string, int64_t>>{
           {"hlq", 3}, {"hlq", 1}, {"lbp_wht", 3}, {"lbp_wht", 1}, {"luq", 3}, {"luq", 1}}) {
    INFO(name << " kernel " << k);
    nn::Conv2dOptions o;
    o.in_channels = 4;
    o.out_channels = 8;
    o.kernel = k;
    o.stride = k == 3 ? 2 : 1;
    o.padding = k == 3 ? 1 : 0;
    const int64_t out = k == 3 ? 8 : 16;
    Generator g1(40), g2(40);
    auto a = std::make_shared<nn::Conv2d>(o, g1);
    o.layout = ConvLayout::nhwc;
    auto b = std::make_shared<nn::Conv2d>(o, g2);
    grad::PipelineConfig cfg;
    cfg.default_spec.name = name;
    REQUIRE(nn::bind_pipelines(*a, cfg, std::make_shared<grad::StepClock>()).size() == 1);
    REQUIRE(nn::bind_pipelines(*b, cfg, std::make_shared<grad::StepClock>()).size() == 1);
    REQUIRE(b->grad_pipeline.active());
    const Tensor x = test::random_tensor({2, 4, 16, 16}, 41, DType::f32);  // output 8x8 or 16x16
    const Tensor gy = test::random_tensor({2, 8, out, out}, 42, DType::f32);
    Tensor xa = x.clone(), xb = to_nhwc(x);
    xa.set_requires_grad(true);
    xb.set_requires_grad(true);
    const Tensor ya = a->forward(xa), yb = b->forward(xb);
    REQUIRE(yb.shape() == Shape{2, out, out, 8});
    CHECK(test::rel_error(yb, to_nhwc(ya)) < 1e-6);
    sum(mul(ya, gy)).backward();
    sum(mul(yb, to_nhwc(gy))).backward();
    // Same columns, same noise key (seed, layer, step): the same (lossy) gradients.
    CHECK(test::rel_error(xb.grad(), to_nhwc(xa.grad())) < 1e-5);
    CHECK(test::rel_error(b->weight.grad(), a->weight.grad()) < 1e-5);
    CHECK(test::rel_error(b->bias.grad(), a->bias.grad()) < 1e-6);
    CHECK(b->grad_pipeline.saved_bytes == a->grad_pipeline.saved_bytes);
  }
}

// grad::conv_product's node returns a channels-last image's gradient channels-last (Fold2dParams::channels_last; for
// a 1x1 stride-1 window the columns themselves), with the values of the NCHW image's: no transpose between the
// product and the op before it. An NCHW image keeps a contiguous gradient.
TEST_CASE("a conv product's image gradient has the image's layout", "[channels_last]") {
  for (const int64_t k : {3, 1}) {
    INFO("kernel " << k);
    Unfold2dParams u;
    u.kernel_h = u.kernel_w = k;
    u.pad_h = u.pad_w = k / 2;
    const Tensor x = test::random_tensor({2, 6, 9, 7}, 50, DType::f32);
    const Tensor w = test::random_tensor({5, 6 * k * k}, 51, DType::f32);
    const Tensor gy = test::random_tensor({2, 9 * 7, 5}, 52, DType::f32);
    Tensor grads[2];
    for (int cl = 0; cl < 2; ++cl) {
      Tensor image = cl ? permute(to_nhwc(x), {0, 3, 1, 2}) : x.clone();
      image.set_requires_grad(true);
      const grad::ProductCall call{grad::make_hlq_pipeline(grad::HlqOptions{}), {}, {}};
      const Tensor y = grad::conv_product(image, w, u, call);  // (N, L, O)
      REQUIRE(y.grad_fn() != nullptr);
      grads[cl] = y.grad_fn()->apply({gy})[0];
      CHECK(is_channels_last(grads[cl]) == (cl == 1));
      CHECK((cl == 1 || grads[cl].is_contiguous()));
    }
    CHECK(test::compare(grads[1], grads[0], 0, 0) == "");
  }
}

TEST_CASE("model.channels_last accepts auto, true and false and rejects anything else", "[channels_last][config]") {
  const test::TempDir dir("channels_last");
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string p = (dir.path / name).string();
    std::ofstream(p) << text;
    return p;
  };
  CHECK(train::load_trainer_config(write("a.yaml", "model:\n  name: resnet18\n")).model.channels_last == "auto");
  CHECK(train::load_trainer_config(write("b.yaml", "model:\n  name: resnet18\n  channels_last: true\n"))
            .model.channels_last == "true");
  CHECK(train::load_trainer_config(write("c.yaml", "model:\n  name: resnet18\n"), {"model.channels_last=false"})
            .model.channels_last == "false");
  const std::string bad = write("d.yaml", "model:\n  name: resnet18\n  channels_last: sometimes\n");
  CHECK_THROWS_WITH(train::load_trainer_config(bad),
                    HasSubstr("model.channels_last: expected one of auto, true, false, got sometimes"));
}

namespace {

// Records the strides of the image it is given; logits (B, 3) = per-sample channel sums of x · w (differentiable).
class StrideProbe final : public nn::Module {
 public:
  std::string type_name() const override { return "StrideProbe"; }
  Tensor forward(const Tensor& x) override {
    seen = x.strides();
    seen_dtype = x.dtype();
    return sum(mul(x, 0.5), {2, 3});  // (B, C): C = 3 classes
  }
  Strides seen;
  DType seen_dtype = DType::f32;
};

}  // namespace

TEST_CASE("the image task casts the image into channels-last memory for a channels-last model", "[channels_last]") {
  data::Batch batch;
  batch.set(data::batch_key::image, test::random_tensor({2, 3, 4, 5}, 61, DType::f32));
  batch.set(data::batch_key::label, from_vector(std::vector<int64_t>{2, 0}, {2}, {DType::i64}));
  StrideProbe probe;
  const double plain = train::ImageClassification({.compute_dtype = DType::f64}).loss(probe, batch).item();
  CHECK(probe.seen == Strides{60, 20, 5, 1});
  const double cl =
      train::ImageClassification({.compute_dtype = DType::f64, .channels_last = true}).loss(probe, batch).item();
  CHECK(probe.seen == Strides{60, 1, 15, 3});  // (B, H, W, C) memory
  CHECK(probe.seen_dtype == DType::f64);
  CHECK(cl == plain);
  // The trainer asks for it for ResNets laid out channels last only.
  train::TrainerConfig cfg;
  cfg.model.name = train::ModelKind::resnet18;
  cfg.model.channels_last = "true";
  CHECK(train::resnet_channels_last(cfg));
  cfg.model.channels_last = "auto";  // the CPU
  CHECK_FALSE(train::resnet_channels_last(cfg));
  cfg.model.name = train::ModelKind::vit;
  cfg.model.channels_last = "true";
  CHECK_FALSE(train::resnet_channels_last(cfg));
}

TEST_CASE("model.fusion picks the ResNet's batch-norm fusion and rejects anything else", "[channels_last][config]") {
  const test::TempDir dir("fusion");
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string p = (dir.path / name).string();
    std::ofstream(p) << text;
    return p;
  };
  const std::string path = write("a.yaml", "model:\n  name: resnet18\n");
  train::Datasets ds;
  ds.num_classes = 10;
  ds.channels = 3;
  ds.height = ds.width = 16;
  const std::map<std::string, models::ResNetFusion> want{{"none", models::ResNetFusion::none},
                                                         {"bn_relu", models::ResNetFusion::bn_relu},
                                                         {"bn_add_relu", models::ResNetFusion::bn_add_relu}};
  CHECK(train::load_trainer_config(path).model.fusion == "bn_add_relu");
  for (const auto& [value, fusion] : want) {
    INFO(value);
    const train::TrainerConfig cfg = train::load_trainer_config(path, {"model.fusion=" + value});
    Generator gen(1);
    const auto model = train::make_model(cfg, ds, gen, std::make_shared<Generator>(0));
    const auto* resnet = dynamic_cast<const models::ResNet*>(model.get());
    REQUIRE(resnet != nullptr);
    CHECK(resnet->config.fusion == fusion);
  }
  CHECK_THROWS_WITH(train::load_trainer_config(path, {"model.fusion=all"}),
                    HasSubstr("model.fusion: expected one of none, bn_relu, bn_add_relu, got all"));
}
