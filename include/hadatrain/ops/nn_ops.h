// Neural-network ops: softmax family, cross-entropy, embedding, norms, convolution, pooling, dropout,
// rotary embedding and scaled-dot-product attention. Each is differentiable.
#pragma once
#include <cstdint>
#include <vector>

#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/tensor.h"

namespace ht {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { none, mean, sum };
// When an out-of-range target (not in [0, C) and not ignore_index) is reported on CUDA, where the targets
// are checked on the device: `sync` reads the check back in the call (one host synchronisation per call)
// and throws there naming the row; `deferred` keeps the first failure in a per-device record that
// check_deferred_targets() reads (the trainer does at every loss read), so the call never waits for the
// device and can be recorded into a step graph. The CPU always checks in the call.
enum class TargetCheck { sync, deferred };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;  // targets equal to this contribute nothing (and are not counted by mean)
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::mean;
  TargetCheck target_check = TargetCheck::sync;
};
// logits (N, C) floating, target (N) integer class ids. Loss in fp32 (f64 for f64 logits).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts = {});
// Throws ht::Error when a cross_entropy call (an out-of-range target) or an embedding call (an out-of-range
// id) with TargetCheck::deferred on `device` failed its check since the last check (then clears the record).
// Synchronises with the device; no-op on the CPU.
void check_deferred_targets(Device device);

// weight (V, D), ids of any shape (i32/i64) -> (*ids.shape, D). Out-of-range ids throw: in the call, or on
// CUDA with TargetCheck::deferred at the next check_deferred_targets (as cross_entropy's targets, so a
// step that embeds token ids can be recorded into a graph).
Tensor embedding(const Tensor& weight, const Tensor& ids, TargetCheck check = TargetCheck::sync);

// Normalises over the last dim (size D); weight and bias (D) may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

enum class BatchNormMode { train, eval };
// Activation fused into batch_norm: relu gives exactly relu(batch_norm(x, ...)) (forward and gradients) in
// one pass over x, and its backward masks g inside the batch-norm backward.
enum class BatchNormActivation { none, relu };
struct BatchNormOptions {
  BatchNormMode mode = BatchNormMode::train;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch (unbiased var)
  double eps = 1e-5;
  BatchNormActivation activation = BatchNormActivation::none;
  // Train mode: a one-element i64 counter on x's device (BatchNorm2d's num_batches_tracked) that the forward
  // increments by one; on CUDA the statistics kernel does it, so the count costs no launch. Undefined: none.
  Tensor num_batches_tracked;
};
// x (N, C, ...) ; weight/bias (C) may be undefined; running_mean/var (C) f32, updated in place in train mode.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& opts = {});
// The per-channel tensors of batch_norm (each may be undefined as there).
struct BatchNormParams {
  Tensor weight, bias, running_mean, running_var;
};
// relu(batch_norm(x, ...) + residual) exactly, in one op (the end of a ResNet block): residual has x's shape
// and dtype and gets the gradient g masked by (out > 0). opts.activation is taken as relu.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const BatchNormParams& p,
                           const BatchNormOptions& opts = {});

// Memory layout of conv2d's activations. nhwc ("channels last") tensors are plain contiguous tensors with the
// logical shape (N, H, W, C); the weight is (O, C/groups, KH, KW) in both layouts (as in PyTorch state dicts).
enum class ConvLayout { nchw, nhwc };

struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  ConvLayout layout = ConvLayout::nchw;
};
// nchw: x (N, C, H, W), weight (O, C/groups, KH, KW), bias (O) or undefined -> (N, O, OH, OW).
// nhwc: x (N, H, W, C), same weight and bias -> (N, OH, OW, O).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p = {});
// The gradient of conv2d's input for an output gradient g ((N, O, OH, OW); nhwc: (N, OH, OW, O), any strides)
// and the weight, outside autograd (the result records no node): (N, C, H, W) (nhwc: (N, H, W, C)),
// contiguous, g's dtype; height and width are the input's (strides > 1 leave them ambiguous). The same
// computation as conv2d's backward: cuDNN backward data on CUDA, col2im of Wᵀ·g on the CPU.
Tensor conv2d_input_grad(const Tensor& g, const Tensor& weight, int64_t height, int64_t width,
                         const Conv2dParams& p = {});
