// The causal-LM task (train/causal_lm.h): next-token targets, the training loss against a hand computation
// with ignored labels, the counted-token weight, evaluation (mean loss per token, perplexity), the FLOPs count.
#include "support/catch.h"
#include "support/testing.h"
#include "support/tiny_lm.h"

#include <cmath>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/train/causal_lm.h"

using namespace ht;
using namespace ht::train;

namespace {

constexpr int64_t kVocab = 7, kDim = 4;

data::Batch lm_batch(std::vector<int64_t> ids, std::vector<int64_t> labels, int64_t rows) {
  const int64_t t = static_cast<int64_t>(ids.size()) / rows;
  data::Batch b;
  b.set(lm_key::input_ids, from_vector(ids, {rows, t}, {DType::i64}));
  b.set(lm_key::labels, from_vector(labels, {rows, t}, {DType::i64}));
  return b;
}

// Sum over counted positions of -log softmax(logits[b, t])[labels[b, t + 1]], in double from the logits.
std::pair<double, int64_t> reference_loss(const Tensor& logits, const std::vector<int64_t>& labels, int64_t rows) {
  const std::vector<double> l = logits.to(DType::f64).to_vector<double>();
  const int64_t t = static_cast<int64_t>(labels.size()) / rows;
  double total = 0;
  int64_t n = 0;
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t p = 0; p + 1 < t; ++p) {
      const int64_t y = labels[static_cast<std::size_t>(b * t + p + 1)];
      if (y == -100) continue;
      const double* row = l.data() + (b * t + p) * kVocab;
      double mx = row[0];
      for (int64_t v = 1; v < kVocab; ++v) mx = std::max(mx, row[v]);
      double s = 0;
      for (int64_t v = 0; v < kVocab; ++v) s += std::exp(row[v] - mx);
      total += std::log(s) + mx - row[y];
      ++n;
    }
  return {total, n};
}

}  // namespace

TEST_CASE("next_token_targets shifts labels left and ignores the last position", "[causal_lm]") {
  const Tensor labels = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, -100, 6, 0}, {2, 4}, {DType::i64});
  CHECK(next_token_targets(labels).to_vector<int64_t>() == std::vector<int64_t>{2, 3, 4, -100, -100, 6, 0, -100});
  const Tensor one = from_vector(std::vector<int64_t>{9, 8}, {2, 1}, {DType::i64});
  CHECK(next_token_targets(one, -1).to_vector<int64_t>() == std::vector<int64_t>{-1, -1});
}

TEST_CASE("the causal-LM loss is the mean next-token cross-entropy over labelled tokens", "[causal_lm]") {
  Generator init(3);
  test::TinyLm model(kVocab, kDim, init, std::make_shared<Generator>(1));
  model.to(DType::f64);
  // Row 0: a prompt of two ignored tokens; row 1: every label counted.
  const std::vector<int64_t> ids{1, 2, 3, 4, 5, 6, 0, 1, 2, 3};
  const std::vector<int64_t> labels{-100, -100, 3, 4, 5, 6, 0, 1, 2, 3};
  const data::Batch batch = lm_batch(ids, labels, 2);
  CausalLm task;
  task.check_batch(batch);
  CHECK(task.units(batch) == 10);
  CHECK(task.loss_weight(batch) == 7.0);  // row 0: 3 of its 4 targets (the first is ignored); row 1: 4
  const Tensor loss = task.loss(model, batch);
  CHECK(loss.dtype() == DType::f64);
  const auto [sum, n] = reference_loss(model.forward(batch.at(lm_key::input_ids)), labels, 2);
  REQUIRE(n == 7);
  CHECK(std::abs(loss.item() - sum / 7.0) < 1e-12);
  loss.backward();
  CHECK(model.embed.grad().defined());
  CHECK(model.fc->weight.grad().defined());

  // The evaluator: mean loss per counted token and its exponential, over two batches of different counts.
  const data::Batch second = lm_batch({4, 4, 1}, {4, -100, 1}, 1);
  const auto [sum2, n2] = reference_loss(model.forward(second.at(lm_key::input_ids)), {4, -100, 1}, 1);
  REQUIRE(n2 == 1);
  NoGradGuard no_grad;
  const auto ev = task.evaluator();
  ev->add(model, batch);
  ev->add(model, second);
  const EvalResult r = ev->result();
  CHECK(r.total == 8);
  CHECK(r.count("tokens") == 8);
  CHECK(std::abs(r.loss - (sum + sum2) / 8.0) < 1e-12);
  CHECK(std::abs(r.number("ppl") - std::exp(r.loss)) < 1e-9);
  CHECK(r.score == -r.loss);
  CHECK(r.summary.find("perplexity") != std::string::npos);
}

TEST_CASE("next-token labels score the logits at t against labels[t]", "[causal_lm]") {
  Generator init(3);
  test::TinyLm model(kVocab, kDim, init, std::make_shared<Generator>(1));
  model.to(DType::f64);
  const std::vector<int64_t> ids{1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> same{-100, 2, 3, -100, 5, 6};  // Hugging Face layout
  const std::vector<int64_t> next{2, 3, -100, 5, 6, -100};  // the same targets, next-token layout
  CausalLm hf;
  CausalLm nt({.labels = LmLabels::next_token});
  const data::Batch a = lm_batch(ids, same, 2), b = lm_batch(ids, next, 2);
  CHECK(hf.loss_weight(a) == 4.0);
  CHECK(nt.loss_weight(b) == 4.0);
  CHECK(hf.loss(model, a).item() == nt.loss(model, b).item());
  NoGradGuard no_grad;
  const auto ea = hf.evaluator(), eb = nt.evaluator();
  ea->add(model, a);
  eb->add(model, b);
  CHECK(ea->result().loss == eb->result().loss);
  CHECK(eb->result().total == 4);
}

TEST_CASE("the causal-LM task names what is wrong with a batch", "[causal_lm]") {
  Generator init(3);
  test::TinyLm model(kVocab, kDim, init, std::make_shared<Generator>(1));
  CausalLm task;
  data::Batch only_ids;
  only_ids.set(lm_key::input_ids, from_vector(std::vector<int64_t>{1, 2}, {1, 2}, {DType::i64}));
  CHECK(test::error_of([&] { task.check_batch(only_ids); }).find("has no labels") != std::string::npos);
  data::Batch mismatched = only_ids;
  mismatched.set(lm_key::labels, from_vector(std::vector<int64_t>{1, 2, 3}, {1, 3}, {DType::i64}));
  CHECK(test::error_of([&] { (void)task.loss(model, mismatched); }).find("must have the shape of input_ids") !=
        std::string::npos);
  // A label beyond the vocabulary is named by cross_entropy (the CPU checks in the call).
  const data::Batch bad = lm_batch({1, 2, 3}, {1, 2, kVocab + 3}, 1);
  CHECK(test::error_of([&] { (void)task.loss(model, bad); }).find("out of range") != std::string::npos);
}

TEST_CASE("training FLOPs per token: 6 N plus the attention products", "[causal_lm]") {
  // 6 * 1000 + 12 * 2 layers * 64 * 128 tokens
  CHECK(transformer_flops_per_token({.matmul_params = 1000, .layers = 2, .attention_dim = 64, .seq_len = 128}) ==
        6000.0 + 12.0 * 2 * 64 * 128);
  CausalLm task({.flops_per_token = 5.0});
  CHECK(task.flops_per_unit() == 5.0);
  CHECK(task.unit() == "tok");
  CHECK(task.score_name() == "neg_loss");
}
