// The gradient-pipeline registry (grad/registry.h): a pipeline registered from this file, outside the library,
// is selected by a YAML config through the normal config reader and trains a Linear; unknown names list the
// registered ones; exactness is the pipeline's property; fallbacks of a model's layers are named in one line.
#include <algorithm>

#include <fmt/format.h>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/registry.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/pipeline_config.h"
#include "support/catch.h"
#include "support/model_testing.h"
#include "support/testing.h"

using namespace ht;

namespace {

// A test-only pipeline: the exact products, with g_x multiplied by `factor`.
struct ScaledGxOptions {
  double factor = 2.0;
};

struct ScaledGxSaved final : grad::SavedState {
  Tensor x, w;  // (B, L, I), (O, I)
};

class ScaledGxPipeline final : public grad::Pipeline {
 public:
  explicit ScaledGxPipeline(const ScaledGxOptions& o) : o_(o) {}
  std::string name() const override { return "scaled_gx"; }
  grad::ForwardResult forward(const Tensor& x, const Tensor& w, const grad::ProductInfo& info, const grad::NoiseKey&,
                              grad::SaveForBackward save) override {
    grad::ForwardResult r;
    r.y = linear(x, w, info.bias);  // (B, L, O)
    if (save == grad::SaveForBackward::yes) {
      auto s = std::make_unique<ScaledGxSaved>();
      s->x = x;
      s->w = w;
      r.saved = std::move(s);
    }
    return r;
  }
  grad::Grads backward(grad::SavedState& saved, const Tensor& g_y, grad::Wanted wanted) override {
    auto& s = static_cast<ScaledGxSaved&>(saved);
    grad::Grads g;
    if (wanted.x) g.x = mul(matmul(g_y, s.w), o_.factor);  // (B, L, I)
    if (wanted.w) {
      const Tensor g2 = reshape(g_y, {-1, g_y.size(-1)});  // (B·L, O)
      g.w = matmul(g2.transpose(0, 1), reshape(s.x, {-1, s.x.size(-1)}));  // (O, I)
    }
    return g;
  }

 private:
  ScaledGxOptions o_;
};

// Registered at static initialisation: this file is part of the test executable, so it is linked.
const grad::PipelineRegistrar scaled_gx_registrar{grad::PipelineKind<ScaledGxOptions>{
    .name = "scaled_gx",
    .read_options = [](ConfigReader& r) { return ScaledGxOptions{r.get("factor", 2.0, Range::positive())}; },
    .make = [](const ScaledGxOptions& o) { return std::make_shared<ScaledGxPipeline>(o); },
    .describe = [](const ScaledGxOptions& o) { return fmt::format("scaled_gx (g_x x{})", o.factor); }}};

}  // namespace

TEST_CASE("a pipeline registered by a test is selected from a YAML config and trains a Linear", "[grad]") {
  const grad::PipelineConfig cfg =
      test::parse_grad_pipeline("grad_pipeline:\n  default: {name: scaled_gx, factor: 3}\n");
  REQUIRE(cfg.default_spec.name == "scaled_gx");
  CHECK(cfg.default_spec.options_as<ScaledGxOptions>().factor == 3.0);
  CHECK(grad::describe(cfg.default_spec) == "scaled_gx (g_x x3)");

  Generator gen(4);
  nn::Linear lin(6, 5, nn::Bias::yes, gen);
  const Tensor x0 = test::random_tensor({2, 4, 6}, 11, DType::f32);  // (B, L, I)
  const Tensor g_y = test::random_tensor({2, 4, 5}, 12, DType::f32);
  struct Result {
    Tensor y, gx, gw, gb;
  };
  auto run = [&] {
    lin.zero_grad();
    Tensor x = x0.clone().set_requires_grad(true);
    const Tensor y = lin.forward(x);
    sum(mul(y, g_y)).backward();
    return Result{y, x.grad(), lin.weight.grad().clone(), lin.bias.grad().clone()};
  };
  const Result plain = run();  // unbound: the plain linear op

  const auto layers = nn::bind_pipelines(lin, cfg, std::make_shared<grad::StepClock>());
  REQUIRE(layers.size() == 1);
  CHECK(layers[0].pipeline == "scaled_gx (g_x x3)");
  CHECK(lin.grad_pipeline.active());
  const Result bound = run();
  CHECK(test::rel_error(bound.y, plain.y) < 1e-6);
  CHECK(test::rel_error(bound.gx, mul(plain.gx, 3.0)) < 1e-6);  // the registered pipeline's g_x, not exact's
  CHECK(test::rel_error(bound.gw, plain.gw) < 1e-6);
  CHECK(test::rel_error(bound.gb, plain.gb) < 1e-6);  // the bias gradient stays outside the pipeline
}