// The gradient of conv2d's weight for the input x and an output gradient g (both in the layout, any strides,
// the same floating dtype), outside autograd: (O, C/groups, KH, KW) in g's dtype. The same computation as
// conv2d's backward: cuDNN backward filter on CUDA (f32 accumulation), g·im2col(x)ᵀ on the CPU.
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& g, int64_t kernel_h, int64_t kernel_w,
                          const Conv2dParams& p = {});

struct Pool2dParams {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
};
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);  // padding counts in the divisor (PyTorch default)
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);

// Inverted dropout: keeps element i when uniform(philox(seed, stream, i)) >= p and scales by 1/(1-p).
// Draws a fresh stream from `gen` (Generator::draw: keyed by the training step on the trainer's generator).
// p = 0 returns x.
Tensor dropout(const Tensor& x, double p, Generator& gen);

// SwiGLU's gated product silu(gate) * up (broadcasting like mul): on CUDA, for one shape and dtype, one fused
// kernel forward and one backward with the bits of the two ops (src/ops/swiglu.cpp).
Tensor swiglu(const Tensor& gate, const Tensor& up);

enum class RopeStyle { rotate_half, interleaved };  // HF rotate-half pairs (i, i+D/2); llama2.c pairs (2i, 2i+1)
// Frequency scaling of the rotary angles. llama3 is Hugging Face's "rope_type": "llama3" (Llama 3.1/3.2):
// with wavelength w_j = 2 pi / inv_freq[j], low = original_max / low_freq_factor, high = original_max /
// high_freq_factor: w_j < high keeps inv_freq[j], w_j > low divides it by factor, and in between it is
// (1 - s) inv_freq[j] / factor + s inv_freq[j] with s = (original_max / w_j - low_freq_factor) /
// (high_freq_factor - low_freq_factor).
enum class RopeScalingType { none, llama3 };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};
struct RopeParams {
  double theta = 10000.0;
  int64_t position_offset = 0;
  RopeStyle style = RopeStyle::rotate_half;
  RopeScaling scaling = {};
};
// x (B, H, T, D) with even D: rotates position t = offset + index along dim 2.
Tensor rotary_embedding(const Tensor& x, const RopeParams& p = {});
// The D/2 angular frequencies rotary_embedding uses for head dim D (theta^(-2j/D), then p.scaling), in double.
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t head_dim);

enum class AttnMask { none, causal };
struct AttentionOptions {
  AttnMask mask = AttnMask::none;
  double scale = 0.0;  // 0 means 1/sqrt(D)
};
// q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), Hq a multiple of Hkv (grouped KV heads).
// Causal masks position s > t + (S - T) (queries aligned to the end of the keys).
// Any strides: on CUDA the fused kernels read views whose D is contiguous and whose rows start on 16-byte
// boundaries in place (e.g. transpose(1, 2) of a (B, T, H, D) tensor); other layouts are copied first.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& opts = {});

// Self-attention on a packed projection: qkv (B, N, 3 dim) laid out [q | k | v], each part (H, D) with
// dim = heads * D  ->  (B, N, dim) laid out (B, N, H, D). Equals scaled_dot_product_attention of the
// (B, H, N, D) views of the three parts, transposed back to (B, N, dim); on CUDA with the fused kernels it
// copies nothing and its backward writes one (B, N, 3 dim) gradient (src/ops/attention_qkv_packed.cpp).
Tensor attention_qkv_packed(const Tensor& qkv, int64_t heads, const AttentionOptions& opts = {});

}  // namespace ht
