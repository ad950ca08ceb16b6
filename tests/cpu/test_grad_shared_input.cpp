// Note [Shared saved inputs] (autograd/saved_tensor.h): tensors kept for backward are counted on their storage,
// and HLQ keeps a reference to an input another op already keeps (acbp_share) instead of a compressed copy,
// compressing it in backward with the same bits. The ViT case (the packed attention keeps proj's input) is CUDA
// only: tests/gpu/test_gpu_grad_pipelines.cpp. Note [Rebuilt inputs]: with acbp_rebuild, fc2 keeps nothing and
// rebuilds the gelu output from the gelu's kept input in backward, and qkv / fc1 the LayerNorm outputs (an MLP and
// a ViT on the CPU, a LayerNorm alone).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/autograd/node.h"
#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/pipeline_config.h"
#include "support/catch.h"
#include "support/model_testing.h"
#include "support/testing.h"

using namespace ht;

TEST_CASE("SavedTensor counts itself on its storage while it keeps it", "[autograd][grad]") {
  const Tensor t = test::random_tensor({4, 6}, 1, DType::f32);
  const Tensor view = reshape(t, {24});
  CHECK_FALSE(kept_for_backward(t));
  {
    SavedTensor a(t);
    CHECK(kept_for_backward(t));
    CHECK(kept_for_backward(view));  // the same storage
    CHECK_FALSE(kept_for_backward(t.clone()));
    SavedTensor b(view);
    SavedTensor c = std::move(a);  // moving does not count twice
    CHECK(t.storage()->graph_saves.load() == 2);
    const Tensor back = b.release();
    CHECK(t.storage()->graph_saves.load() == 1);
    CHECK(back.storage() == t.storage());
  }
  CHECK(t.storage()->graph_saves.load() == 0);
  CHECK_FALSE(kept_for_backward(view));

  // Node::save counts while the graph keeps the tensor; the backward releases it.
  Tensor x = test::random_tensor({3, 5}, 2, DType::f32);
  x.set_requires_grad(true);
  Tensor e = exp(x);  // keeps x for its backward
  CHECK(kept_for_backward(x));
  sum(e).backward();
  CHECK_FALSE(kept_for_backward(x));
  e = exp(x);
  CHECK(kept_for_backward(x));
  e = Tensor();  // the graph dies with its last output
  CHECK_FALSE(kept_for_backward(x));
}

namespace {

struct Case {
  std::string label;
  grad::PipelineSpec spec;
};

std::vector<Case> hlq_cases() {
  grad::PipelineSpec base;
  base.name = "hlq";
  std::vector<Case> c{{"defaults", base}};
  grad::PipelineSpec t = base;
  t.options_as<grad::HlqOptions>().acbp_bits = 4;
  t.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::sample;
  c.push_back({"acbp4 sample scales", t});
  t = base;
  t.options_as<grad::HlqOptions>().fallback = grad::HlaFallback::split_extra;
  c.push_back({"split_extra", t});
  t = base;
  t.options_as<grad::HlqOptions>().acbp_conv = grad::AcbpConv::input_map;
  c.push_back({"input_map", t});
  return c;
}

struct Run {
  Tensor y, gx, gw;
  int64_t bytes = -1;
};

struct Setup {
  bool share = true;           // acbp_share
  bool kept_elsewhere = true;  // exp(x) first, whose node keeps x for its own backward
  bool conv = false;           // conv_product of an image x instead of product
  DType dt = DType::f32;
};

// y = product(x, w) (or conv_product of the image x) under `spec` and `setup`. The loss reads y only.
Run run(const grad::PipelineSpec& spec, const Setup& setup) {
  const bool conv = setup.conv;
  const DType dt = setup.dt;
  grad::PipelineSpec s = spec;
  s.options_as<grad::HlqOptions>().acbp_share = setup.share;
  // A conv's g_w over the columns that the forward would have kept (the default): the same bits shared or copied.
  // (conv_gw wgrad_simulated reads a shared image itself, Note [HLQ conv g_w]: its g_w then differs from a copy's.)
  s.options_as<grad::HlqOptions>().conv_gw = grad::ConvGw::columns;
  Tensor x = conv ? test::random_tensor({2, 3, 8, 8}, 5, DType::f32).to(dt)
                  : test::random_tensor({2, 17, 12}, 5, DType::f32).to(dt);  // 17 tokens: split_extra leaves 16
  Tensor w = mul(test::random_tensor({16, conv ? 27 : 12}, 6, DType::f32), 0.3).to(dt);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Run r;
  const Tensor kept = setup.kept_elsewhere ? exp(x) : Tensor();
  const grad::ProductCall call{grad::make_pipeline(s), {}, grad::NoiseKey{3, 1, 4}, &r.bytes};
  Unfold2dParams u;
  u.kernel_h = u.kernel_w = 3;
  u.pad_h = u.pad_w = 1;
  r.y = conv ? grad::conv_product(x, w, u, call) : grad::product(x, w, call);
  const Tensor g = test::random_tensor(r.y.shape(), 7, DType::f32).to(dt);
  sum(mul(r.y, g)).backward();
  r.gx = x.grad();
  r.gw = w.grad();
  return r;
}

}  // namespace

