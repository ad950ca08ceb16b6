// LLaMA modules and forward (models/llama.h). Shapes: B batch, T new tokens, S = offset + T attended
// positions, H hidden, nh / nkv query / key-value heads, hd head dim, V vocabulary, I MLP width.
// The compute dtype (Llama::forward_dtype) is the embedding's materialised dtype; every Linear materialises
// its weight in its input's dtype, and norms multiply in their master (f32) scale before the one rounding.
#include "hadatrain/models/llama.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/capture.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/nn/init.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::models {
namespace {

std::shared_ptr<nn::Linear> plain_linear(const std::string&, int64_t in, int64_t out) {
  return std::make_shared<nn::Linear>(empty({out, in}), Tensor());
}

// A container whose children are named "0", "1", ... (HF's nn.ModuleList).
class ModuleList : public nn::Module {
 public:
  std::string type_name() const override { return "ModuleList"; }
  void add(const std::shared_ptr<nn::Module>& m) { register_module(std::to_string(size_++), m); }

 private:
  int64_t size_ = 0;
};

// "model.embed_tokens": weight (V, H).
class Embedding : public nn::Module {
 public:
  Embedding(int64_t vocab, int64_t dim) : weight(empty({vocab, dim})) { register_parameter("weight", &weight); }
  std::string type_name() const override { return "Embedding"; }
  // Rows are gathered from the master (f32) table and the (B, T, H) result is cast: the same values as casting
  // the table first, without converting all V rows every step, and the table's gradient accumulates in f32.
  Tensor lookup(const Tensor& ids, DType dtype) const {
    // While a step graph records, the id range check is deferred to the trainer's next
    // check_deferred_targets (a read-back cannot be recorded); otherwise it throws here.
    const Tensor rows =
        embedding(materialise(weight), ids, step_capture_active() ? TargetCheck::deferred : TargetCheck::sync);
    return rows.dtype() == dtype ? rows : to_dtype(rows, dtype);
  }
  Tensor matrix(DType dtype) const { return materialise(weight, dtype); }
  Tensor weight;
};

// "model": embed_tokens, layers, norm.
class LlamaModel : public nn::Module {
 public:
  std::string type_name() const override { return "LlamaModel"; }
  using nn::Module::register_module;
};

}  // namespace

LlamaRMSNorm::LlamaRMSNorm(int64_t dim, double eps_, DType dtype) : weight(ones({dim}, {dtype})), eps(eps_) {
  register_parameter("weight", &weight);
}

Tensor LlamaRMSNorm::forward(const Tensor& x) { return rms_norm(x, materialise(weight), eps); }

