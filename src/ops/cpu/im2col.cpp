// im2col / col2im reference loops (see im2col.h).
#include "im2col.h"

#include <algorithm>

#include "convert.h"

namespace ht::cpu {

namespace {

// The output positions o in [lo, hi) whose input position o·stride + offset lies inside [0, size); every
// other output position reads padding. (offset = k·dilation - pad for kernel tap k.)
struct ValidRange {
  int64_t lo = 0, hi = 0;
};
ValidRange valid_range(int64_t out_size, int64_t size, int64_t stride, int64_t offset) {
  ValidRange r;
  r.lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;  // first o with o·stride + offset >= 0
  r.hi = offset > size - 1 ? 0 : (size - 1 - offset) / stride + 1;  // first o with o·stride + offset >= size
  r.lo = std::min(r.lo, out_size);
  r.hi = std::clamp(r.hi, r.lo, out_size);
  return r;
}

}  // namespace

template <class T>
void im2col(const T* image, const ImageStrides& s, const ConvGeometry& g, T* col, int64_t ld) {
  const T zero = convert<T>(0.0);
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        T* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * ld;
        const int64_t w_off = kw * g.dilation_w - g.pad_w;  // iw = ow·sw + w_off
        const ValidRange ow = valid_range(g.out_w, g.width, g.stride_w, w_off);
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          T* dst = row + oh * g.out_w;
          if (ih < 0 || ih >= g.height) {
            std::fill_n(dst, g.out_w, zero);
            continue;
          }
          const T* src = image + c * s.c + ih * s.h;
          std::fill(dst, dst + ow.lo, zero);
          if (g.stride_w == 1 && s.w == 1)  // a contiguous run of the image row
            std::copy(src + ow.lo + w_off, src + ow.hi + w_off, dst + ow.lo);
          else
            for (int64_t o = ow.lo; o < ow.hi; ++o) dst[o] = src[(o * g.stride_w + w_off) * s.w];
          std::fill(dst + ow.hi, dst + g.out_w, zero);
        }
      }
}

template <class T, class A>
void col2im(const T* col, int64_t ld, const ConvGeometry& g, A* image) {
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const T* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * ld;
        const int64_t w_off = kw * g.dilation_w - g.pad_w;  // iw = ow·sw + w_off
        const ValidRange ow = valid_range(g.out_w, g.width, g.stride_w, w_off);
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          if (ih < 0 || ih >= g.height) continue;
          A* dst = image + (c * g.height + ih) * g.width;
          const T* src = row + oh * g.out_w;
          for (int64_t o = ow.lo; o < ow.hi; ++o) dst[o * g.stride_w + w_off] += convert<A>(src[o]);
        }
      }
}

#define HT_INSTANTIATE_IM2COL(T)                                                     \
  template void im2col<T>(const T*, const ImageStrides&, const ConvGeometry&, T*, int64_t); \
  template void col2im<T, acc_t<T>>(const T*, int64_t, const ConvGeometry&, acc_t<T>*);
HT_INSTANTIATE_IM2COL(float)
HT_INSTANTIATE_IM2COL(double)
HT_INSTANTIATE_IM2COL(bf16)
HT_INSTANTIATE_IM2COL(f16)
HT_INSTANTIATE_IM2COL(f8e4m3)
HT_INSTANTIATE_IM2COL(f8e5m2)
#undef HT_INSTANTIATE_IM2COL

}  // namespace ht::cpu