TEST_CASE("hlq acbp_share: an input another op keeps is not copied, and the gradients keep their bits",
          "[grad]") {
  for (const Case& c : hlq_cases()) {
    for (const bool conv : {false, true}) {
      for (const DType dt : {DType::f32, DType::bf16}) {
        INFO(c.label << (conv ? ", conv" : ", linear") << ", " << dtype_name(dt));
        // kept elsewhere, but compressed anyway; kept elsewhere: a reference; not kept elsewhere: compressed
        const Run copied = run(c.spec, {.share = false, .kept_elsewhere = true, .conv = conv, .dt = dt});
        const Run shared = run(c.spec, {.share = true, .kept_elsewhere = true, .conv = conv, .dt = dt});
        const Run alone = run(c.spec, {.share = true, .kept_elsewhere = false, .conv = conv, .dt = dt});
        CHECK(copied.bytes > 0);
        CHECK(shared.bytes == 0);
        CHECK(alone.bytes == copied.bytes);
        for (const Run* r : {&shared, &alone}) {
          CHECK(test::compare(r->y, copied.y, 0.0, 0.0) == "");
          CHECK(test::compare(r->gx, copied.gx, 0.0, 0.0) == "");
          CHECK(test::compare(r->gw, copied.gw, 0.0, 0.0) == "");
        }
      }
    }
  }
}

TEST_CASE("hlq acbp_share config key", "[grad]") {
  const auto parse = test::parse_grad_pipeline;
  CHECK(parse("grad_pipeline: {default: {name: hlq}}").default_spec.options_as<grad::HlqOptions>().acbp_share);
  const grad::PipelineConfig off =
      parse("grad_pipeline: {default: {name: hlq}, layers: {fc: {name: hlq, acbp_share: false}}}");
  CHECK(off.default_spec.options_as<grad::HlqOptions>().acbp_share);
  REQUIRE(off.overrides.size() == 1);
  CHECK_FALSE(off.overrides[0].second.options_as<grad::HlqOptions>().acbp_share);
  CHECK(grad::describe(off.overrides[0].second).find("never shared") != std::string::npos);
  CHECK(grad::describe(off.default_spec).find("shared") == std::string::npos);
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, acbp_share: sometimes}}"),
                    HasSubstr("grad_pipeline.default.acbp_share"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: luq, acbp_share: false}}"), HasSubstr("unknown key"));
  const grad::PipelineConfig def = parse("grad_pipeline: {default: {name: hlq}}");
  CHECK(def.default_spec.options_as<grad::HlqOptions>().acbp_rebuild);  // on by default
  CHECK(grad::describe(def.default_spec).find("rebuilt") == std::string::npos);
  const grad::PipelineConfig rb = parse("grad_pipeline: {default: {name: hlq, acbp_rebuild: false}}");
  CHECK_FALSE(rb.default_spec.options_as<grad::HlqOptions>().acbp_rebuild);
  CHECK(grad::describe(rb.default_spec).find("never rebuilt") != std::string::npos);
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, acbp_rebuild: 2}}"),
                    HasSubstr("grad_pipeline.default.acbp_rebuild"));
}

