// Generation with the KV cache (models/llama_generate.h). Sampling runs on the host over one row of f64
// logits (its first vocab_limit entries when that is set): greedy is the first maximal index; otherwise
// probabilities p = softmax(logits / temperature), the nucleus is the smallest prefix of tokens sorted by
// decreasing p (ties by id) whose mass reaches top_p, and the token is the first in that order whose cumulative
// mass exceeds u * mass(nucleus), u uniform from Philox(seed, stream 0, element step).
#include "hadatrain/models/llama_generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::models {

namespace {

void check_sampling(const SamplingOptions& o, int64_t vocab, const char* where) {
  HT_CHECK(o.temperature >= 0.0 && std::isfinite(o.temperature), "{}: temperature must be a finite number >= 0, "
           "got {}", where, o.temperature);
  HT_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, "{}: top_p must be in (0, 1], got {}", where, o.top_p);
  HT_CHECK(o.vocab_limit >= 0 && o.vocab_limit <= vocab, "{}: vocab_limit must be in [0, {}] (the vocabulary), "
           "got {}", where, vocab, o.vocab_limit);
}

}  // namespace

int64_t sample_token(const Tensor& logits, const SamplingOptions& o, uint64_t step) {
  HT_CHECK(logits.dim() == 1 && logits.numel() > 0 && is_floating(logits.dtype()),
           "sample_token: expected one row of floating logits (vocab), got {}", logits.describe());
  check_sampling(o, logits.numel(), "sample_token");
  std::vector<double> l = logits.to_vector<double>();
  if (o.vocab_limit > 0) l.resize(static_cast<std::size_t>(o.vocab_limit));  // ids past it are never drawn
  for (double v : l) HT_CHECK(!std::isnan(v), "sample_token: the logits hold NaN");
  const auto best = std::max_element(l.begin(), l.end());  // the first maximal index
  if (o.temperature == 0.0) return static_cast<int64_t>(best - l.begin());
  std::vector<double> p(l.size());
  double total = 0.0;
  for (std::size_t i = 0; i < l.size(); ++i) total += p[i] = std::exp((l[i] - *best) / o.temperature);
  std::vector<int64_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)];
  });
  std::size_t keep = 0;
  double mass = 0.0;
  while (keep < order.size() && (keep == 0 || mass < o.top_p * total)) mass += p[static_cast<std::size_t>(order[keep++])];
  const double u = uniform_from_word(philox_word(o.seed, 0, step));
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[static_cast<std::size_t>(order[i])];
    if (acc > u * mass) return order[i];
  }
  return order[keep - 1];
}

int64_t check_generate_inputs(const LlamaConfig& c, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  HT_CHECK(!prompt.empty(), "generate: the prompt is empty (it needs at least one token, e.g. BOS {})",
           c.bos_token_id);
  HT_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}", o.max_new_tokens);
  HT_CHECK(o.max_length >= 0, "generate: max_length must be >= 0, got {}", o.max_length);
  check_sampling(o.sampling, c.vocab_size, "generate");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    HT_CHECK(prompt[i] >= 0 && prompt[i] < c.vocab_size,
             "generate: prompt token {} at position {} is outside the vocabulary [0, {})", prompt[i], i, c.vocab_size);
  const int64_t P = static_cast<int64_t>(prompt.size());
  // P + max_new_tokens without overflow: a larger request is bounded by the positions anyway.
  const int64_t wanted = o.max_new_tokens > c.max_position_embeddings - P ? c.max_position_embeddings
                                                                          : P + o.max_new_tokens;
  const int64_t capacity = o.max_length > 0 ? o.max_length : std::min(wanted, c.max_position_embeddings);
  HT_CHECK(P <= capacity, "generate: the prompt has {} tokens, more than the {} positions available{}", P, capacity,
           o.max_length > 0 ? " (max_length)" : " (the model's max_position_embeddings)");
  return capacity;
}

GenerateResult generate(Llama& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
                        const TokenCallback& on_token) {
  const LlamaConfig& c = model.config;
  const int64_t capacity = check_generate_inputs(c, prompt, o);
  const int64_t P = static_cast<int64_t>(prompt.size());
  const std::vector<int64_t>& stops = o.stop_ids.empty() ? c.eos_token_ids : o.stop_ids;

  NoGradGuard ng;
  model.eval();
  const Device dev = model.embed_weight().device();
  KvCache cache = model.make_kv_cache(1, capacity);
  GenerateResult r;
  Tensor logits = model.forward(from_vector(prompt, {1, P}, {DType::i64, dev}), &cache, 0);  // (1, P, V)
  int64_t pos = P;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const Tensor last = select(select(logits, 0, 0), 0, logits.size(1) - 1);  // (V)
    const int64_t token = sample_token(last, o.sampling, static_cast<uint64_t>(step));
    r.tokens.push_back(token);
    const bool go_on = !on_token || on_token(token);
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      r.reason = StopReason::stop_token;
      return r;
    }
    if (!go_on) {
      r.reason = StopReason::callback;
      return r;
    }
    if (step + 1 == o.max_new_tokens) break;
    if (pos >= capacity) {
      r.reason = StopReason::context_full;
      return r;
    }
    logits = model.forward(from_vector(std::vector<int64_t>{token}, {1, 1}, {DType::i64, dev}), &cache, pos);
    ++pos;
  }
  r.reason = StopReason::max_new_tokens;
  return r;
}

}  // namespace ht::models
