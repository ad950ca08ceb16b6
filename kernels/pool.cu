// 2-D pooling kernels: max (with argmax indices), fixed-window and adaptive average, forward and backward.
// The formulas are the CPU reference's (src/ops/pool.cpp), read side by side: windows clipped to the
// unpadded input, sums in double in the CPU's order, so forward and backward results are bit-identical to
// the CPU. Backward is a gather (one thread per input element over the outputs whose windows can hold it):
// deterministic, no atomics.
#include "kernels/convert.cuh"
#include "kernels/launch.h"
#include "kernels/pool.h"

namespace ht::kernels {
namespace {

// The rows [h0, h1) x cols [w0, w1) of the input that output (oh, ow) reads, and the averaging divisor.
struct Window {
  int64_t h0, h1, w0, w1;
  double divisor;
};

HT_DEV Window window_at(const PoolShape& s, AvgKind kind, int64_t oh, int64_t ow) {
  if (kind == AvgKind::adaptive) {
    // start = floor(i * in / out), end = ceil((i + 1) * in / out)
    const int64_t h0 = oh * s.H / s.OH, h1 = ((oh + 1) * s.H + s.OH - 1) / s.OH;
    const int64_t w0 = ow * s.W / s.OW, w1 = ((ow + 1) * s.W + s.OW - 1) / s.OW;
    return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
  }
  const int64_t hs = oh * s.sh - s.ph, ws = ow * s.sw - s.pw;
  return {hs > 0 ? hs : 0, hs + s.kh < s.H ? hs + s.kh : s.H, ws > 0 ? ws : 0, ws + s.kw < s.W ? ws + s.kw : s.W,
          static_cast<double>(s.kh * s.kw)};
}

// Outputs [lo, hi] along one axis whose window can hold input position i (exact for both kinds; callers
// still test the window, which costs nothing and keeps the two rules in one place).
struct Range {
  int64_t lo, hi;
};
HT_DEV Range fixed_range(int64_t i, int k, int s, int p, int64_t out) {
  const int64_t a = i + p - k + 1;  // first output: ceil(a / s), clamped at 0
  const int64_t lo = a <= 0 ? 0 : (a + s - 1) / s;
  const int64_t hi_raw = (i + p) / s;
  return {lo, hi_raw < out - 1 ? hi_raw : out - 1};
}
HT_DEV Range adaptive_range(int64_t i, int64_t in, int64_t out) {
  const int64_t lo = i * out / in, hi = ((i + 1) * out + in - 1) / in - 1;
  return {lo, hi < out - 1 ? hi : out - 1};
}

template <class T>
__global__ void max_pool_kernel(const T* __restrict__ x, PoolStrides xs, PoolShape s, T* __restrict__ out,
                                int64_t* __restrict__ indices) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = i % s.OW, oh = (i / s.OW) % s.OH, c = (i / (s.OW * s.OH)) % s.C, n = i / (s.OW * s.OH * s.C);
    const T* plane = x + n * xs.n + c * xs.c;
    const Window w = window_at(s, AvgKind::fixed, oh, ow);
    // Padding is -inf: only real elements are visited; first maximal element wins ties, the first NaN wins.
    T best = plane[w.h0 * xs.h + w.w0 * xs.w];
    double best_v = to_double(best);
    int64_t best_i = w.h0 * s.W + w.w0;
    for (int64_t h = w.h0; h < w.h1; ++h)
      for (int64_t v = w.w0; v < w.w1; ++v) {
        const T e = plane[h * xs.h + v * xs.w];
        const double ev = to_double(e);
        if (ev > best_v || (ev != ev && best_v == best_v)) {
          best = e;
          best_v = ev;
          best_i = h * s.W + v;
        }
      }
    out[i] = best;
    indices[i] = best_i;
  }
}

