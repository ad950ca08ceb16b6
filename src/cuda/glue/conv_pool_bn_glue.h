// Tensor-level CUDA entry points of conv2d (cuDNN), the 2-D pools and batch norm (cuda/kernels/pool*.cu,
// cuda/kernels/batchnorm*.cu). Internal to src/ops; CUDA builds only. The op files check shapes and dtypes and
// allocate outputs; these functions make inputs dense, pick the device and stream and launch.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/cuda/cudnn.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/pool.cuh"

namespace ht::cuda_ops {

// ---- conv2d (p.dtype, sizes, params and format filled by the op; tensors on one CUDA device) ----
// Activations are (N, C, H, W) for p.format nchw and (N, H, W, C) for nhwc (channels last); the weight and
// its gradient are (O, C/groups, KH, KW) in both.
// The dense filter cuDNN reads, from the weight w (any strides and floating dtype): w itself when already
// dense in p.dtype, else a copy; for nhwc the (O, KH, KW, C/groups) (KRSC) permuted copy. The op makes it
// once in forward and keeps it for backward data.
Tensor conv2d_filter(const cuda::ConvProblem& p, const Tensor& w);
// out (N, O, OH, OW) or nhwc (N, OH, OW, O), contiguous = conv(x, filter) [+ bias (O)]; x of any strides.
void conv2d_forward(const cuda::ConvProblem& p, const Tensor& x, const Tensor& filter, const Tensor& bias,
                    const Tensor& out);
// gx (N, C, H, W) or nhwc (N, H, W, C), contiguous, from g (output layout) and the filter; with `accumulate`
// the result is added into gx (one rounding where cuDNN takes beta = 1, else a separate add).
void conv2d_backward_data(const cuda::ConvProblem& p, const Tensor& g, const Tensor& filter, const Tensor& gx,
                          bool accumulate = false);
// gw (O, C/groups, KH, KW) from x and g: contiguous for nchw; for nhwc the view of the (O, KH, KW, C/groups)
// gradient cuDNN writes (where no NHWC algorithm exists, contiguous through NCHW buffers).
Tensor conv2d_backward_filter(const cuda::ConvProblem& p, const Tensor& x, const Tensor& g);

// ---- pools (shape and layout filled by the op) ----
// Outputs (out, indices, gx) are allocated by the op in s.layout: dense NCHW, or NHWC buffers viewed as
// (N, C, H, W). With nchw x may have any strides; with nhwc x is channels-last dense (the op's choice).
// grad_out and saved indices of any strides are made dense in s.layout first (no copy when they are).
// indices (i32) may be undefined in max_pool2d: a forward no backward needs writes none.
void max_pool2d(const Tensor& x, const kernels::PoolShape& s, const Tensor& out, const Tensor& indices);
void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const kernels::PoolShape& s, const Tensor& gx);
void avg_pool2d(kernels::AvgKind kind, const Tensor& x, const kernels::PoolShape& s, const Tensor& out);
void avg_pool2d_backward(kernels::AvgKind kind, const Tensor& grad_out, const kernels::PoolShape& s, const Tensor& gx);

// ---- batch norm ----
struct BnStats {
  Tensor mean;    // (C) f64: batch mean (train) or a snapshot of the running mean (eval)
  Tensor invstd;  // (C) f64
};
// out (N, C, ...) contiguous = act(bn(x) [+ residual]) with opts.activation (residual: x's shape and dtype, or
// undefined; relu with it); running stats are updated in place on the
// device in train mode. Weight, bias and running stats are read in their own dtype (no conversion kernels when
// they are dense f32/f64/bf16/f16), x is used as is when dense.
BnStats batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, const BatchNormOptions& opts, const Tensor& residual,
                           const Tensor& out);
// What the normalisation pass reads besides x: the statistics (the BnStats the forward returned), the affine
// parameters and the residual (each undefined when absent), and the activation.
struct BnApply {
  BnStats stats;
  Tensor weight, bias;
  BatchNormActivation activation = BatchNormActivation::none;
  Tensor residual;
};
// The normalisation pass of batch_norm_forward alone: out = act(bn(x) [+ residual]). The same kernels on the same
// inputs, so it rebuilds the forward's output bit for bit (Note [Rebuilt inputs]).
void batch_norm_apply(const Tensor& x, const BnApply& p, const Tensor& out);

struct BnBackwardArgs {
  BatchNormMode mode = BatchNormMode::train;
  Tensor x;       // (N, C, ...) saved input; undefined when no formula needs it (eval dx, bias only)
  Tensor mean;    // (C), defined with x
  Tensor invstd;  // (C)
  Tensor weight;  // (C) or undefined (no affine)
  Tensor bias;    // (C) or undefined; only read with a fused activation (its mask needs the forward's shift)
  BatchNormActivation activation = BatchNormActivation::none;  // with relu, x and mean are defined
  Tensor residual;  // (N, C, ...) the residual added before the relu (batch_norm_add_relu), or undefined
  DType x_dtype = DType::f32, weight_dtype = DType::f32, bias_dtype = DType::f32;
  Shape x_shape;
};
struct BnGrads {
  Tensor gx, gw, gb, gr;  // gr: the residual's
};
// Gradients the caller needs (need[0..3]: x, weight, bias, residual), undefined otherwise.
BnGrads batch_norm_backward(const Tensor& g, const BnBackwardArgs& a, const std::array<bool, 4>& need);

}  // namespace ht::cuda_ops
#endif
