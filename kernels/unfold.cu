// unfold / fold kernels (see unfold.h). Formulas read side by side with src/ops/unfold.cpp.
#include "kernels/convert.cuh"
#include "kernels/launch.h"
#include "kernels/unfold.h"

namespace ht::kernels {
namespace {

// One CTA per column row (n, l): the threads walk its C·kh·kw entries (coalesced writes), 32-bit index math
// inside a row.
template <class T>
__global__ void unfold_kernel(const T* __restrict__ x, UnfoldStrides4 xs, UnfoldGeometry g, T* __restrict__ cols) {
  const int K = static_cast<int>(g.C * g.kh * g.kw), khw = static_cast<int>(g.kh * g.kw), kw = static_cast<int>(g.kw);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W), OW = static_cast<int>(g.OW);
  const int dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int64_t L = g.OH * g.OW, rows = g.N * L;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t n = row / L;
    const int l = static_cast<int>(row - n * L);
    const int oh = l / OW, ow = l - oh * OW;
    const int h0 = oh * static_cast<int>(g.sh) - static_cast<int>(g.ph);
    const int w0 = ow * static_cast<int>(g.sw) - static_cast<int>(g.pw);
    const T* xn = x + n * xs.n;
    T* dst = cols + row * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
      const int c = k / khw, rem = k - c * khw, i = rem / kw, j = rem - i * kw;
      const int ih = h0 + i * dh, iw = w0 + j * dw;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      dst[k] = inside ? xn[c * xs.c + ih * xs.h + iw * xs.w] : convert<T>(0.0f);
    }
  }
}

// One thread per image element, gathering its column entries in ascending (i, j) order (the CPU's order).
template <class T>
__global__ void fold_kernel(const T* __restrict__ cols, FoldStrides3 cs, UnfoldGeometry g, T* __restrict__ x) {
  using A = acc_t<T>;
  const int W = static_cast<int>(g.W), OH = static_cast<int>(g.OH), OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw), sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int64_t HW = g.H * g.W, total = g.N * g.C * HW;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / HW, n = plane / g.C, c = plane - n * g.C;
    const int hw = static_cast<int>(e - plane * HW), h = hw / W, w = hw - h * W;
    const T* base = cols + n * cs.n;
    A acc = A(0);
    for (int i = 0; i < kh; ++i) {
      const int th = h + ph - i * dh;  // = oh·sh
      if (th < 0 || th % sh != 0 || th / sh >= OH) continue;
      const int oh = th / sh;
      for (int j = 0; j < kw; ++j) {
        const int tw = w + pw - j * dw;
        if (tw < 0 || tw % sw != 0 || tw / sw >= OW) continue;
        const int ow = tw / sw;
        acc = acc + convert<A>(base[(int64_t(oh) * OW + ow) * cs.l + ((c * kh + i) * kw + j) * cs.k]);
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
    const int64_t rows = g.N * g.OH * g.OW;
    unfold_kernel<T><<<cuda::grid_for(rows * cuda::kBlock), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), xs, g,
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