template <class T>
__global__ void max_pool_backward_kernel(const T* __restrict__ g, const int64_t* __restrict__ indices, PoolShape s,
                                         T* __restrict__ gx) {
  const int64_t total = s.N * s.C * s.H * s.W;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % s.W, h = (i / s.W) % s.H, plane = i / (s.W * s.H);
    const int64_t self = h * s.W + w;
    const Range rh = fixed_range(h, s.kh, s.sh, s.ph, s.OH), rw = fixed_range(w, s.kw, s.sw, s.pw, s.OW);
    const T* gp = g + plane * s.OH * s.OW;
    const int64_t* ip = indices + plane * s.OH * s.OW;
    double acc = 0.0;
    for (int64_t oh = rh.lo; oh <= rh.hi; ++oh)
      for (int64_t ow = rw.lo; ow <= rw.hi; ++ow)
        if (ip[oh * s.OW + ow] == self) acc += to_double(gp[oh * s.OW + ow]);
    gx[i] = convert<T>(acc);
  }
}

template <class T>
__global__ void avg_pool_kernel(const T* __restrict__ x, PoolStrides xs, PoolShape s, AvgKind kind,
                                T* __restrict__ out) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = i % s.OW, oh = (i / s.OW) % s.OH, c = (i / (s.OW * s.OH)) % s.C, n = i / (s.OW * s.OH * s.C);
    const T* plane = x + n * xs.n + c * xs.c;
    const Window w = window_at(s, kind, oh, ow);
    double acc = 0.0;
    for (int64_t h = w.h0; h < w.h1; ++h)
      for (int64_t v = w.w0; v < w.w1; ++v) acc += to_double(plane[h * xs.h + v * xs.w]);
    out[i] = convert<T>(acc / w.divisor);
  }
}

template <class T>
__global__ void avg_pool_backward_kernel(const T* __restrict__ g, PoolShape s, AvgKind kind, T* __restrict__ gx) {
  const int64_t total = s.N * s.C * s.H * s.W;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % s.W, h = (i / s.W) % s.H, plane = i / (s.W * s.H);
    const bool adaptive = kind == AvgKind::adaptive;
    const Range rh = adaptive ? adaptive_range(h, s.H, s.OH) : fixed_range(h, s.kh, s.sh, s.ph, s.OH);
    const Range rw = adaptive ? adaptive_range(w, s.W, s.OW) : fixed_range(w, s.kw, s.sw, s.pw, s.OW);
    const T* gp = g + plane * s.OH * s.OW;
    double acc = 0.0;
    for (int64_t oh = rh.lo; oh <= rh.hi; ++oh)
      for (int64_t ow = rw.lo; ow <= rw.hi; ++ow) {
        const Window win = window_at(s, kind, oh, ow);
        if (h >= win.h0 && h < win.h1 && w >= win.w0 && w < win.w1) acc += to_double(gp[oh * s.OW + ow]) / win.divisor;
      }
    gx[i] = convert<T>(acc);
  }
}

}  // namespace

void launch_max_pool2d(DType dt, const void* x, PoolStrides xs, const PoolShape& s, void* out, int64_t* indices,
                       cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        max_pool_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), xs, s,
                                                                               static_cast<T*>(out), indices);
      }))
    HT_UNSUPPORTED_DTYPE("max_pool2d", dt);
  HT_CHECK_LAUNCH("max_pool2d");
}

void launch_max_pool2d_backward(DType dt, const void* grad_out, const int64_t* indices, const PoolShape& s, void* gx,
                                cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        max_pool_backward_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(
            static_cast<const T*>(grad_out), indices, s, static_cast<T*>(gx));
      }))
    HT_UNSUPPORTED_DTYPE("max_pool2d backward", dt);
  HT_CHECK_LAUNCH("max_pool2d backward");
}

void launch_avg_pool2d(DType dt, AvgKind kind, const void* x, PoolStrides xs, const PoolShape& s, void* out,
                       cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        avg_pool_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), xs, s, kind,
                                                                               static_cast<T*>(out));
      }))
    HT_UNSUPPORTED_DTYPE("avg_pool2d", dt);
  HT_CHECK_LAUNCH("avg_pool2d");
}

void launch_avg_pool2d_backward(DType dt, AvgKind kind, const void* grad_out, const PoolShape& s, void* gx,
                                cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        avg_pool_backward_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(
            static_cast<const T*>(grad_out), s, kind, static_cast<T*>(gx));
      }))
    HT_UNSUPPORTED_DTYPE("avg_pool2d backward", dt);
  HT_CHECK_LAUNCH("avg_pool2d backward");
}

}  // namespace ht::kernels
