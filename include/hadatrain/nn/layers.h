// Layers: thin modules over ops, with PyTorch-compatible parameter names and default initialisation.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/nn/module.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/nn_ops.h"

namespace ht::nn {

enum class Bias { yes, no };

// y = x Wᵀ + b; weight (out, in), bias (out). Default init as torch.nn.Linear.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Bias bias, Generator& gen);
  // Adopts existing tensors as the parameters: weight (out, in), bias (out) or undefined. For models that
  // initialise or load their weights themselves, and for wrappers (LoRA) that take over a layer's weight.
  Linear(Tensor weight, Tensor bias);
  std::string type_name() const override { return "Linear"; }
  Tensor forward(const Tensor& x) override;  // x (..., in) -> (..., out)
  Tensor weight, bias;
  int64_t in_features, out_features;
  PipelineBinding grad_pipeline;  // nn/pipelines.h; inactive by default (exact)
};

// Makes the Linear at full parameter-name prefix `name` (e.g. "model.layers.0.self_attn.q_proj") with the
// given features and no bias. A model built from one (models/llama.h) makes a plain Linear when it is empty;
// LoRA (nn/lora.h) makes its wrapper for the layers it targets.
using LinearFactory = std::function<std::shared_ptr<Linear>(const std::string& name, int64_t in, int64_t out)>;

struct Conv2dOptions {
  int64_t in_channels = 0, out_channels = 0;
  int64_t kernel = 3;
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  Bias bias = Bias::yes;
  ConvLayout layout = ConvLayout::nchw;  // nhwc: channels-last activations (ops/nn_ops.h); same weight
};

// x (N, C, H, W) -> (N, O, OH, OW), or with layout nhwc x (N, H, W, C) -> (N, OH, OW, O);
// weight (O, C/groups, k, k) in both. Default init as torch.nn.Conv2d.
class Conv2d : public Module {
 public:
  Conv2d(const Conv2dOptions& o, Generator& gen);
  std::string type_name() const override { return "Conv2d"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Conv2dOptions options;
  PipelineBinding grad_pipeline;  // nn/pipelines.h; inactive by default (exact through cuDNN / im2col)
};

// Batch norm over (N, C, H, W) or (N, C); buffers running_mean, running_var (f32) and num_batches_tracked (i64).
// With layout nhwc the channels are the last dim: x (N, H, W, C) is normalised as the (N·H·W, C) matrix.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  std::string type_name() const override { return "BatchNorm2d"; }
  Tensor forward(const Tensor& x) override;
  // relu(bn(x) + residual) from one fused op (batch_norm_add_relu); residual in x's layout, shape and dtype.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  double eps, momentum;
  ConvLayout layout = ConvLayout::nchw;  // nhwc: channels last (same parameters and buffers)
  // relu: forward returns relu(bn(x)) from one fused op (BatchNormOptions::activation); same state dict.
  BatchNormActivation activation = BatchNormActivation::none;
};

// Layer norm over the last dim; weight 1, bias 0.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  std::string type_name() const override { return "LayerNorm"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  double eps;
};

// What Dropout and DropPath share: the probability p in [0, 1) and the generator their masks draw from, shared
// across the model (owned by the trainer, saved in checkpoints); required unless p = 0. `what` names the module in
// the constructor's errors.
class RandomDrop : public Module {
 public:
  double p;

 protected:
  RandomDrop(const char* what, double p, std::shared_ptr<Generator> gen);
  std::shared_ptr<Generator> gen_;
};

// Inverted dropout in train mode, identity in eval mode.
class Dropout : public RandomDrop {
 public:
  Dropout(double p, std::shared_ptr<Generator> gen) : RandomDrop("Dropout", p, std::move(gen)) {}
  std::string type_name() const override { return "Dropout"; }
  Tensor forward(const Tensor& x) override;
};

// Stochastic depth ("drop path", Huang et al. 2016; timm's DropPath) on a residual branch: in train mode each
// sample's x is dropped whole with probability p, else scaled by 1/(1-p); identity in eval mode and at p = 0
// (which draws nothing). The per-sample mask is dropout of a (B, 1, ..., 1) tensor of ones in x's dtype, so it
// draws one stream of the shared generator per call (checkpointed, Note [Exact resume]) and its scale rounds as
// dropout's does.
class DropPath : public RandomDrop {
 public:
  DropPath(double p, std::shared_ptr<Generator> gen) : RandomDrop("DropPath", p, std::move(gen)) {}
  std::string type_name() const override { return "DropPath"; }
  Tensor forward(const Tensor& x) override;
};

enum class ActivationKind { relu, gelu, gelu_tanh, silu, identity };
ActivationKind activation_from_name(const std::string& name);  // relu, gelu, gelu_tanh, silu, identity

class Activation : public Module {
 public:
  explicit Activation(ActivationKind kind) : kind(kind) {}
  std::string type_name() const override { return "Activation"; }
  Tensor forward(const Tensor& x) override;
  ActivationKind kind;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(const Pool2dParams& p) : params(p) {}
  std::string type_name() const override { return "MaxPool2d"; }
  Tensor forward(const Tensor& x) override { return max_pool2d(x, params); }
  Pool2dParams params;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int64_t h, int64_t w) : out_h(h), out_w(w) {}
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, out_h, out_w); }
  int64_t out_h, out_w;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : start_dim(start_dim) {}
  std::string type_name() const override { return "Flatten"; }
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim); }
  int64_t start_dim;
};

// Children named "0", "1", ...; forward chains them.
class Sequential : public Module {
 public:
  Sequential() = default;
  std::string type_name() const override { return "Sequential"; }
  Tensor forward(const Tensor& x) override;
  void push_back(ModulePtr m);
  std::size_t size() const { return items_.size(); }
  const ModulePtr& operator[](std::size_t i) const { return items_.at(i); }

 private:
  std::vector<ModulePtr> items_;
};

// Transformer MLP with timm names: fc1 -> act -> drop -> fc2 -> drop.
class Mlp : public Module {
 public:
  Mlp(int64_t dim, int64_t hidden, ActivationKind act, double drop, Generator& init_gen,
      std::shared_ptr<Generator> dropout_gen);
  std::string type_name() const override { return "Mlp"; }
  Tensor forward(const Tensor& x) override;  // (..., dim) -> (..., dim)
  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<Activation> act;
  std::shared_ptr<Dropout> drop;
};

// Multi-head self-attention with timm names: qkv (dim -> 3 dim), proj (dim -> dim).
class SelfAttention : public Module {
 public:
  SelfAttention(int64_t dim, int64_t heads, Bias qkv_bias, double proj_drop, Generator& init_gen,
                std::shared_ptr<Generator> dropout_gen);
  std::string type_name() const override { return "SelfAttention"; }
  Tensor forward(const Tensor& x) override;  // x (B, N, dim) -> (B, N, dim)
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> proj_drop;
  int64_t dim, heads;
};

}  // namespace ht::nn
