// Gradient accumulation (train.grad_accum_steps, Note [Gradient accumulation steps] in train/step_runner.h):
// k micro-batches of one batch give the update and the logged loss of that batch in one pass, for image
// classification and for the causal-LM task with unevenly ignored labels; the split and its weights.
#include "support/catch.h"
#include "support/testing.h"
#include "support/tiny_lm.h"

#include <memory>

#include "hadatrain/nn/layers.h"
#include "hadatrain/train/causal_lm.h"
#include "hadatrain/train/image_classification.h"
#include "train/step_runner.h"

using namespace ht;
using namespace ht::train;

namespace {

std::shared_ptr<nn::Module> mlp(Generator& g) {
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Flatten>(1));
  seq->push_back(std::make_shared<nn::Linear>(16, 12, nn::Bias::yes, g));
  seq->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::gelu));
  seq->push_back(std::make_shared<nn::Linear>(12, 5, nn::Bias::yes, g));
  seq->to(DType::f64);
  return seq;
}

data::Batch image_batch(int64_t rows, uint64_t seed) {
  data::Batch b;
  b.set(data::batch_key::image, test::random_tensor({rows, 1, 4, 4}, seed));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back((i * 3 + static_cast<int64_t>(seed)) % 5);
  b.set(data::batch_key::label, from_vector(labels, {rows}, {DType::i64}));
  return b;
}

data::Batch lm_batch(uint64_t seed) {
  // 6 rows of 5 tokens; rows 0-1 are mostly prompt (ignored), so the micro-batches' token counts differ.
  std::vector<int64_t> ids, labels;
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t t = 0; t < 5; ++t) {
      const int64_t id = (r * 7 + t * 3 + static_cast<int64_t>(seed)) % 9;
      ids.push_back(id);
      labels.push_back(r < 2 && t < 4 ? -100 : id);
    }
  data::Batch b;
  b.set(lm_key::input_ids, from_vector(ids, {6, 5}, {DType::i64}));
  b.set(lm_key::labels, from_vector(labels, {6, 5}, {DType::i64}));
  return b;
}

struct Run {
  std::vector<Tensor> params;  // after the steps
  std::vector<double> losses;  // logged per step
};

template <class MakeModel, class MakeBatch>
Run train_steps(const Task& task, MakeModel make_model, MakeBatch make_batch, int64_t accum, int steps, bool adamw) {
  Generator init(11);
  auto drop = std::make_shared<Generator>(5);
  std::shared_ptr<nn::Module> model = make_model(init, drop);
  auto store = nn::ParameterStore::attach(*model);
  std::unique_ptr<optim::Optimizer> opt =
      adamw ? optim::make_adamw(store, {.weight_decay = 0.01}) : optim::make_sgd(store, {.momentum = 0.9});
  StepStream stream(Device::cpu(), GraphMode::off);
  const data::Batch first = make_batch(0);
  StepRunner runner(stream, Device::cpu(), GraphMode::off,
                    {.model = model.get(),
                     .optimizer = opt.get(),
                     .task = &task,
                     .dropout_gen = drop.get(),
                     .clip_grad_norm = 0.5,
                     .batch_size = first.size(),
                     .grad_accum_steps = accum});
  Run r;
  for (int s = 0; s < steps; ++s) {
    runner.run(make_batch(static_cast<uint64_t>(s)), 0.05, s);
    r.losses.push_back(runner.take_loss_sum().sum);
  }
  for (const auto& [name, p] : model->named_parameters()) r.params.push_back(p->clone());
  return r;
}

void check_same(const Run& a, const Run& b, double tol) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) CHECK(std::abs(a.losses[i] - b.losses[i]) <= tol);
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) CHECK(test::compare(a.params[i], b.params[i], tol, tol) == "");
}

}  // namespace

TEST_CASE("4 micro-batches of 3 images step like one batch of 12", "[grad_accum]") {
  ImageClassification task({.compute_dtype = DType::f64});
  auto model = [](Generator& g, std::shared_ptr<Generator>) { return mlp(g); };
  auto batch = [](uint64_t s) { return image_batch(12, s); };
  const Run whole = train_steps(task, model, batch, 1, 3, true);
  const Run accum = train_steps(task, model, batch, 4, 3, true);
  check_same(accum, whole, 1e-12);
  // A split that does not divide the batch (12 rows in 5 micro-batches of 3, 3, 2, 2, 2) still matches.
  check_same(train_steps(task, model, batch, 5, 3, true), whole, 1e-12);
  // The steps moved the weights (the comparison is not between two untouched models).
  const Run none = train_steps(task, model, batch, 1, 0, true);
  CHECK(test::compare(whole.params[0], none.params[0], 1e-6, 0.0) != "");
}

