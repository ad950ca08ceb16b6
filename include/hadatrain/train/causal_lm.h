// Causal language modelling: a model maps token ids input_ids (B, T) to logits (B, T, V); training minimises
// the next-token cross-entropy against labels (B, T), in f32 whatever the logits' dtype. Two label layouts
// (LmLabels): Hugging Face's, where labels[b, t] is the token at position t (usually input_ids[b, t], or -100
// where the loss ignores it, e.g. prompt tokens of instruction data) and the logits at position t are scored
// against labels[b, t + 1] (the last position predicts nothing); and next-token labels, where labels[b, t] is
// already the token after input_ids[b, t] (a packed window of T + 1 tokens gives T targets). Evaluation
// reports the mean loss per counted token and its perplexity, exp(loss); the best checkpoint is the one with
// the lowest loss.
//
//   CausalLm task({.flops_per_token = transformer_flops_per_token(shape)});
//   Tensor loss = task.loss(model, batch.to(device));   // scalar f32, recordable in a CUDA graph
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hadatrain/train/task.h"

namespace ht::train {

// The batch keys of language-model data (data/text*.h writes them).
namespace lm_key {
inline constexpr const char* input_ids = "input_ids";  // (B, T) i32 or i64
inline constexpr const char* labels = "labels";        // (B, T) i32 or i64; ignore_index where no loss
}  // namespace lm_key

enum class LmLabels {
  same_position,  // Hugging Face: the logits at t are scored against labels[t + 1]
  next_token,     // the logits at t are scored against labels[t]
};

struct CausalLmOptions {
  LmLabels labels = LmLabels::same_position;
  int64_t ignore_index = -100;  // labels equal to it contribute nothing and are not counted
  // Training FLOPs per token of the model (transformer_flops_per_token), for the model FLOPs utilisation of
  // the training log; 0 when unknown (no utilisation is logged).
  double flops_per_token = 0.0;
};

// The shape of a decoder-only transformer as far as its FLOPs go.
struct TransformerFlopsShape {
  int64_t matmul_params = 0;  // parameters that enter a matrix product (all but an untied input embedding)
  int64_t layers = 0;
  int64_t attention_dim = 0;  // query heads × head dim
  int64_t seq_len = 0;        // tokens per sequence
};

// Training FLOPs per token: 6·N (2·N forward, 4·N backward for the N parameters that enter a product) plus
// 12·L·d·T for the attention products QKᵀ and PV over the full T×T square (forward and backward), the
// convention of PaLM's appendix B and nanoGPT's MFU estimate (the causal half is not subtracted).
double transformer_flops_per_token(const TransformerFlopsShape& s);

// The next-token targets of labels (B, T): targets[b, t] = labels[b, t + 1], and ignore_index at t = T - 1.
// Same dtype and device as labels; no host read.
Tensor next_token_targets(const Tensor& labels, int64_t ignore_index = -100);

class CausalLm final : public Task {
 public:
  explicit CausalLm(CausalLmOptions o = {}) : o_(o) {}
  std::string name() const override { return "causal language modelling"; }
  std::vector<std::string> required_keys() const override;
  std::string unit() const override { return "tok"; }
  // Tokens fed to the model: B·T of input_ids.
  int64_t units(const data::Batch& batch) const override;
  // The tokens the loss of `batch` is a mean over: next-token targets that are not ignore_index.
  double loss_weight(const data::Batch& batch) const override;
  double flops_per_unit() const override { return o_.flops_per_token; }
  // Mean next-token cross-entropy over the counted targets, f32 (f64 for an f64 model).
  Tensor loss(nn::Module& model, const data::Batch& batch) const override;
  // Labels out of the vocabulary on CUDA (cross_entropy's TargetCheck::deferred).
  void check_deferred(Device device) const override;
  // Metrics, in record order: ppl (exp of the mean loss per token), tokens (counted targets). Score: the
  // negated mean loss ("neg_loss"), so the best checkpoint has the lowest validation loss.
  std::unique_ptr<Evaluator> evaluator() const override;
  std::string score_name() const override { return "neg_loss"; }
  double initial_score() const override { return -std::numeric_limits<double>::max(); }

 private:
  CausalLmOptions o_;
};

}  // namespace ht::train
