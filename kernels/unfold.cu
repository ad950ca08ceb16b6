// unfold / fold kernels (see unfold.h). Formulas read side by side with src/ops/unfold.cpp.
#include "kernels/convert.cuh"
#include "kernels/launch.h"
#include "kernels/unfold.h"

namespace ht::kernels {
namespace {

template <class T>
__global__ void unfold_kernel(const T* __restrict__ x, UnfoldStrides4 xs, UnfoldGeometry g, T* __restrict__ cols) {
  const int64_t K = g.C * g.kh * g.kw, L = g.OH * g.OW, total = g.N * L * K;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % K, l = (e / K) % L, n = e / (K * L);
    const int64_t j = k % g.kw, i = (k / g.kw) % g.kh, c = k / (g.kw * g.kh);
    const int64_t oh = l / g.OW, ow = l % g.OW;
    const int64_t ih = oh * g.sh - g.ph + i * g.dh, iw = ow * g.sw - g.pw + j * g.dw;
    const bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
    cols[e] = inside ? x[n * xs.n + c * xs.c + ih * xs.h + iw * xs.w] : convert<T>(0.0f);
  }
}

template <class T>
__global__ void fold_kernel(const T* __restrict__ cols, FoldStrides3 cs, UnfoldGeometry g, T* __restrict__ x) {
  using A = acc_t<T>;
  const int64_t total = g.N * g.C * g.H * g.W;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = e % g.W, h = (e / g.W) % g.H, c = (e / (g.W * g.H)) % g.C, n = e / (g.W * g.H * g.C);
    const T* base = cols + n * cs.n;
    A acc = A(0);
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t th = h + g.ph - i * g.dh;  // = oh·sh
      if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
      const int64_t oh = th / g.sh;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t tw = w + g.pw - j * g.dw;
        if (tw < 0 || tw % g.sw != 0 || tw / g.sw >= g.OW) continue;
        const int64_t ow = tw / g.sw;
        acc = acc + convert<A>(base[(oh * g.OW + ow) * cs.l + ((c * g.kh + i) * g.kw + j) * cs.k]);
      }
    }
    x[e] = convert<T>(acc);
  }
}

}  // namespace

void launch_unfold2d(DType dt, const void* x, UnfoldStrides4 xs, const UnfoldGeometry& g, void* cols,
                     cudaStream_t stream) {
  const int64_t total = g.N * g.OH * g.OW * g.C * g.kh * g.kw;
  if (total == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    unfold_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), xs, g,
                                                                        static_cast<T*>(cols));
    HT_CHECK_LAUNCH("unfold2d");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("unfold2d", dt);
}

void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x,
                   cudaStream_t stream) {
  const int64_t total = g.N * g.C * g.H * g.W;
  if (total == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    fold_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(cols), cs, g,
                                                                      static_cast<T*>(x));
    HT_CHECK_LAUNCH("fold2d");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("fold2d", dt);
}

}  // namespace ht::kernels