namespace {

struct MlpRun {
  std::vector<Tensor> grads;  // fc1 and fc2 weights and biases, and x
  int64_t fc2_bytes = -1;
};

struct MlpSetup {
  bool rebuild = true;   // acbp_rebuild
  bool dropout = false;  // a dropout after the gelu, whose node cannot rebuild its output
  DType dt = DType::f32;
};

// fc2(gelu(fc1(x))) (a dropout after the gelu when asked) with both layers on HLQ.
MlpRun run_mlp(const MlpSetup& m) {
  const DType dt = m.dt;
  Generator gen(21);
  auto fc1 = std::make_shared<nn::Linear>(12, 32, nn::Bias::yes, gen);
  auto fc2 = std::make_shared<nn::Linear>(32, 12, nn::Bias::yes, gen);
  fc1->to(dt);
  fc2->to(dt);
  grad::PipelineConfig pc;
  pc.default_spec.name = "hlq";
  pc.default_spec.options_as<grad::HlqOptions>().acbp_rebuild = m.rebuild;
  auto clock = std::make_shared<grad::StepClock>();
  nn::bind_pipelines(*fc1, pc, clock);
  nn::bind_pipelines(*fc2, pc, clock);
  Tensor x = test::random_tensor({3, 16, 12}, 22, DType::f32).to(dt);
  x.set_requires_grad(true);
  Generator drop(5);
  Tensor h = gelu(fc1->forward(x));
  if (m.dropout) h = ht::dropout(h, 0.25, drop);
  const Tensor y = fc2->forward(h);
  sum(mul(y, test::random_tensor(y.shape(), 23, DType::f32).to(dt))).backward();
  MlpRun r;
  r.grads = {fc1->weight.grad(), fc1->bias.grad(), fc2->weight.grad(), fc2->bias.grad(), x.grad()};
  r.fc2_bytes = fc2->grad_pipeline.saved_bytes;
  return r;
}

}  // namespace

TEST_CASE("hlq acbp_rebuild: fc2 rebuilds the gelu output in backward instead of keeping a copy", "[grad]") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const MlpRun copied = run_mlp({.rebuild = false, .dropout = false, .dt = dt});
    const MlpRun rebuilt = run_mlp({.rebuild = true, .dropout = false, .dt = dt});
    CHECK(copied.fc2_bytes > 0);
    CHECK(rebuilt.fc2_bytes == 0);
    REQUIRE(rebuilt.grads.size() == copied.grads.size());
    for (std::size_t i = 0; i < copied.grads.size(); ++i)
      CHECK(test::compare(rebuilt.grads[i], copied.grads[i], 0.0, 0.0) == "");
    // A dropout after the gelu: its node cannot rebuild its output, so fc2 keeps its copy.
    const MlpRun dropped_off = run_mlp({.rebuild = false, .dropout = true, .dt = dt});
    const MlpRun dropped_on = run_mlp({.rebuild = true, .dropout = true, .dt = dt});
    CHECK(dropped_on.fc2_bytes == dropped_off.fc2_bytes);
    CHECK(dropped_on.fc2_bytes > 0);
    for (std::size_t i = 0; i < copied.grads.size(); ++i)
      CHECK(test::compare(dropped_on.grads[i], dropped_off.grads[i], 0.0, 0.0) == "");
  }
  // The unary node rebuilds its output bit for bit, and refuses once its backward released what it kept.
  Tensor z = test::random_tensor({4, 8}, 30, DType::f32);
  z.set_requires_grad(true);
  const Tensor g = gelu(z);
  REQUIRE(g.grad_fn()->can_recompute_output());
  CHECK(test::compare(g.grad_fn()->recompute_output(), g, 0.0, 0.0) == "");
  const auto fn = g.grad_fn();
  sum(g).backward();
  CHECK_THROWS_WITH(fn->recompute_output(), HasSubstr("a second time"));
  const Tensor m = mul(z, z);  // a node without a rebuild
  CHECK_FALSE(m.grad_fn()->can_recompute_output());
  CHECK_FALSE(m.grad_fn()->recompute_output().defined());
}

