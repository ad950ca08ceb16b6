// Launchers of the batch-norm kernels (CPU reference: src/ops/batch_norm.cpp). x is dense (N, C, S) with S
// the product of the spatial dims (S == 1: an (M, C) matrix, e.g. a channels-last activation viewed as
// (N*H*W, C), has its own coalesced kernels); statistics (mean, invstd) and backward sums are dense double
// arrays of C; weight, bias and the running stats are dense arrays of C in their own floating dtype (f32,
// f64, bf16 or f16), read (and, for the running stats, updated in place) without conversion kernels.
// Statistics and per-channel constants are computed in double; the per-element
// work in float for bf16/f16 and double for f32/f64. Channel reductions split the values over many blocks
// and add the partial sums in a fixed order: deterministic (an atomic
// ticket only picks which block adds them). The reductions take a small scratch
// buffer from the device's memory pool in `stream`'s order. Supported x dtypes: f32, f64, bf16, f16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

struct BnShape {
  int64_t N = 0, C = 0, S = 1;  // x (N, C, S)
};

// A dense per-channel array of C values in a floating dtype (f32, f64, bf16, f16), or null (absent).
struct BnParam {
  const void* data = nullptr;
  DType dtype = DType::f32;
};
// The same, written by a kernel.
struct BnParamOut {
  void* data = nullptr;
  DType dtype = DType::f32;
};

// Running statistics updated in place (train mode) in their own dtype, or null pointers for none:
//   mean = (1 - momentum) * mean + momentum * batch_mean,  var = (1 - momentum) * var + momentum * var_B * M/(M-1)
// computed in double and rounded once to the stats' dtype (as the CPU reference does).
struct BnRunning {
  void* mean = nullptr;
  void* var = nullptr;
  DType dtype = DType::f32;  // of both
  double momentum = 0.1;
  int64_t* count = nullptr;  // num_batches_tracked, incremented once per launch (by channel 0's writer)
};

// Train-mode statistics over M = N*S values per channel: mean (C), invstd (C) = 1/sqrt(var_B + eps) with the
// biased variance (one pass of shifted sums; the CPU takes two), and the running-stat update.
void launch_bn_stats(DType dt, const void* x, BnShape s, double eps, BnRunning running, double* mean, double* invstd,
                     cudaStream_t stream);
// Eval-mode statistics: mean (C) = running_mean (a snapshot in double), invstd (C) = 1/sqrt(running_var + eps).
void launch_bn_eval_stats(BnParam running_mean, BnParam running_var, int64_t C, double eps, double* mean,
                          double* invstd, cudaStream_t stream);

// Activation applied to the affine map's output (fused into the normalize kernel; its backward masks g).
// add_relu: relu(round(affine) + residual), the residual added in acc_t of the dtype and rounded, as add does.
enum class BnAct { none, relu, add_relu };

// Per-channel values of the affine map; weight / bias may be absent (1 and 0).
struct BnChannels {
  const double* mean = nullptr;
  const double* invstd = nullptr;
  BnParam weight, bias;
  BnAct act = BnAct::none;
  const void* residual = nullptr;  // (N, C, S) dense like x, in x's dtype: add_relu only
  void* residual_grad = nullptr;   // (N, C, S): the residual's gradient, written by the dx kernel (add_relu)
};
// y (N, C, S) = act((x - mean) * invstd * weight + bias), as x * scale + shift (one fma in the compute type)
// with per-channel constants, rounded to the x dtype, then the activation: relu(round(v)) == round(relu(v)).
void launch_bn_normalize(DType dt, const void* x, BnShape s, BnChannels ch, void* y, cudaStream_t stream);

// Outputs of the backward sums; any pointer may be null (not wanted).
struct BnBackwardSums {
  double* sum_g = nullptr;      // (C) sum of g'
  double* sum_gxhat = nullptr;  // (C) sum of g' * x_hat; needs x
  BnParamOut grad_weight;       // (C) sum_gxhat in the weight's dtype
  BnParamOut grad_bias;         // (C) sum_g in the bias's dtype
};
// g' = g, or with ch.act == relu g masked by (y > 0) where y is the forward output recomputed from x with
// the forward's arithmetic (x must then be given). Sums over the M rows of every channel.
void launch_bn_backward_reduce(DType dt, const void* g, const void* x, BnShape s, BnChannels ch, BnBackwardSums out,
                               cudaStream_t stream);

// The kernels: channels first (S > 1), split grids (blockIdx = (channel, split of its N*S values), per-block
// partial sums finalised by the channel's last block) whose normalize and dx kernels store 16-byte packs with
// one 16-byte store (Note [Batch-norm 16-byte stores] in cuda/kernels/batchnorm_common.cuh). Channels last
// (S == 1): normalize and dx on their own split grids; the reductions (statistics and backward sums) by channel
// count: below 128 channels the split kernels (one wave of 4 blocks a SM, 3 with a fused activation, 4 packs of
// a thread in flight, a shared-memory tree over the block's rows, partial sums added by a separate finalize
// launch); from 128 channels up the ticket kernels (Note [Batch-norm channels-last tickets] in
// cuda/kernels/batchnorm_cl2.cu: one wave of 2 blocks a SM with 8 packs of a thread in flight, warp shuffles
// then shared memory for the block's rows, and the partial rows added in two levels of atomic tickets, a fixed
// order; the split kernels when no ticket slot is free). Each is deterministic.
//
// Launches of the channels-last ticket kernels in this process (the GPU tests assert which shapes take them).
int64_t bn_cl_ticket_launches();

// (Note [Batch-norm kernels] in cuda/kernels/batchnorm.cu: the channels-first reductions are finalised by their
// last block through per-channel atomic tickets, with a separate finalize launch as the fallback; results are
// the same either way.)

enum class BnMode { train, eval };
// gx (N, C, S), with g_hat = g' * weight (g' as in launch_bn_backward_reduce) and x_hat = (x - mean) * invstd:
//   train: gx = (g_hat - w * sum_g / M - x_hat * w * sum_gxhat / M) * invstd
//   eval:  gx = g_hat * invstd          (sum_g, sum_gxhat unused; x too unless ch.act masks g)
// With ch.act == add_relu the kernel also writes ch.residual_grad = g'.
void launch_bn_backward_dx(DType dt, BnMode mode, const void* g, const void* x, BnShape s, BnChannels ch,
                           const double* sum_g, const double* sum_gxhat, void* gx, cudaStream_t stream);

}  // namespace ht::kernels