TEST_CASE("a registered pipeline's options reader reports the file, line and key", "[grad]") {
  CHECK_THROWS_WITH(test::parse_grad_pipeline("grad_pipeline:\n  default: {name: scaled_gx, factor: -1}\n"),
                    HasSubstr("test.yaml:2:") && HasSubstr("grad_pipeline.default.factor: expected a number > 0"));
  CHECK_THROWS_WITH(test::parse_grad_pipeline("grad_pipeline: {default: {name: scaled_gx, order: 4}}"),
                    HasSubstr("grad_pipeline.default.order: unknown key"));
  CHECK(test::parse_grad_pipeline("grad_pipeline: {default: {name: scaled_gx}}")
            .default_spec.options_as<ScaledGxOptions>()
            .factor == 2.0);
}

TEST_CASE("an unknown pipeline name lists the registered pipelines", "[grad]") {
  const auto names = grad::registered_pipelines();
  REQUIRE(names.size() >= 6);
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 5) ==
        std::vector<std::string>{"exact", "halo", "hlq", "lbp_wht", "luq"});
  CHECK(std::find(names.begin(), names.end(), "scaled_gx") != names.end());
  CHECK_THROWS_WITH(test::parse_grad_pipeline("grad_pipeline: {layers: {fc: {name: halo9}}}"),
                    HasSubstr("grad_pipeline.layers.fc.name: expected one of exact, halo, hlq, lbp_wht, luq, scaled_gx"));
  grad::PipelineSpec s;
  s.name = "halo9";
  CHECK_THROWS_WITH(grad::make_pipeline(s),
                    HasSubstr("unknown gradient pipeline 'halo9' (expected exact, halo, hlq, lbp_wht, luq or scaled_gx)"));
}

TEST_CASE("registering a taken name, or a spec with another pipeline's options, is an error", "[grad]") {
  CHECK_THROWS_WITH(grad::register_pipeline(grad::PipelineKind<grad::NoOptions>{
                        .name = "hlq", .make = [](const grad::NoOptions&) { return grad::make_pipeline({}); }}),
                    HasSubstr("a gradient pipeline named 'hlq' is already registered"));
  grad::PipelineSpec s;
  s.name = "hlq";
  s.options = ScaledGxOptions{};
  CHECK_THROWS_WITH(grad::make_pipeline(s), HasSubstr("gradient pipeline 'hlq': the spec holds options of another"));
}

TEST_CASE("exactness is a property of the pipeline: an exact layer runs its plain ops", "[grad]") {
  for (const std::string name : grad::registered_pipelines()) {
    grad::PipelineSpec s;
    s.name = name;
    const auto p = grad::make_pipeline(s);
    INFO(name);
    CHECK(p->exact_backward() == (name == "exact"));
    nn::PipelineBinding b;
    b.pipeline = p;
    CHECK(b.active() == (name != "exact"));
  }
}

TEST_CASE("the layers whose pipeline falls back are named in one line after a training step", "[grad]") {
  Generator gen(9);
  nn::Sequential net;  // layers "0", "1", "2"
  net.push_back(std::make_shared<nn::Linear>(8, 8, nn::Bias::no, gen));
  net.push_back(std::make_shared<nn::Linear>(8, 8, nn::Bias::no, gen));
  net.push_back(std::make_shared<nn::Linear>(8, 4, nn::Bias::no, gen));
  // hlq on 0 and 2, lbp_wht on 1: over 3 tokens per sample HLA has no power-of-two block and LBP-WHT no grid.
  const grad::PipelineConfig cfg =
      test::parse_grad_pipeline("grad_pipeline: {default: {name: hlq}, layers: {'1': {name: lbp_wht}}}");
  const auto layers = nn::bind_pipelines(net, cfg, std::make_shared<grad::StepClock>());
  REQUIRE(layers.size() == 3);
  CHECK(nn::describe_fallbacks(layers).empty());  // nothing ran yet

  Tensor x = test::random_tensor({2, 3, 8}, 10, DType::f32).set_requires_grad(true);  // (B, L = 3, I)
  sum(net.forward(x)).backward();
  const std::string line = nn::describe_fallbacks(layers);
  INFO(line);
  CHECK(line.find('\n') == std::string::npos);
  CHECK(line == "grad pipeline fallbacks: 0, 2 (hlq HLA keeps every row: 3 tokens per sample have no power-of-two "
                "factor (fallback split_extra or pad compresses them)); 1 (lbp_wht runs exact: 3 rows have no token "
                "grid (not a square (plus extra tokens)))");

  // Over 16 tokens both compress: nothing falls back, so nothing is logged.
  Tensor x16 = test::random_tensor({2, 16, 8}, 13, DType::f32).set_requires_grad(true);
  sum(net.forward(x16)).backward();
  CHECK(nn::describe_fallbacks(layers).empty());
}