TEST_CASE("hlq acbp_rebuild in a ViT on the CPU: qkv, fc1 and fc2 rebuild their inputs, the gradients keep their bits",
          "[grad][models]") {
  const models::VitConfig cfg = test::tiny_vit(32, 2, 2);
  std::vector<Tensor> grads[2];
  std::map<std::string, int64_t> bytes[2];
  for (int rebuild = 0; rebuild < 2; ++rebuild) {
    Generator gen(9);
    models::VisionTransformer v(cfg, gen, std::make_shared<Generator>(10));
    grad::PipelineConfig pc;
    pc.default_spec.name = "hlq";
    pc.default_spec.options_as<grad::HlqOptions>().acbp_rebuild = rebuild == 1;
    const auto bound = nn::bind_pipelines(v, pc, std::make_shared<grad::StepClock>());
    const Tensor x = test::random_tensor({2, 3, 8, 8}, 11, DType::f32);
    cross_entropy(v.forward(x), from_vector(std::vector<int64_t>{1, 7}, {2}, {DType::i64})).backward();
    for (const auto& b : bound) bytes[rebuild][b.name] = b.binding->saved_bytes;
    for (auto& [n, p] : v.named_parameters()) grads[rebuild].push_back(p->grad());
  }
  for (const auto& [name, b] : bytes[0]) {
    INFO(name);
    CHECK(b > 0);
    // LayerNorm outputs (qkv, fc1) and the gelu output (fc2) are rebuilt; proj's input (the CPU attention's
    // fresh output) and the patch embedding's image are not.
    const bool rebuilt = name.ends_with("attn.qkv") || name.ends_with("mlp.fc1") || name.ends_with("mlp.fc2");
    CHECK(bytes[1][name] == (rebuilt ? 0 : b));
  }
  REQUIRE(grads[0].size() == grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(test::compare(grads[1][i], grads[0][i], 0.0, 0.0) == "");
}

TEST_CASE("a LayerNorm node rebuilds its output bit for bit while it keeps its weight", "[autograd][grad]") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    Tensor x = test::random_tensor({3, 5, 16}, 40, DType::f32).to(dt);
    Tensor w = test::random_tensor({16}, 41, DType::f32).to(dt);
    Tensor b = test::random_tensor({16}, 42, DType::f32).to(dt);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    const Tensor y = layer_norm(x, w, b, 1e-5);
    REQUIRE(y.grad_fn()->can_recompute_output());
    CHECK(test::compare(y.grad_fn()->recompute_output(), y, 0.0, 0.0) == "");
    // Without a gradient for x the node does not keep the weight, so it cannot rebuild the output.
    const Tensor y2 = layer_norm(x.detach(), w, b, 1e-5);
    CHECK_FALSE(y2.grad_fn()->can_recompute_output());
    CHECK_FALSE(y2.grad_fn()->recompute_output().defined());
  }
}

namespace {

struct ConvRun {
  std::vector<Tensor> grads;  // weight, bias, x
  int64_t bytes = -1;
};

struct ConvSetup {
  bool rebuild = true;  // acbp_rebuild
  ConvLayout layout = ConvLayout::nchw;
  grad::AcbpConv acbp_conv = grad::AcbpConv::columns;
  grad::ConvGw conv_gw = grad::ConvGw::columns;
  DType dt = DType::f32;
};

// conv(relu(x)) on HLQ. With nhwc the relu runs over the (N·H·W, C) rows and is reshaped back to (N, H, W, C), as
// a channels-last batch norm's output is: the conv's input is then a reshape whose node rebuilds it through the
// relu's.
ConvRun run_conv(const ConvSetup& c) {
  const bool nhwc = c.layout == ConvLayout::nhwc;
  Generator gen(31);
  nn::Conv2d conv({.in_channels = 4, .out_channels = 8, .kernel = 3, .padding = 1, .layout = c.layout}, gen);
  conv.to(c.dt);
  grad::PipelineConfig pc;
  pc.default_spec.name = "hlq";
  pc.default_spec.options_as<grad::HlqOptions>().acbp_rebuild = c.rebuild;
  pc.default_spec.options_as<grad::HlqOptions>().acbp_conv = c.acbp_conv;
  pc.default_spec.options_as<grad::HlqOptions>().conv_gw = c.conv_gw;
  nn::bind_pipelines(conv, pc, std::make_shared<grad::StepClock>());
  Tensor x = test::random_tensor(nhwc ? Shape{2, 8, 8, 4} : Shape{2, 4, 8, 8}, 32, DType::f32).to(c.dt);
  x.set_requires_grad(true);
  const Tensor h = nhwc ? reshape(relu(reshape(x, {-1, 4})), x.shape()) : relu(x);
  const Tensor y = conv.forward(h);
  sum(mul(y, test::random_tensor(y.shape(), 33, DType::f32).to(c.dt))).backward();
  return {{conv.weight.grad(), conv.bias.grad(), x.grad()}, conv.grad_pipeline.saved_bytes};
}

}  // namespace