TEST_CASE("micro-batches of language-model rows are weighted by their labelled tokens", "[grad_accum]") {
  CausalLm task;
  auto model = [](Generator& g, std::shared_ptr<Generator> d) {
    auto m = std::make_shared<test::TinyLm>(9, 4, g, std::move(d));
    m->to(DType::f64);
    return m;
  };
  const Run whole = train_steps(task, model, lm_batch, 1, 3, false);
  check_same(train_steps(task, model, lm_batch, 3, 3, false), whole, 1e-12);
  check_same(train_steps(task, model, lm_batch, 6, 3, false), whole, 1e-12);
  // Equal weights per micro-batch (the mean of the micro-batch means) would not match: rows 0-1 hold 2 of the
  // batch's 20 counted targets, not a third.
  const std::vector<MicroBatch> plan = plan_micro_batches(task, lm_batch(0), 3);
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].rows == 2);
  CHECK(std::abs(plan[0].scale - 2.0 / 18.0) < 1e-15);
  CHECK(std::abs(plan[1].scale - 8.0 / 18.0) < 1e-15);
}

TEST_CASE("the micro-batch plan: even split, ignored micro-batches left out, an all-ignored batch named",
          "[grad_accum]") {
  ImageClassification images;
  const std::vector<MicroBatch> p = plan_micro_batches(images, image_batch(10, 1), 4);
  REQUIRE(p.size() == 4);
  CHECK(p[0].start == 0);
  CHECK(p[0].rows == 3);
  CHECK(p[1].rows == 3);
  CHECK(p[2].rows == 2);
  CHECK(p[3].start == 8);
  CHECK(std::abs(p[3].scale - 0.2) < 1e-15);
  CHECK(plan_micro_batches(images, image_batch(2, 1), 4).size() == 2);  // fewer rows than micro-batches

  CausalLm lm;
  data::Batch b = lm_batch(0);
  std::vector<int64_t> labels = b.at(lm_key::labels).to_vector<int64_t>();
  for (int i = 0; i < 15; ++i) labels[static_cast<std::size_t>(i)] = -100;  // rows 0-2 ignored
  b.set(lm_key::labels, from_vector(labels, {6, 5}, {DType::i64}));
  const std::vector<MicroBatch> kept = plan_micro_batches(lm, b, 2);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].start == 3);
  CHECK(kept[0].scale == 1.0);
  b.set(lm_key::labels, full({6, 5}, -100.0, {DType::i64}));
  b.position = {1, 4};
  CHECK(test::error_of([&] { plan_micro_batches(lm, b, 2); })
            .starts_with("causal language modelling: batch 5 of epoch 2 has nothing the loss counts (every label is "
                         "ignored)"));
}

TEST_CASE("a rank's micro-batch plan: the count given, none left out, a slice that counts nothing allowed",
          "[grad_accum]") {
  // Note [Micro-batches on every rank]: every rank runs `count` forwards whatever its rows count.
  CausalLm lm;
  data::Batch b = lm_batch(0);
  std::vector<int64_t> labels = b.at(lm_key::labels).to_vector<int64_t>();
  for (int i = 0; i < 15; ++i) labels[static_cast<std::size_t>(i)] = -100;  // rows 0-2 ignored
  b.set(lm_key::labels, from_vector(labels, {6, 5}, {DType::i64}));
  const std::vector<MicroBatch> p = plan_rank_micro_batches(lm, b, 2);
  REQUIRE(p.size() == 2);
  CHECK(p[0].start == 0);
  CHECK(p[0].rows == 3);
  CHECK(p[0].scale == 0.0);
  CHECK(p[1].start == 3);
  CHECK(p[1].scale == 1.0);
  b.set(lm_key::labels, full({6, 5}, -100.0, {DType::i64}));
  const std::vector<MicroBatch> none = plan_rank_micro_batches(lm, b, 3);
  REQUIRE(none.size() == 3);
  for (const MicroBatch& m : none) CHECK(m.scale == 0.0);
  ImageClassification images;
  const std::vector<MicroBatch> two = plan_rank_micro_batches(images, image_batch(3, 1), 2);  // 3 rows, 2 parts
  REQUIRE(two.size() == 2);
  CHECK(two[0].rows == 2);
  CHECK(std::abs(two[0].scale - 2.0 / 3.0) < 1e-15);
}
