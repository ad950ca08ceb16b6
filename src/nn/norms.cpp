// BatchNorm2d and LayerNorm modules.
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::nn {

BatchNorm2d::BatchNorm2d(int64_t channels, double eps_, double momentum_) : eps(eps_), momentum(momentum_) {
  HT_CHECK(channels > 0, "BatchNorm2d: channels must be positive, got {}", channels);
  weight = ones({channels});
  bias = zeros({channels});
  running_mean = zeros({channels});
  running_var = ones({channels});
  num_batches_tracked = zeros({}, {DType::i64});
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
  register_buffer("running_mean", &running_mean);
  register_buffer("running_var", &running_var);
  register_buffer("num_batches_tracked", &num_batches_tracked);
}

namespace {

BatchNormOptions bn_options(const BatchNorm2d& m) {
  BatchNormOptions o;
  o.mode = m.is_training() ? BatchNormMode::train : BatchNormMode::eval;
  o.momentum = m.momentum;
  o.eps = m.eps;
  o.activation = m.activation;
  if (o.mode == BatchNormMode::train) o.num_batches_tracked = m.num_batches_tracked;  // counted by the op
  return o;
}

}  // namespace

Tensor BatchNorm2d::forward(const Tensor& x) {
  const BatchNormOptions o = bn_options(*this);
  // The scale and shift in their master dtype (Note [Materialising parameters]).
  const Tensor w = materialise(weight), b = materialise(bias);
  if (layout == ConvLayout::nchw) return batch_norm(x, w, b, running_mean, running_var, o);
  // Channels last: (N, H, W, C) -> (N·H·W, C) -> batch_norm over the rows -> back.
  const int64_t C = w.size(0);
  HT_CHECK(x.dim() >= 2 && x.size(-1) == C, "BatchNorm2d({}) with layout nhwc: expected x (N, H, W, {}), got {}", C,
           C, x.describe());
  return reshape(batch_norm(reshape(x, {-1, C}), w, b, running_mean, running_var, o), x.shape());
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  const BatchNormOptions o = bn_options(*this);
  const BatchNormParams p{materialise(weight), materialise(bias), running_mean, running_var};
  if (layout == ConvLayout::nchw) return batch_norm_add_relu(x, residual, p, o);
  const int64_t C = p.weight.size(0);
  HT_CHECK(x.dim() >= 2 && x.size(-1) == C, "BatchNorm2d({}) with layout nhwc: expected x (N, H, W, {}), got {}", C,
           C, x.describe());
  HT_CHECK(residual.shape() == x.shape(), "BatchNorm2d::forward_add_relu: residual {} must have x's shape {}",
           residual.describe(), x.describe());
  return reshape(batch_norm_add_relu(reshape(x, {-1, C}), reshape(residual, {-1, C}), p, o), x.shape());
}

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  HT_CHECK(dim > 0, "LayerNorm: dim must be positive, got {}", dim);
  weight = ones({dim});
  bias = zeros({dim});
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, materialise(weight), materialise(bias), eps); }

}  // namespace ht::nn
