// Tensor-level entry points to the row kernels (cuda/kernels/rows.cuh): softmax, cross-entropy, layer/rms norm,
// embedding and max. They make inputs dense with the reduced dim last (permute + contiguous when needed),
// pick the device and stream, and check ids / targets with a device-side flag read back by one small copy.
// Internal to src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include <cstdint>

#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/rows.cuh"

namespace ht::cuda_ops {

// out (x's shape, contiguous) = softmax or log_softmax of x along dim d.
void softmax(kernels::SoftmaxKind kind, const Tensor& out, const Tensor& x, int d);

// The gradient (y's shape, contiguous, y's dtype) of softmax / log_softmax along dim d from g and the
// forward output y (both of y's dtype), in one row kernel.
Tensor softmax_backward(kernels::SoftmaxKind kind, const Tensor& g, const Tensor& y, int d);

// Cross-entropy forward. logits (N, C), target (N) i32/i64 on the same device; lse (N) and out ((N) for
// Reduction::none, () otherwise) contiguous of the loss dtype. Returns the number of counted rows as an
// f64 scalar on the device (the mean divides by it there: no host value per call).
// Target range check (Note [Device-side target check]): the kernel sets a flag in device memory; with
// TargetCheck::sync this function reads it back with one small copy (a host synchronisation) and throws
// naming the first bad row, with TargetCheck::deferred it folds the flag into the device's record that
// check_deferred_targets reads.
Tensor cross_entropy(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& opts);
// g_logits (N, C) in the logits dtype; g (N) or () of the loss dtype; count as returned by cross_entropy.
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const CrossEntropyOptions& opts, const Tensor& count);
void check_deferred_targets(int device);

struct NormOutputs {
  Tensor out;   // x's shape, contiguous
  Tensor mean;  // (..., 1) contiguous, loss dtype; undefined for rms_norm
  Tensor rstd;  // (..., 1) contiguous
};
// layer_norm (kind layer) or rms_norm over the last dim; weight / bias (D) may be undefined.
void norm(kernels::NormKind kind, const NormOutputs& outs, const Tensor& x, const Tensor& weight, const Tensor& bias,
          double eps);

// Which gradients a norm backward computes.
// weight_dtype / bias_dtype: the dtypes gw / gb are returned in (the parameters' own, so the op needs no
// conversion after).
struct NormGradsWanted {
  bool x = true, weight = false, bias = false;
  DType weight_dtype = DType::f32, bias_dtype = DType::f32;
};
struct NormGrads {
  Tensor gx;  // x's shape and dtype
  Tensor gw;  // (D) in want.weight_dtype, summed over rows deterministically (in f32, f64 for f64 x)
  Tensor gb;  // (D) in want.bias_dtype, likewise
};
// Backward of layer_norm (kind layer, mean defined) or rms_norm: one row kernel for gx that also writes
// per-block partial sums of gw and gb when its register-resident form applies (else a column-reduction
// kernel writes per-split partial sums), then one launch adds the partials in a fixed order and stores gw
// and gb in their dtypes. weight (D) may be undefined. With `accumulate_into` (dense, x's shape and dtype) gx is
// added into it and returned as gx (Note [Gradients accumulated in place]).
NormGrads norm_backward(kernels::NormKind kind, const Tensor& g, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const NormGradsWanted& want,
                        const Tensor& accumulate_into = Tensor());

// out (*ids.shape, D) contiguous = weight[ids]; out-of-range ids set a device flag, read back in the call
// (sync: one small copy, then throws) or folded into the deferred record (Note [Device-side target check]).
void embedding(const Tensor& out, const Tensor& weight, const Tensor& ids, TargetCheck check);
// (V, D) in `dtype`: rows of g (*ids.shape, D) summed into the rows ids pick (atomicAdd: not deterministic).
Tensor embedding_backward(const Tensor& g, const Tensor& ids, int64_t v, DType dtype);

// values (may be undefined) and indices (i64), both keepdim-shaped and contiguous: the first maximal element
// of every line of x along dim d (NaN maximal).
void max(const Tensor& values, const Tensor& indices, const Tensor& x, int d);

}  // namespace ht::cuda_ops
#endif