TEST_CASE("hlq acbp_rebuild of a Conv2d: an input its op can rebuild is not kept, directly or through a reshape",
          "[grad]") {
  for (const ConvLayout layout : {ConvLayout::nchw, ConvLayout::nhwc})
    for (const grad::AcbpConv mode : {grad::AcbpConv::columns, grad::AcbpConv::input_map})
      for (const DType dt : {DType::f32, DType::bf16}) {
        INFO((layout == ConvLayout::nhwc ? "nhwc" : "nchw") << (mode == grad::AcbpConv::columns ? ", columns" : ", map")
                                                            << ", " << dtype_name(dt));
        const ConvRun kept = run_conv({.rebuild = false, .layout = layout, .acbp_conv = mode, .dt = dt});
        const ConvRun rebuilt = run_conv({.rebuild = true, .layout = layout, .acbp_conv = mode, .dt = dt});
        CHECK(kept.bytes > 0);
        CHECK(rebuilt.bytes == 0);
        for (std::size_t i = 0; i < kept.grads.size(); ++i)
          CHECK(test::compare(rebuilt.grads[i], kept.grads[i], 0.0, 0.0) == "");
        // conv_gw wgrad_simulated (Note [HLQ conv g_w]) reads the rebuilt image itself: the same bias and image
        // gradients, a weight gradient without x̃'s 8-bit SAWB quantisation, which clips (hlq.md §7 #11):
        // measured 0.12–0.13 from the columns form's here.
        const ConvRun wg = run_conv({.rebuild = true, .layout = layout, .acbp_conv = mode,
                                     .conv_gw = grad::ConvGw::wgrad_simulated, .dt = dt});
        CHECK(wg.bytes == 0);
        CHECK(test::compare(wg.grads[1], kept.grads[1], 0.0, 0.0) == "");
        CHECK(test::compare(wg.grads[2], kept.grads[2], 0.0, 0.0) == "");
        const double d = test::rel_error(wg.grads[0], kept.grads[0]);
        INFO("g_w wgrad_simulated vs columns " << d);
        CHECK(d > 0.0);
        CHECK(d < 0.2);
      }
  // The reshape node rebuilds through its input's node, and only then.
  Tensor z = test::random_tensor({4, 6}, 34, DType::f32);
  z.set_requires_grad(true);
  const Tensor r = reshape(gelu(z), {2, 12});
  REQUIRE(r.grad_fn()->can_recompute_output());
  CHECK(test::compare(r.grad_fn()->recompute_output(), r, 0.0, 0.0) == "");
  CHECK_FALSE(reshape(mul(z, z), {24}).grad_fn()->can_recompute_output());
  CHECK_FALSE(reshape(z, {24}).grad_fn()->can_recompute_output());  // a leaf's accumulator cannot
}

TEST_CASE("a fused batch norm node on the CPU gives its kept output as its rebuilt output", "[autograd][grad]") {
  Tensor x = test::random_tensor({4, 3, 5, 5}, 35, DType::f32);
  x.set_requires_grad(true);
  const Tensor w = test::random_tensor({3}, 36, DType::f32), b = test::random_tensor({3}, 37, DType::f32);
  BatchNormOptions o;
  o.activation = BatchNormActivation::relu;
  const Tensor y = batch_norm(x, w, b, Tensor(), Tensor(), o);
  REQUIRE(y.grad_fn()->can_recompute_output());
  CHECK(test::compare(y.grad_fn()->recompute_output(), y, 0.0, 0.0) == "");
  o.activation = BatchNormActivation::none;  // the CPU keeps no output without the activation
  CHECK_FALSE(batch_norm(x, w, b, Tensor(), Tensor(), o).grad_fn()->can_recompute_output());
}

