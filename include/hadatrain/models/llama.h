// LLaMA as Hugging Face transformers' LlamaForCausalLM computes it: token embedding, pre-norm decoder blocks
// (RMSNorm -> grouped-query self-attention with rotary embeddings -> residual; RMSNorm -> SwiGLU MLP ->
// residual), a final RMSNorm and the LM head (or the embedding itself when tie_word_embeddings).
// Parameter names are exactly HF's ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...), so HF
// checkpoints map 1:1 (models/hf_checkpoint.h) and gradient pipelines, LoRA and freezing select layers by them.
// The formats and the maths: reference/data-formats.md §6.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/nn/layers.h"

namespace ht::models {

// Every LlamaConfig key of HF's config.json that changes what the model computes, plus the token ids and
// the storage dtype it records. Names are HF's.
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // GQA: query head h uses kv head h / (heads / kv_heads)
  int64_t head_dim = 0;              // 0: hidden_size / num_attention_heads (HF's default)
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // type none, or llama3 with its four numbers
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;
  std::vector<int64_t> eos_token_ids{2};  // config.json's eos_token_id: one id or a list
  std::optional<int64_t> pad_token_id;
  double initializer_range = 0.02;  // std of the normal init of every Linear and the embedding (HF's)
  DType dtype = DType::f32;         // config.json's torch_dtype / dtype: the dtype the weights are stored in

  // The head dim in use (head_dim, or hidden_size / num_attention_heads when 0).
  int64_t resolved_head_dim() const;
  // Throws ht::Error naming `where` (a file or "LlamaConfig") and the key when a value is out of range or
  // inconsistent (heads not a multiple of kv heads, odd head dim, ...).
  void validate(const std::string& where = "LlamaConfig") const;
  // Parameter count (the embedding counted once when tied).
  int64_t num_parameters() const;

  // Reads an HF config.json object; `file` names the source in errors. Unknown keys are ignored (HF configs
  // carry many that do not change the computation); a present key of the wrong type, a hidden_act other
  // than silu, attention_bias/mlp_bias true, a rope_scaling type other than llama3 and missing required keys
  // are errors naming the file and the key.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& file);
  static LlamaConfig load(const std::filesystem::path& config_json);
  // The config.json object transformers reads (architectures, model_type, torch_dtype and dtype, ...).
  nlohmann::json to_json() const;

  // Presets. tiny: 2 layers, hidden 64, 4 heads, 2 kv heads, vocab 128 (tests). sotu_small: ~30M parameters
  // for the Llama-2 32000-token vocabulary (hidden 384, 8 layers, 6 heads, 2 kv heads, context 512, tied).
  // llama32_1b: Llama-3.2-1B's shape. llama3_8b: Llama-3-8B's shape (Llama 3.1 rope scaling).
  static LlamaConfig tiny();
  static LlamaConfig sotu_small();
  static LlamaConfig llama32_1b();
  static LlamaConfig llama3_8b();
  // One of the presets by name (tiny, sotu_small, llama32_1b, llama3_8b); an error listing them otherwise.
  static LlamaConfig preset(const std::string& name);
};

// How a Llama makes its Linears (nn/layers.h); empty: plain nn::Linear.
using LinearFactory = nn::LinearFactory;

// How the weights start: init draws HF's init (normal(0, initializer_range) for Linears and the embedding,
// ones for norms) from `gen`; none leaves the matrices uninitialised, for a caller that loads every weight
// next (an HF checkpoint), which saves the time of drawing billions of numbers.
enum class LlamaInit { normal, none };

struct LlamaBuild {
  LlamaInit init = LlamaInit::normal;
  Generator* gen = nullptr;  // required for LlamaInit::normal
  LinearFactory make_linear;  // empty: plain nn::Linear
  DType master_dtype = DType::f32;  // the parameters' dtype (f32 master weights; f64 for golden tests)
};

// The per-layer key/value cache for generation: keys[i] and values[i] are (B, n_kv_heads, capacity,
// head_dim) in the compute dtype; positions [0, length) hold the tokens seen so far. Made by
// Llama::make_kv_cache; forward(ids, &cache, offset) writes positions [offset, offset + T) and sets length.
struct KvCache {
  std::vector<Tensor> keys, values;
  int64_t batch = 0, capacity = 0, length = 0;
};

// What a block needs besides its input: where the tokens sit and, in generation, the cache layer.
struct LlamaBlockContext {
  int64_t position_offset = 0;  // position of the first token of x
  KvCache* cache = nullptr;     // null: attend over x only (training, full-sequence evaluation)
};

