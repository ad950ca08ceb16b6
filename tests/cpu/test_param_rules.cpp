// Freezing and per-pattern learning-rate multipliers (optim/param_rules.h, Note [Frozen parameters]): frozen
// parameters get no gradient, no update and no optimiser state, and keep being frozen across Module::to; a
// multiplier scales exactly that parameter's step (SGD and AdamW).
#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/models/resnet.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/optim/param_rules.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;
using namespace ht::optim;

namespace {
std::shared_ptr<models::ResNet> small_resnet() {
  Generator gen(1);
  return std::make_shared<models::ResNet>(
      models::ResNetConfig{models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 1, false}, gen);
}
}  // namespace

TEST_CASE("freeze patterns: the last matching pattern decides, '!' makes trainable", "[param_rules]") {
  const FreezeRules r{{"*", "!layer4.*", "!fc.*", "layer4.0.bn1.*"}};
  CHECK(r.frozen("conv1.weight"));
  CHECK(r.frozen("layer3.1.conv2.weight"));
  CHECK_FALSE(r.frozen("layer4.1.conv2.weight"));
  CHECK(r.frozen("layer4.0.bn1.weight"));
  CHECK_FALSE(r.frozen("fc.bias"));
  CHECK_FALSE(FreezeRules{}.frozen("fc.bias"));
}

TEST_CASE("frozen parameters get no gradient, no update and no optimiser state", "[param_rules]") {
  auto model = small_resnet();
  auto params = make_param_refs(model->named_parameters());
  const ParamRulesReport rep = apply_param_rules(params, {{"*", "!layer4.*", "!fc.*"}}, {{"fc.*", 10.0}});
  CHECK(rep.frozen_params > 0);
  CHECK(rep.trainable_params > 0);
  CHECK(rep.scaled.size() == 2);  // fc.weight, fc.bias
  model->to(DType::f64);          // frozen slots stay frozen through dtype and device moves
  CHECK_FALSE(model->named_parameters()[0].second->requires_grad());
  auto store = nn::ParameterStore::attach(*model, params);
  auto opt = make_adamw(store, {.weight_decay = 0.01});
  const std::map<std::string, Tensor> before = [&] {
    std::map<std::string, Tensor> m;
    for (auto& [k, v] : model->state_dict()) m.emplace(k, v.clone());
    return m;
  }();
  const Tensor x = test::random_tensor({4, 1, 8, 8}, 3);
  const Tensor y = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}, {DType::i64});
  cross_entropy(model->forward(x), y).backward();
  opt->step(1e-2);
  for (const auto& p : params) {
    const bool frozen = p.name.rfind("layer4.", 0) != 0 && p.name.rfind("fc.", 0) != 0;
    INFO(p.name);
    CHECK(p.param->grad().defined() == !frozen);
    const bool unchanged = test::compare(*p.param, before.at(p.name), 0, 0).empty();
    CHECK(unchanged == frozen);
  }
  const auto state = opt->state_tensors();
  CHECK(state.count("conv1.weight.exp_avg") == 0);
  CHECK(state.count("layer4.0.conv1.weight.exp_avg") == 1);
  CHECK(state.count("fc.weight.exp_avg_sq") == 1);
}

TEST_CASE("lr multipliers scale exactly that parameter's SGD and AdamW steps", "[param_rules]") {
  auto run = [](bool adamw, double scale) {
    Tensor a = from_vector(std::vector<double>{1.0, -2.0}, {1, 2}, {DType::f64});
    Tensor b = from_vector(std::vector<double>{0.5, 0.25}, {1, 2}, {DType::f64});
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    std::vector<ParamRef> params{{"body.w", &a, true}, {"head.w", &b, true}};
    apply_param_rules(params, {}, {{"head.*", scale}});
    auto opt = adamw ? make_adamw(params, {.weight_decay = 0.1}) : make_sgd(params, {.momentum = 0.9, .weight_decay = 0.1});
    for (int s = 0; s < 2; ++s) {
      a.set_grad(from_vector(std::vector<double>{0.3, -0.1}, {1, 2}, {DType::f64}));
      b.set_grad(from_vector(std::vector<double>{-0.2, 0.4}, {1, 2}, {DType::f64}));
      opt->step(0.1);
    }
    return std::pair{a.to_vector<double>(), b.to_vector<double>()};
  };
  for (const bool adamw : {false, true}) {
    INFO((adamw ? "adamw" : "sgd"));
    const auto [a1, b1] = run(adamw, 1.0);
    const auto [a3, b3] = run(adamw, 3.0);
    CHECK(a1 == a3);  // the other parameter does not change
    // A multiplier of 3 at lr 0.1 is the run of that parameter alone at lr 0.1 * 3.
    Tensor b = from_vector(std::vector<double>{0.5, 0.25}, {1, 2}, {DType::f64});
    b.set_requires_grad(true);
    auto opt = adamw ? make_adamw({{"h", &b, true}}, {.weight_decay = 0.1})
                     : make_sgd({{"h", &b, true}}, {.momentum = 0.9, .weight_decay = 0.1});
    for (int s = 0; s < 2; ++s) {
      b.set_grad(from_vector(std::vector<double>{-0.2, 0.4}, {1, 2}, {DType::f64}));
      opt->step(0.1 * 3.0);
    }
    const auto expect = b.to_vector<double>();
    CHECK(b3[0] == Approx(expect[0]).epsilon(1e-15));
    CHECK(b3[1] == Approx(expect[1]).epsilon(1e-15));
    CHECK(b3 != b1);
  }
}

TEST_CASE("param rules: a pattern matching nothing, or freezing everything, is an error", "[param_rules]") {
  auto model = small_resnet();
  auto params = make_param_refs(model->named_parameters());
  CHECK_THROWS_WITH(apply_param_rules(params, {{"*", "!layer5.*"}}, {}),
                    HasSubstr("train.freeze: the pattern '!layer5.*' matches no parameter (parameters: conv1.weight"));
  CHECK_THROWS_WITH(apply_param_rules(params, {}, {{"head.*", 2.0}}),
                    HasSubstr("optim.lr_multipliers: the pattern 'head.*' matches no parameter"));
  CHECK_THROWS_WITH(apply_param_rules(params, {{"*"}}, {}), HasSubstr("freeze all"));
}