TEST_CASE("luq keeps no copy of an input its op can rebuild, and the gradients keep their bits", "[grad]") {
  // The baseline run reads the same values through mul(h, 1.0), whose node cannot rebuild its output, so LUQ
  // quantises x in the forward there; with the gelu / relu output itself it keeps nothing and quantises in backward.
  for (const bool conv : {false, true}) {
    INFO((conv ? "conv" : "linear"));
    std::vector<Tensor> grads[2];
    int64_t bytes[2] = {-1, -1};
    for (int rebuilt = 0; rebuilt < 2; ++rebuilt) {
      Generator gen(41);
      std::shared_ptr<nn::Module> layer;
      if (conv)
        layer = std::make_shared<nn::Conv2d>(
            nn::Conv2dOptions{.in_channels = 4, .out_channels = 8, .kernel = 3, .padding = 1}, gen);
      else layer = std::make_shared<nn::Linear>(12, 16, nn::Bias::yes, gen);
      grad::PipelineConfig pc;
      pc.default_spec.name = "luq";
      const auto bound = nn::bind_pipelines(*layer, pc, std::make_shared<grad::StepClock>());
      Tensor x = test::random_tensor(conv ? Shape{2, 4, 8, 8} : Shape{3, 16, 12}, 42, DType::f32);
      x.set_requires_grad(true);
      Tensor h = conv ? relu(x) : gelu(x);
      if (rebuilt == 0) {
        h = mul(h, 1.0);
        CHECK_FALSE(h.grad_fn()->can_recompute_output());
      }
      const Tensor y = layer->forward(h);
      sum(mul(y, test::random_tensor(y.shape(), 43, DType::f32))).backward();
      bytes[rebuilt] = bound.at(0).binding->saved_bytes;
      for (auto& [n, p] : layer->named_parameters()) grads[rebuilt].push_back(p->grad());
      grads[rebuilt].push_back(x.grad());
    }
    CHECK(bytes[0] > 0);
    CHECK(bytes[1] == 0);
    for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(test::compare(grads[1][i], grads[0][i], 0.0, 0.0) == "");
  }
}

// ---- Note [Recomputed outputs] -----------------------------------------------------------------------------------

namespace {

struct RecomputeRun {
  std::vector<Tensor> grads;  // the parameters' gradients, then x's
  std::size_t gelu_kept = 0;  // bytes the gelu node keeps after the forward
  bool output_rebuilt = false;
  int64_t fc2_bytes = -1;
};

struct RecomputeSetup {
  std::string pipeline = "hlq";
  bool recompute = true;  // recompute_output on fc1
  bool norm = true;       // fc1 reads a LayerNorm output (rebuildable); else x itself (a leaf: not rebuildable)
  DType dt = DType::f32;
};

// fc2(gelu(fc1(norm(x)))), every Linear on one pipeline, fc1 with recompute_output when asked.
RecomputeRun run_recompute(const RecomputeSetup& s) {
  Generator gen(51);
  auto norm = std::make_shared<nn::LayerNorm>(12, 1e-5);
  auto fc1 = std::make_shared<nn::Linear>(12, 32, nn::Bias::yes, gen);
  auto fc2 = std::make_shared<nn::Linear>(32, 12, nn::Bias::yes, gen);
  for (auto* m : std::initializer_list<nn::Module*>{norm.get(), fc1.get(), fc2.get()}) m->to(s.dt);
  grad::PipelineConfig pc;
  pc.default_spec.name = s.pipeline;
  auto clock = std::make_shared<grad::StepClock>();
  nn::bind_pipelines(*fc2, pc, clock);
  pc.default_spec.recompute_output = s.recompute;
  nn::bind_pipelines(*fc1, pc, clock);
  Tensor x = test::random_tensor({3, 16, 12}, 52, DType::f32).to(s.dt);
  x.set_requires_grad(true);
  const Tensor h = gelu(fc1->forward(s.norm ? norm->forward(x) : x));
  RecomputeRun r;
  r.gelu_kept = h.grad_fn()->saved_bytes();
  const Tensor y = fc2->forward(h);
  sum(mul(y, test::random_tensor(y.shape(), 53, DType::f32).to(s.dt))).backward();
  for (auto* m : std::initializer_list<nn::Module*>{norm.get(), fc1.get(), fc2.get()})
    for (auto& [n, p] : m->named_parameters()) r.grads.push_back(p->grad());
  r.grads.push_back(x.grad());
  r.output_rebuilt = fc1->grad_pipeline.output_rebuilt;
  r.fc2_bytes = fc2->grad_pipeline.saved_bytes;
  return r;
}

}  // namespace