class LlamaRMSNorm : public nn::Module {
 public:
  LlamaRMSNorm(int64_t dim, double eps, DType dtype);
  std::string type_name() const override { return "LlamaRMSNorm"; }
  // x (..., dim) in any floating dtype -> same shape and dtype; statistics in fp32 (f64 for f64), the scale
  // multiplied in before the one rounding to x's dtype.
  Tensor forward(const Tensor& x) override;
  Tensor weight;
  double eps;
};

class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(const LlamaConfig& c, int64_t layer, const std::string& prefix, const LinearFactory& make);
  std::string type_name() const override { return "LlamaAttention"; }
  using nn::Module::forward;  // the single-input call throws: attention needs the context
  Tensor forward(const Tensor& x, const LlamaBlockContext& ctx);  // (B, T, H) -> (B, T, H)
  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  int64_t layer_, heads_, kv_heads_, head_dim_;
  RopeParams rope_;
};

class LlamaMlp : public nn::Module {
 public:
  LlamaMlp(const LlamaConfig& c, const std::string& prefix, const LinearFactory& make);
  std::string type_name() const override { return "LlamaMLP"; }
  Tensor forward(const Tensor& x) override;  // down(silu(gate(x)) * up(x)): (B, T, H) -> (B, T, H)
  std::shared_ptr<nn::Linear> gate_proj, up_proj, down_proj;
};

// One decoder layer, "model.layers.{i}": the unit activation checkpointing and FSDP wrap.
class LlamaBlock : public nn::Module {
 public:
  LlamaBlock(const LlamaConfig& c, int64_t layer, const LinearFactory& make);
  std::string type_name() const override { return "LlamaDecoderLayer"; }
  // h = x + attn(norm(x)); out = h + mlp(norm(h)). x (B, T, H) in the compute dtype.
  Tensor forward(const Tensor& x, const LlamaBlockContext& ctx);
  Tensor forward(const Tensor& x) override { return forward(x, LlamaBlockContext{}); }
  std::shared_ptr<LlamaRMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMlp> mlp;
  int64_t layer;
};

// Runs one block for Llama::forward: the place where activation checkpointing wraps a block (the default
// calls block.forward(x, ctx)).
using LlamaBlockRunner = std::function<Tensor(LlamaBlock& block, const Tensor& x, const LlamaBlockContext& ctx)>;

class Llama : public nn::Module {
 public:
  Llama(const LlamaConfig& config, const LlamaBuild& build);
  std::string type_name() const override { return "LlamaForCausalLM"; }

  // ids (B, T) i32/i64 -> logits (B, T, vocab) in the compute dtype; positions 0..T-1.
  Tensor forward(const Tensor& ids) override;
  // With a cache: ids are the tokens at positions [offset, offset + T); keys and values of every layer are
  // written into the cache there and attention covers positions [0, offset + T). Inference only (no grad).
  Tensor forward(const Tensor& ids, KvCache* cache, int64_t position_offset);
  // The pieces of forward, for callers that run the blocks themselves: ids -> (B, T, H) embeddings in the
  // compute dtype; final (B, T, H) hidden states -> logits.
  Tensor embed(const Tensor& ids);
  Tensor head(const Tensor& hidden);

  // An empty cache for `batch` sequences of up to `capacity` tokens, in the compute dtype, on the
  // parameters' device.
  KvCache make_kv_cache(int64_t batch, int64_t capacity);

  // The dtype the forward computes in: compute_dtype when set (bf16 on GPU runs), else the parameters' dtype.
  DType forward_dtype() const;

  const std::vector<std::shared_ptr<LlamaBlock>>& blocks() const { return blocks_; }
  LlamaConfig config;
  std::optional<DType> compute_dtype;
  LlamaBlockRunner block_runner;  // empty: block.forward(x, ctx)

  // Module "model" holding embed_tokens, layers and norm; lm_head is absent when tied.
  Tensor& embed_weight();
  std::shared_ptr<nn::Linear> lm_head;

 private:
  Tensor run(const Tensor& ids, KvCache* cache, int64_t position_offset);
  std::shared_ptr<nn::Module> model_, embed_tokens_;
  std::shared_ptr<LlamaRMSNorm> norm_;
  std::vector<std::shared_ptr<LlamaBlock>> blocks_;
  Tensor* embed_weight_ = nullptr;
};

}  // namespace ht::models
