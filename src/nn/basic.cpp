// Small modules: Dropout, DropPath, Activation, Sequential, and the transformer Mlp / SelfAttention blocks.
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::nn {

RandomDrop::RandomDrop(const char* what, double p_, std::shared_ptr<Generator> gen) : p(p_), gen_(std::move(gen)) {
  HT_CHECK(p >= 0.0 && p < 1.0, "{}: p must be in [0, 1), got {}", what, p);
  HT_CHECK(p == 0.0 || gen_ != nullptr, "{} with p = {} needs a generator", what, p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  return dropout(x, p, *gen_);
}

Tensor DropPath::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  HT_CHECK(x.dim() >= 1, "DropPath: expected a batch of samples (B, ...), got {}", x.describe());
  Shape mask_shape;
  mask_shape.resize(x.dim(), 1);
  mask_shape[0] = x.size(0);
  const Tensor mask = dropout(ones(mask_shape, {x.dtype(), x.device()}), p, *gen_);  // 0 or 1/(1-p), per sample
  return mul(x, mask);
}

ActivationKind activation_from_name(const std::string& name) {
  if (name == "relu") return ActivationKind::relu;
  if (name == "gelu") return ActivationKind::gelu;
  if (name == "gelu_tanh") return ActivationKind::gelu_tanh;
  if (name == "silu") return ActivationKind::silu;
  if (name == "identity") return ActivationKind::identity;
  HT_FAIL("unknown activation '{}': expected relu, gelu, gelu_tanh, silu or identity", name);
}

Tensor Activation::forward(const Tensor& x) {
  switch (kind) {
    case ActivationKind::relu: return relu(x);
    case ActivationKind::gelu: return gelu(x, GeluApprox::none);
    case ActivationKind::gelu_tanh: return gelu(x, GeluApprox::tanh);
    case ActivationKind::silu: return silu(x);
    case ActivationKind::identity: return x;
  }
  return x;
}

void Sequential::push_back(ModulePtr m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : items_) y = m->forward(y);
  return y;
}

Mlp::Mlp(int64_t dim, int64_t hidden, ActivationKind a, double p, Generator& init_gen,
         std::shared_ptr<Generator> dropout_gen) {
  fc1 = register_module("fc1", std::make_shared<Linear>(dim, hidden, Bias::yes, init_gen));
  act = register_module("act", std::make_shared<Activation>(a));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, dim, Bias::yes, init_gen));
  drop = register_module("drop", std::make_shared<Dropout>(p, std::move(dropout_gen)));
}

Tensor Mlp::forward(const Tensor& x) { return drop->forward(fc2->forward(drop->forward(act->forward(fc1->forward(x))))); }

SelfAttention::SelfAttention(int64_t dim_, int64_t heads_, Bias qkv_bias, double p, Generator& init_gen,
                             std::shared_ptr<Generator> dropout_gen)
    : dim(dim_), heads(heads_) {
  HT_CHECK(heads > 0 && dim % heads == 0, "SelfAttention: dim {} must be divisible by heads {}", dim, heads);
  qkv = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, qkv_bias, init_gen));
  proj = register_module("proj", std::make_shared<Linear>(dim, dim, Bias::yes, init_gen));
  proj_drop = register_module("proj_drop", std::make_shared<Dropout>(p, std::move(dropout_gen)));
}

Tensor SelfAttention::forward(const Tensor& x) {
  HT_CHECK(x.dim() == 3 && x.size(2) == dim, "SelfAttention: expected (B, N, {}), got {}", dim, x.describe());
  // (B, N, 3 dim) [q | k | v] -> (B, N, dim): heads split and merged without copies on the fused CUDA path
  const Tensor merged = attention_qkv_packed(qkv->forward(x), heads);
  return proj_drop->forward(proj->forward(merged));
}

}  // namespace ht::nn