TEST_CASE("recompute_output: the gelu keeps fc1's node instead of its input, and the gradients keep their bits",
          "[grad]") {
  for (const std::string p : {"exact", "hlq", "luq", "lbp_wht"}) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      INFO(p << ", " << dtype_name(dt));
      const RecomputeRun kept = run_recompute({.pipeline = p, .recompute = false, .norm = true, .dt = dt});
      const RecomputeRun rebuilt = run_recompute({.pipeline = p, .recompute = true, .norm = true, .dt = dt});
      CHECK(kept.gelu_kept == 3 * 16 * 32 * itemsize(dt));  // z, the gelu's input
      CHECK_FALSE(kept.output_rebuilt);
      CHECK(rebuilt.output_rebuilt);
      CHECK(rebuilt.gelu_kept == 0);
      // fc2's own saving is unchanged: under hlq / luq it rebuilds the gelu output, now through fc1's product.
      CHECK(rebuilt.fc2_bytes == kept.fc2_bytes);
      REQUIRE(rebuilt.grads.size() == kept.grads.size());
      for (std::size_t i = 0; i < kept.grads.size(); ++i) {
        INFO("gradient " << i);
        CHECK(test::compare(rebuilt.grads[i], kept.grads[i], 0.0, 0.0) == "");
      }
    }
  }
  // fc1 reads a leaf: nothing keeps it and nothing rebuilds it, so under hlq the product cannot run again and the
  // gelu keeps z; the exact pipeline keeps x itself, so its node shares that.
  const RecomputeRun hlq_leaf = run_recompute({.pipeline = "hlq", .recompute = true, .norm = false});
  CHECK_FALSE(hlq_leaf.output_rebuilt);
  CHECK(hlq_leaf.gelu_kept == 3 * 16 * 32 * 4);
  const RecomputeRun exact_leaf = run_recompute({.pipeline = "exact", .recompute = true, .norm = false});
  CHECK(exact_leaf.output_rebuilt);
  CHECK(exact_leaf.gelu_kept == 0);
  const RecomputeRun exact_leaf_kept = run_recompute({.pipeline = "exact", .recompute = false, .norm = false});
  for (std::size_t i = 0; i < exact_leaf.grads.size(); ++i) {
    if (!exact_leaf_kept.grads[i].defined()) {  // the unused LayerNorm's
      CHECK_FALSE(exact_leaf.grads[i].defined());
      continue;
    }
    CHECK(test::compare(exact_leaf.grads[i], exact_leaf_kept.grads[i], 0.0, 0.0) == "");
  }
}

TEST_CASE("a node that offers its output is kept by Node::save and rebuilt once, on the first read",
          "[autograd][grad]") {
  Generator gen(55);
  auto fc = std::make_shared<nn::Linear>(8, 8, nn::Bias::no, gen);
  grad::PipelineConfig pc;
  pc.default_spec.recompute_output = true;  // exact, routed through its product for the rebuild
  nn::bind_pipelines(*fc, pc, std::make_shared<grad::StepClock>());
  Tensor x = test::random_tensor({2, 4, 8}, 56, DType::f32);
  x.set_requires_grad(true);
  const Tensor y = fc->forward(exp(x));  // exp keeps x; the exact product keeps exp(x)
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->offers_rebuild());
  const Tensor t = tanh(y);
  const auto node = t.grad_fn();
  CHECK(node->saved_bytes() == 0);
  // The rebuilt input is the forward's, bit for bit, kept from the first read on.
  CHECK(test::compare(node->saved(0), y, 0.0, 0.0) == "");
  CHECK(node->saved_bytes() == y.nbytes());
  CHECK(node->saved(0).storage() == node->saved(0).storage());
  CHECK(node->saved(0).storage() != y.storage());
  // Without recompute_output the exact layer runs its plain op and nothing is offered.
  fc->grad_pipeline.recompute_output = false;
  const Tensor y2 = fc->forward(exp(x));
  CHECK_FALSE(y2.grad_fn()->offers_rebuild());
  CHECK(tanh(y2).grad_fn()->saved_bytes() == y2.nbytes());
}