LlamaAttention::LlamaAttention(const LlamaConfig& c, int64_t layer, const std::string& prefix,
                               const LinearFactory& make)
    : layer_(layer), heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.resolved_head_dim()) {
  const int64_t H = c.hidden_size;
  q_proj = register_module("q_proj", make(prefix + ".q_proj", H, heads_ * head_dim_));
  k_proj = register_module("k_proj", make(prefix + ".k_proj", H, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", make(prefix + ".v_proj", H, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", make(prefix + ".o_proj", heads_ * head_dim_, H));
  rope_.theta = c.rope_theta;
  rope_.style = RopeStyle::rotate_half;
  rope_.scaling = c.rope_scaling;
}

Tensor LlamaAttention::forward(const Tensor& x, const LlamaBlockContext& ctx) {
  const int64_t B = x.size(0), T = x.size(1);
  RopeParams rope = rope_;
  rope.position_offset = ctx.position_offset;
  // (B, T, n*hd) -> (B, n, T, hd) views; the rotation writes contiguous (B, n, T, hd) tensors.
  auto heads = [&](const Tensor& y, int64_t n) { return reshape(y, {B, T, n, head_dim_}).transpose(1, 2); };
  Tensor yq, yk, yv;
  {
    const grad::SharedInputScope shared;  // the three read x (Note [Shared product inputs] in grad/pipeline.h)
    yq = q_proj->forward(x);
    yk = k_proj->forward(x);
    yv = v_proj->forward(x);
  }
  Tensor q = rotary_embedding(heads(yq, heads_), rope);     // (B, nh, T, hd)
  Tensor k = rotary_embedding(heads(yk, kv_heads_), rope);  // (B, nkv, T, hd)
  Tensor v = heads(yv, kv_heads_);                          // (B, nkv, T, hd)
  AttentionOptions ao;
  ao.mask = AttnMask::causal;
  if (ctx.cache != nullptr) {
    KvCache& cache = *ctx.cache;
    const int64_t end = ctx.position_offset + T;
    HT_CHECK(end <= cache.capacity, "Llama: positions up to {} do not fit the KV cache of {} positions", end,
             cache.capacity);
    HT_CHECK(ctx.position_offset <= cache.length,
             "Llama: position offset {} leaves a gap after the {} cached positions", ctx.position_offset, cache.length);
    const Tensor& kc = cache.keys.at(static_cast<std::size_t>(layer_));    // (B, nkv, capacity, hd)
    const Tensor& vc = cache.values.at(static_cast<std::size_t>(layer_));  // (B, nkv, capacity, hd)
    copy_(narrow(kc, 2, ctx.position_offset, T), k);
    copy_(narrow(vc, 2, ctx.position_offset, T), v);
    k = narrow(kc, 2, 0, end);  // (B, nkv, S, hd); causal aligns the T queries to the last T keys
    v = narrow(vc, 2, 0, end);
  }
  const Tensor o = scaled_dot_product_attention(q, k, v, ao);  // (B, nh, T, hd)
  return o_proj->forward(reshape(o.transpose(1, 2), {B, T, heads_ * head_dim_}));
}

LlamaMlp::LlamaMlp(const LlamaConfig& c, const std::string& prefix, const LinearFactory& make) {
  gate_proj = register_module("gate_proj", make(prefix + ".gate_proj", c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", make(prefix + ".up_proj", c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", make(prefix + ".down_proj", c.intermediate_size, c.hidden_size));
}

Tensor LlamaMlp::forward(const Tensor& x) {
  Tensor gate, up;  // (B, T, I)
  {
    const grad::SharedInputScope shared;  // both read x (Note [Shared product inputs] in grad/pipeline.h)
    gate = gate_proj->forward(x);
    up = up_proj->forward(x);
  }
  // silu(gate) * up as one fused op on CUDA (ops/nn_ops.h swiglu)
  return down_proj->forward(swiglu(gate, up));
}

LlamaBlock::LlamaBlock(const LlamaConfig& c, int64_t layer_, const LinearFactory& make) : layer(layer_) {
  const std::string prefix = "model.layers." + std::to_string(layer);
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c, layer, prefix + ".self_attn", make));
  mlp = register_module("mlp", std::make_shared<LlamaMlp>(c, prefix + ".mlp", make));
  input_layernorm = register_module("input_layernorm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps,
                                                                                      DType::f32));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps, DType::f32));
}

Tensor LlamaBlock::forward(const Tensor& x, const LlamaBlockContext& ctx) {
  const Tensor h = add(x, self_attn->forward(input_layernorm->forward(x), ctx));  // (B, T, H)
  return add(h, mlp->forward(post_attention_layernorm->forward(h)));
}

