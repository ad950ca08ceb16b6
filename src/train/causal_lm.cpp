// Causal language modelling (causal_lm.h): the next-token training loss, and evaluation by the mean loss per
// counted token and its perplexity.
#include "hadatrain/train/causal_lm.h"

#include <cmath>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::train {
namespace {

void check_ids(const Tensor& ids, const Tensor& labels) {
  HT_CHECK(ids.dim() == 2, "causal language modelling: input_ids must be (batch, tokens), got {}", ids.describe());
  HT_CHECK(labels.shape() == ids.shape(), "causal language modelling: labels {} must have the shape of input_ids {}",
           labels.describe(), ids.describe());
  HT_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
           "causal language modelling: input_ids must be i32 or i64 token ids, got {}", ids.describe());
}

// Counted targets of host labels (B, T): those not ignore_index, for same_position from t = 1 on.
int64_t counted_targets(const Tensor& labels, LmLabels layout, int64_t ignore_index) {
  const std::vector<int64_t> l = labels.to(DType::i64).to_vector<int64_t>();
  const int64_t t = labels.size(1);
  const bool skip_first = layout == LmLabels::same_position;
  int64_t n = 0;
  for (std::size_t i = 0; i < l.size(); ++i)
    if ((!skip_first || static_cast<int64_t>(i) % t != 0) && l[i] != ignore_index) ++n;
  return n;
}

// logits (B, T, V) and the next-token targets as cross_entropy's (B·T, V) and (B·T).
Tensor next_token_cross_entropy(const Tensor& logits, const Tensor& labels, LmLabels layout,
                                const CrossEntropyOptions& ce) {
  HT_CHECK(logits.dim() == 3 && logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
           "causal language modelling: the model returned {}, expected logits (batch {}, tokens {}, vocabulary)",
           logits.describe(), labels.size(0), labels.size(1));
  const int64_t rows = logits.size(0) * logits.size(1);
  const Tensor targets = layout == LmLabels::next_token ? labels : next_token_targets(labels, ce.ignore_index);
  return cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}), ce);
}

class LmEvaluator final : public Evaluator {
 public:
  LmEvaluator(LmLabels layout, int64_t ignore_index) : layout_(layout), ignore_(ignore_index) {}

  void add(nn::Module& model, const data::Batch& batch) override {
    const Tensor& ids = batch.at(lm_key::input_ids);  // (B, T)
    const Tensor& labels = batch.at(lm_key::labels);  // (B, T)
    check_ids(ids, labels);
    CrossEntropyOptions ce;
    ce.ignore_index = ignore_;
    ce.reduction = Reduction::sum;
    loss_sum_ += next_token_cross_entropy(model.forward(ids), labels, layout_, ce).item();
    tokens_ += counted_targets(labels, layout_, ignore_);
  }

  EvalResult result() const override {
    EvalResult r;
    r.loss = tokens_ ? loss_sum_ / static_cast<double>(tokens_) : 0.0;
    r.total = tokens_;
    r.score = -r.loss;
    const double ppl = std::exp(r.loss);
    r.metrics = {{"ppl", ppl}, {"tokens", tokens_}};
    r.summary = fmt::format("validation loss {:.4f}, perplexity {:.3f}", r.loss, ppl);  // the count is r.total
    return r;
  }

  std::vector<double> sums() const override { return {loss_sum_, static_cast<double>(tokens_)}; }
  void set_sums(const std::vector<double>& s) override {
    HT_ASSERT(s.size() == 2, "language-model evaluator: {} sums, expected 2", s.size());
    loss_sum_ = s[0];
    tokens_ = static_cast<int64_t>(s[1]);
  }

 private:
  LmLabels layout_;
  int64_t ignore_;
  double loss_sum_ = 0.0;
  int64_t tokens_ = 0;
};

}  // namespace

double transformer_flops_per_token(const TransformerFlopsShape& s) {
  return 6.0 * static_cast<double>(s.matmul_params) +
         12.0 * static_cast<double>(s.layers) * static_cast<double>(s.attention_dim) * static_cast<double>(s.seq_len);
}

Tensor next_token_targets(const Tensor& labels, int64_t ignore_index) {
  HT_CHECK(labels.dim() == 2, "next_token_targets: labels must be (batch, tokens), got {}", labels.describe());
  const int64_t b = labels.size(0), t = labels.size(1);
  const Tensor tail = full({b, 1}, static_cast<double>(ignore_index), {labels.dtype(), labels.device()});
  if (t == 1) return tail;
  return cat({narrow(labels, 1, 1, t - 1), tail}, 1);
}

std::vector<std::string> CausalLm::required_keys() const { return {lm_key::input_ids, lm_key::labels}; }

int64_t CausalLm::units(const data::Batch& batch) const { return batch.at(lm_key::input_ids).numel(); }

double CausalLm::loss_weight(const data::Batch& batch) const {
  return static_cast<double>(counted_targets(batch.at(lm_key::labels), o_.labels, o_.ignore_index));
}

Tensor CausalLm::loss(nn::Module& model, const data::Batch& batch) const {
  const Tensor& ids = batch.at(lm_key::input_ids);  // (B, T)
  const Tensor& labels = batch.at(lm_key::labels);  // (B, T)
  check_ids(ids, labels);
  CrossEntropyOptions ce;
  ce.ignore_index = o_.ignore_index;
  // Labels are checked on the device and read back with the losses (check_deferred): the loss never waits
  // for the device, and a step that computes it can be recorded into a step graph.
  ce.target_check = TargetCheck::deferred;
  return next_token_cross_entropy(model.forward(ids), labels, o_.labels, ce);  // logits (B, T, V)
}

void CausalLm::check_deferred(Device device) const { check_deferred_targets(device); }

std::unique_ptr<Evaluator> CausalLm::evaluator() const { return std::make_unique<LmEvaluator>(o_.labels, o_.ignore_index); }

}  // namespace ht::train
