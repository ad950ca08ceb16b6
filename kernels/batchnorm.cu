// Batch-norm kernels: train statistics with the running-stat update, eval invstd, normalise + affine, and
// the backward (per-channel sums of g and g * x_hat, then dx). Formulas and double precision follow the
// CPU reference (src/ops/batch_norm.cpp) and its op-based backward node.
#include "kernels/batchnorm.h"
#include "kernels/convert.cuh"
#include "kernels/launch.h"

namespace ht::kernels {
namespace {

constexpr int kStatBlock = 512;

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ double block_sum(double v) {
  __shared__ double partial[32];
  __shared__ double total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // partial/total may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// Offset of the i-th of channel c's M = N*S values in x (N, C, S).
HT_DEV int64_t channel_offset(const BnShape& s, int64_t c, int64_t i) {
  const int64_t n = i / s.S;
  return (n * s.C + c) * s.S + (i - n * s.S);
}

// One block per channel.
template <class T>
__global__ void bn_stats_kernel(const T* __restrict__ x, BnShape s, double eps, BnRunning running,
                                double* __restrict__ mean, double* __restrict__ invstd) {
  const int64_t c = blockIdx.x, M = s.N * s.S;
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < M; i += blockDim.x) acc += to_double(x[channel_offset(s, c, i)]);
  const double mu = block_sum(acc) / static_cast<double>(M);
  acc = 0.0;
  for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
    const double d = to_double(x[channel_offset(s, c, i)]) - mu;
    acc += d * d;
  }
  const double var = block_sum(acc) / static_cast<double>(M);  // biased
  if (threadIdx.x == 0) {
    mean[c] = mu;
    invstd[c] = 1.0 / sqrt(var + eps);
    if (running.mean) {
      const double m = running.momentum, unbias = static_cast<double>(M) / static_cast<double>(M - 1);
      running.mean[c] = (1.0 - m) * running.mean[c] + m * mu;
      running.var[c] = (1.0 - m) * running.var[c] + m * var * unbias;
    }
  }
}

__global__ void bn_invstd_kernel(const double* __restrict__ running_var, int64_t C, double eps,
                                 double* __restrict__ invstd) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x)
    invstd[c] = 1.0 / sqrt(running_var[c] + eps);
}

template <class T>
__global__ void bn_normalize_kernel(const T* __restrict__ x, BnShape s, BnChannels ch, T* __restrict__ y) {
  const int64_t total = s.N * s.C * s.S;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = (i / s.S) % s.C;
    const double w = ch.weight ? ch.weight[c] : 1.0, b = ch.bias ? ch.bias[c] : 0.0;
    y[i] = convert<T>((to_double(x[i]) - ch.mean[c]) * ch.invstd[c] * w + b);
  }
}

// One block per channel.
template <class T>
__global__ void bn_backward_reduce_kernel(const T* __restrict__ g, const T* __restrict__ x, BnShape s, BnChannels ch,
                                          double* __restrict__ sum_g, double* __restrict__ sum_gxhat) {
  const int64_t c = blockIdx.x, M = s.N * s.S;
  const double mu = x ? ch.mean[c] : 0.0, is = x ? ch.invstd[c] : 0.0;
  double ag = 0.0, agx = 0.0;
  for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
    const int64_t o = channel_offset(s, c, i);
    const double gv = to_double(g[o]);
    ag += gv;
    if (x) agx += gv * ((to_double(x[o]) - mu) * is);
  }
  ag = block_sum(ag);
  agx = block_sum(agx);
  if (threadIdx.x == 0) {
    sum_g[c] = ag;
    if (x) sum_gxhat[c] = agx;
  }
}

template <class T>
__global__ void bn_backward_dx_kernel(BnMode mode, const T* __restrict__ g, const T* __restrict__ x, BnShape s,
                                      BnChannels ch, const double* __restrict__ sum_g,
                                      const double* __restrict__ sum_gxhat, T* __restrict__ gx) {
  const int64_t total = s.N * s.C * s.S;
  const double inv_m = 1.0 / static_cast<double>(s.N * s.S);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = (i / s.S) % s.C;
    const double w = ch.weight ? ch.weight[c] : 1.0;
    const double g_hat = to_double(g[i]) * w;
    double r;
    if (mode == BnMode::train) {
      const double x_hat = (to_double(x[i]) - ch.mean[c]) * ch.invstd[c];
      r = (g_hat - w * sum_g[c] * inv_m - x_hat * (w * sum_gxhat[c] * inv_m)) * ch.invstd[c];
    } else {
      r = g_hat * ch.invstd[c];
    }
    gx[i] = convert<T>(r);
  }
}

unsigned channel_grid(int64_t C) { return static_cast<unsigned>(C); }

}  // namespace

void launch_bn_stats(DType dt, const void* x, BnShape s, double eps, BnRunning running, double* mean, double* invstd,
                     cudaStream_t stream) {
  if (s.C == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        bn_stats_kernel<T><<<channel_grid(s.C), kStatBlock, 0, stream>>>(static_cast<const T*>(x), s, eps, running,
                                                                         mean, invstd);
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm stats", dt);
  HT_CHECK_LAUNCH("batch_norm stats");
}

void launch_bn_invstd(const double* running_var, int64_t C, double eps, double* invstd, cudaStream_t stream) {
  if (C == 0) return;
  bn_invstd_kernel<<<cuda::grid_for(C), cuda::kBlock, 0, stream>>>(running_var, C, eps, invstd);
  HT_CHECK_LAUNCH("batch_norm invstd");
}

void launch_bn_normalize(DType dt, const void* x, BnShape s, BnChannels ch, void* y, cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.S;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        bn_normalize_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), s, ch,
                                                                                   static_cast<T*>(y));
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm", dt);
  HT_CHECK_LAUNCH("batch_norm");
}

void launch_bn_backward_reduce(DType dt, const void* g, const void* x, BnShape s, BnChannels ch, double* sum_g,
                               double* sum_gxhat, cudaStream_t stream) {
  if (s.C == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        bn_backward_reduce_kernel<T><<<channel_grid(s.C), kStatBlock, 0, stream>>>(
            static_cast<const T*>(g), static_cast<const T*>(x), s, ch, sum_g, sum_gxhat);
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm backward", dt);
  HT_CHECK_LAUNCH("batch_norm backward reduce");
}

void launch_bn_backward_dx(DType dt, BnMode mode, const void* g, const void* x, BnShape s, BnChannels ch,
                           const double* sum_g, const double* sum_gxhat, void* gx, cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.S;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        bn_backward_dx_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(
            mode, static_cast<const T*>(g), static_cast<const T*>(x), s, ch, sum_g, sum_gxhat, static_cast<T*>(gx));
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm backward", dt);
  HT_CHECK_LAUNCH("batch_norm backward dx");
}

}  // namespace ht::kernels