Llama::Llama(const LlamaConfig& c, const LlamaBuild& build) : config(c) {
  c.validate();
  HT_CHECK(build.init == LlamaInit::none || build.gen != nullptr,
           "Llama: LlamaInit::normal needs a generator (LlamaBuild::gen)");
  HT_CHECK(is_floating(build.master_dtype), "Llama: master_dtype must be floating, got {}",
           dtype_name(build.master_dtype));
  const LinearFactory make = build.make_linear ? build.make_linear : LinearFactory(plain_linear);
  auto model = std::make_shared<LlamaModel>();
  auto embed = std::make_shared<Embedding>(c.vocab_size, c.hidden_size);
  embed_weight_ = &embed->weight;
  model->register_module("embed_tokens", embed);
  auto layers = std::make_shared<ModuleList>();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto b = std::make_shared<LlamaBlock>(c, i, make);
    layers->add(b);
    blocks_.push_back(b);
  }
  model->register_module("layers", layers);
  norm_ = model->register_module("norm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps, DType::f32));
  model_ = register_module("model", std::shared_ptr<nn::Module>(model));
  embed_tokens_ = embed;
  if (!c.tie_word_embeddings) lm_head = register_module("lm_head", make("lm_head", c.hidden_size, c.vocab_size));

  if (build.init == LlamaInit::normal) {
    // HF's _init_weights: normal(0, initializer_range) for every Linear weight and the embedding; norms 1.
    // The projections the model made (not the adapters inside LoRA layers) are drawn in module order.
    nn::init::normal_(embed->weight, 0.0, c.initializer_range, *build.gen);
    for (auto& b : blocks_)
      for (nn::Linear* l : {b->self_attn->q_proj.get(), b->self_attn->k_proj.get(), b->self_attn->v_proj.get(),
                            b->self_attn->o_proj.get(), b->mlp->gate_proj.get(), b->mlp->up_proj.get(),
                            b->mlp->down_proj.get()})
        nn::init::normal_(l->weight, 0.0, c.initializer_range, *build.gen);
    if (lm_head) nn::init::normal_(lm_head->weight, 0.0, c.initializer_range, *build.gen);
  }
  if (build.master_dtype != DType::f32) {
    // Parameters frozen by the factory (LoRA's base weights) stay frozen through the conversion.
    std::vector<Tensor*> frozen;
    for (auto& [name, t] : named_parameters())
      if (!t->requires_grad()) frozen.push_back(t);
    to(build.master_dtype);
    for (Tensor* t : frozen) t->set_requires_grad(false);
  }
}

Tensor& Llama::embed_weight() { return *embed_weight_; }

DType Llama::forward_dtype() const { return compute_dtype ? *compute_dtype : embed_weight_->dtype(); }

Tensor Llama::embed(const Tensor& ids) {
  HT_CHECK(ids.dim() == 2 && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64),
           "Llama: expected token ids (B, T) of dtype i32 or i64, got {}", ids.describe());
  return static_cast<Embedding&>(*embed_tokens_).lookup(ids, forward_dtype());  // (B, T, H)
}

Tensor Llama::head(const Tensor& hidden) {
  const Tensor n = norm_->forward(hidden);  // (B, T, H)
  if (lm_head) return lm_head->forward(n);   // (B, T, V)
  return linear(n, static_cast<Embedding&>(*embed_tokens_).matrix(n.dtype()));
}

Tensor Llama::run(const Tensor& ids, KvCache* cache, int64_t position_offset) {
  Tensor h = embed(ids);  // (B, T, H)
  const LlamaBlockContext ctx{position_offset, cache};
  for (auto& b : blocks_) h = block_runner ? block_runner(*b, h, ctx) : b->forward(h, ctx);
  if (cache != nullptr) cache->length = position_offset + ids.size(1);
  return head(h);
}

Tensor Llama::forward(const Tensor& ids) { return run(ids, nullptr, 0); }

Tensor Llama::forward(const Tensor& ids, KvCache* cache, int64_t position_offset) {
  if (cache == nullptr) {
    HT_CHECK(position_offset == 0, "Llama: a position offset ({}) needs a KV cache", position_offset);
    return run(ids, nullptr, 0);
  }
  HT_CHECK(!grad_enabled(), "Llama: forward with a KV cache is for inference; run it under NoGradGuard");
  HT_CHECK(ids.dim() == 2 && ids.size(0) == cache->batch, "Llama: ids {} do not match the KV cache's batch of {}",
           ids.describe(), cache->batch);
  HT_CHECK(static_cast<int64_t>(cache->keys.size()) == config.num_hidden_layers,
           "Llama: the KV cache has {} layers, the model {}", cache->keys.size(), config.num_hidden_layers);
  return run(ids, cache, position_offset);
}

KvCache Llama::make_kv_cache(int64_t batch, int64_t capacity) {
  HT_CHECK(batch > 0 && capacity > 0, "Llama: a KV cache needs batch > 0 and capacity > 0, got {} and {}", batch,
           capacity);
  KvCache c;
  c.batch = batch;
  c.capacity = capacity;
  const TensorOptions o{forward_dtype(), embed_weight_->device()};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    // (B, nkv, capacity, hd) each; zeros so that no position is ever read uninitialised
    c.keys.push_back(zeros({batch, config.num_key_value_heads, capacity, config.resolved_head_dim()}, o));
    c.values.push_back(zeros({batch, config.num_key_value_heads, capacity, config.resolved_head_dim()}, o));
  }
  return c;
}

}  // namespace ht::models
