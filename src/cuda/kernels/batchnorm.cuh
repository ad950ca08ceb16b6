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

// Channels-first (S > 1) kernel variant (Note [Batch-norm plane kernels] in cuda/kernels/batchnorm_planes.cu):
//   1 (split): blockIdx = (channel, split of its N*S values), per-block partial sums;
//   2 (planes): a warp per (n, c) plane of S contiguous values, grids of one wave striding over the planes
//     (normalize / dx from the last plane down), per-plane partial sums finalised by the channel's last warp.
//     Taken when 2048 <= N*C <= 67584 planes, S >= 32 and C <= 4096; other shapes use variant 1's kernels.
//   3 (vstore): variant 1 with the normalize and dx kernels storing 16-byte packs as one 16-byte store
//     (variant 1's bf16 / f16 stores compile to 2-byte stores); results bit-identical to variant 1. The
//     default (fastest in run 22).
// HADATRAIN_BN_CF_KERNEL = split | planes | vstore (or 1 .. 3) in the environment, read once per process, picks
// the variant (unset: 3); set_bn_cf_variant(v) overrides it (0: back to the environment; the GPU tests and
// bench_kernels run every variant). All agree within rounding (variant 2 groups the partial sums differently).
// (A variant 4 with deeper reductions, 8 packs of a thread in flight, was slower than variant 3 in run 24 and
// was deleted: forward 0.0443 against 0.0355 ms, backward 0.0599 against 0.0525 on 256x64x32x32 bf16.)
int bn_cf_variant();
void set_bn_cf_variant(int variant);
inline constexpr int kBnCfVariants = 3;
// Launches of the plane kernels in this process (the GPU tests assert that variant 2 takes them).
int64_t bn_plane_launches();

// Channels-last (S == 1) reduction variant (statistics and backward sums; Note [Batch-norm channels-last
// tickets] in cuda/kernels/batchnorm_cl2.cu; normalize and dx are the same under both):
//   1 (split): one wave of 4 (3 with a fused activation) blocks a SM, 4 packs of a thread in flight, a shared
//     memory tree over the block's rows, partial sums added by a separate finalize launch. The default below
//     128 channels.
//   2 (tickets): one wave of 2 blocks a SM with 8 packs of a thread in flight (the sums: 4 rows of g and x, 3
//     with a residual), warp shuffles then shared memory for the block's rows, and no finalize launch: the partial rows are
//     added in two levels of atomic tickets (groups of about sqrt(blocks) rows by the group's last block, then
//     the groups by the last group), a fixed order. Falls back to variant 1 without tickets. The default from
//     128 channels up (run 24: [16384, 256] with relu, forward 0.0258 against 0.0301 ms, backward 0.0395
//     against 0.0412; at 64 channels the forward is 2 % faster and the backward 4 % slower).
// HADATRAIN_BN_CL_KERNEL = split | tickets (or 1 | 2), read once per process (unset: by channel count, as
// above); set_bn_cl_variant(v) overrides it (0: back to the environment). bn_cl_variant() reports the override
// or the environment's choice (1 when unset). Both agree within rounding (different partial groupings); each is
// deterministic.
int bn_cl_variant();
void set_bn_cl_variant(int variant);
inline constexpr int kBnClVariants = 2;
// Launches of variant 2's channels-last ticket kernels in this process (the GPU tests assert that it takes them).
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
