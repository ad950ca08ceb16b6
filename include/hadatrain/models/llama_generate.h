// Text generation with a Llama and its KV cache: the prompt runs once through the model, then one token at
// a time. Each new token is the greedy argmax (temperature 0) or a draw from softmax(logits / temperature)
// restricted to the top-p nucleus, with a counter-based Philox draw keyed by (seed, step), so a seed gives
// the same tokens on the CPU and on CUDA and across runs.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "hadatrain/models/llama.h"

namespace ht::models {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax); > 0: sample from softmax(logits / temperature)
  double top_p = 1.0;        // keep the smallest set of most likely tokens whose probability reaches top_p
  uint64_t seed = 0;
  // > 0: only ids below it are drawn (greedy too), e.g. the tokenizer's vocabulary when the model's embedding is
  // padded past it; 0: every id of the logits.
  int64_t vocab_limit = 0;
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  // Generation stops after emitting one of these (the emitted stop token is part of the result). Empty: the
  // model config's eos_token_ids.
  std::vector<int64_t> stop_ids;
  // The cache length (prompt + new tokens); 0: min(prompt + max_new_tokens, max_position_embeddings).
  int64_t max_length = 0;
};

// stop_token: a stop id was emitted; callback: on_token returned false; context_full: the cache is full.
enum class StopReason { stop_token, max_new_tokens, context_full, callback };

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens only
  StopReason reason = StopReason::max_new_tokens;
};

// Called with each new token as soon as it is chosen (for streaming output); return false to stop.
using TokenCallback = std::function<bool(int64_t token)>;

// The next token for one row of logits (vocab, any floating dtype, any device); `step` is the index of the
// token being drawn (0 for the first new token): the Philox counter of the draw.
int64_t sample_token(const Tensor& logits, const SamplingOptions& o, uint64_t step);

// The cache length generate uses: o.max_length, else min(prompt + max_new_tokens, max_position_embeddings).
// Throws ht::Error for what generate refuses, so that a caller can check before it prints or loads anything: an
// empty prompt, prompt ids outside [0, vocab_size), a prompt longer than the cache, max_new_tokens < 0, and
// sampling options out of range (temperature not finite or < 0, top_p outside (0, 1], vocab_limit outside
// [0, vocab_size]).
int64_t check_generate_inputs(const LlamaConfig& config, const std::vector<int64_t>& prompt,
                              const GenerateOptions& o);

// Generates from `prompt` (token ids, at least one) in eval mode without gradients, after
// check_generate_inputs; the model's config bounds the cache.
GenerateResult generate(Llama& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
                        const TokenCallback& on_token = {});

}  // namespace ht::models