TEST_CASE("RebuildInput leaves what a product node rebuilt for the pipeline's backward, once", "[grad]") {
  // Note [Recomputed outputs]: fc1's node rebuilds its input (a LayerNorm output) to rebuild its output for the gelu;
  // the pipeline's backward then takes that input instead of rebuilding it again.
  Tensor z = test::random_tensor({4, 6}, 60, DType::f32);
  z.set_requires_grad(true);
  const Tensor h = gelu(z);
  grad::RebuildInput r{h.grad_fn(), nullptr, std::make_shared<Tensor>()};
  const Tensor first = r.rebuild_and_leave();
  CHECK(test::compare(first, h, 0.0, 0.0) == "");
  REQUIRE(r.left->defined());
  const grad::RebuildInput copy = r;  // the pipeline's copy shares `left`
  const Tensor taken = copy.take();
  CHECK(taken.storage() == first.storage());  // the same tensor, not a second rebuild
  CHECK_FALSE(r.left->defined());             // taken once
  const Tensor again = copy.take();           // nothing left: rebuilt
  CHECK(again.storage() != first.storage());
  CHECK(test::compare(again, h, 0.0, 0.0) == "");
  const grad::RebuildInput plain{h.grad_fn(), nullptr, nullptr};  // no sharing: take() is operator()
  CHECK(test::compare(plain.rebuild_and_leave(), h, 0.0, 0.0) == "");
  CHECK(test::compare(plain.take(), h, 0.0, 0.0) == "");
}

TEST_CASE("recompute_output config key, and what bind_pipelines does with it", "[grad]") {
  const auto parse = test::parse_grad_pipeline;
  const grad::PipelineConfig c =
      parse("grad_pipeline: {default: {name: hlq}, layers: {'*.fc1': {name: hlq, recompute_output: true}}}");
  CHECK_FALSE(c.default_spec.recompute_output);
  REQUIRE(c.overrides.size() == 1);
  CHECK(c.overrides[0].second.recompute_output);
  CHECK(grad::describe(c.overrides[0].second).ends_with(", output recomputed in backward"));
  CHECK(grad::describe(c.default_spec).find("recomputed") == std::string::npos);
  CHECK(parse("grad_pipeline: {default: {name: exact, recompute_output: true}}").default_spec.recompute_output);
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, recompute_output: maybe}}"),
                    HasSubstr("grad_pipeline.default.recompute_output"));
  // A Conv2d ignores it (Linear layers only).
  Generator gen(57);
  const models::VitConfig cfg = test::tiny_vit(16, 2, 1);
  models::VisionTransformer v(cfg, gen, std::make_shared<Generator>(58));
  grad::PipelineConfig pc;
  pc.default_spec.recompute_output = true;
  for (const auto& b : nn::bind_pipelines(v, pc, std::make_shared<grad::StepClock>()))
    CHECK(b.binding->recompute_output == (b.type == "Linear"));
}

TEST_CASE("recompute_output in a ViT on the CPU: fc1 and qkv offer their outputs, the gradients keep their bits",
          "[grad][models]") {
  const models::VitConfig cfg = test::tiny_vit(32, 2, 2);
  std::vector<Tensor> grads[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    Generator gen(9);
    models::VisionTransformer v(cfg, gen, std::make_shared<Generator>(10));
    const grad::PipelineConfig pc = test::hlq_recomputing_fc1_qkv(recompute == 1);
    const auto bound = nn::bind_pipelines(v, pc, std::make_shared<grad::StepClock>());
    const Tensor x = test::random_tensor({2, 3, 8, 8}, 11, DType::f32);
    cross_entropy(v.forward(x), from_vector(std::vector<int64_t>{1, 7}, {2}, {DType::i64})).backward();
    for (const auto& b : bound) {
      INFO(b.name);
      CHECK(b.binding->output_rebuilt == (recompute == 1 && (b.name.ends_with("fc1") || b.name.ends_with("qkv"))));
    }
    for (auto& [n, p] : v.named_parameters()) grads[recompute].push_back(p->grad());
  }
  REQUIRE(grads[0].size() == grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(test::compare(grads[1][i], grads[0][i], 0.0, 0.0) == "");
}
