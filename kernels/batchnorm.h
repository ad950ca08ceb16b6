// Launchers of the batch-norm kernels (CPU reference: src/ops/batch_norm.cpp). x is dense (N, C, S) with S
// the product of the spatial dims (S == 1: an (M, C) matrix, e.g. a channels-last activation viewed as
// (N*H*W, C), has its own coalesced kernels); per-channel values (statistics, weight, bias, running stats)
// are dense double arrays of C. Statistics and per-channel constants are computed in double; the per-element
// work in float for bf16/f16 and double for f32/f64. Channel reductions split the values over many blocks
// and add the partial sums in a fixed order: deterministic, no atomics. The reductions take a small scratch
// buffer from the device's memory pool in `stream`'s order. Supported x dtypes: f32, f64, bf16, f16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

struct BnShape {
  int64_t N = 0, C = 0, S = 1;  // x (N, C, S)
};

// Running statistics updated in place (train mode), or null pointers for none:
//   mean = (1 - momentum) * mean + momentum * batch_mean,  var = (1 - momentum) * var + momentum * var_B * M/(M-1)
struct BnRunning {
  double* mean = nullptr;
  double* var = nullptr;
  double momentum = 0.1;
};

// Train-mode statistics over M = N*S values per channel: mean (C), invstd (C) = 1/sqrt(var_B + eps) with the
// biased variance (one pass of shifted sums; the CPU takes two), and the running-stat update.
void launch_bn_stats(DType dt, const void* x, BnShape s, double eps, BnRunning running, double* mean, double* invstd,
                     cudaStream_t stream);
// Eval-mode invstd (C) = 1/sqrt(running_var + eps).
void launch_bn_invstd(const double* running_var, int64_t C, double eps, double* invstd, cudaStream_t stream);

// Per-channel values of the affine map; weight / bias may be null (1 and 0).
struct BnChannels {
  const double* mean = nullptr;
  const double* invstd = nullptr;
  const double* weight = nullptr;
  const double* bias = nullptr;
};
// y (N, C, S) = (x - mean) * invstd * weight + bias, as x * scale + shift with per-channel constants.
void launch_bn_normalize(DType dt, const void* x, BnShape s, BnChannels ch, void* y, cudaStream_t stream);

// sum_g (C) = sum of g; sum_gxhat (C) = sum of g * (x - mean) * invstd (skipped when x is null).
void launch_bn_backward_reduce(DType dt, const void* g, const void* x, BnShape s, BnChannels ch, double* sum_g,
                               double* sum_gxhat, cudaStream_t stream);

enum class BnMode { train, eval };
// gx (N, C, S), with g_hat = g * weight and x_hat = (x - mean) * invstd:
//   train: gx = (g_hat - w * sum_g / M - x_hat * w * sum_gxhat / M) * invstd
//   eval:  gx = g_hat * invstd          (x, sum_g, sum_gxhat unused; may be null)
void launch_bn_backward_dx(DType dt, BnMode mode, const void* g, const void* x, BnShape s, BnChannels ch,
                           const double* sum_g, const double* sum_gxhat, void* gx, cudaStream_t stream);

}  // namespace ht::kernels
