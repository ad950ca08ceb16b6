// im2col / col2im reference loops (see im2col.h).
#include "im2col.h"

#include "convert.h"

namespace ht::cpu {

template <class T>
void im2col(const T* image, const ImageStrides& s, const ConvGeometry& g, T* col) {
  const int64_t ohw = g.col_cols();
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        T* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * ohw;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          T* dst = row + oh * g.out_w;
          if (ih < 0 || ih >= g.height) {
            for (int64_t ow = 0; ow < g.out_w; ++ow) dst[ow] = convert<T>(0.0);
            continue;
          }
          const T* src = image + c * s.c + ih * s.h;
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
            dst[ow] = (iw < 0 || iw >= g.width) ? convert<T>(0.0) : src[iw * s.w];
          }
        }
      }
}

template <class T, class A>
void col2im(const T* col, const ConvGeometry& g, A* image) {
  const int64_t ohw = g.col_cols();
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const T* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * ohw;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          if (ih < 0 || ih >= g.height) continue;
          A* dst = image + (c * g.height + ih) * g.width;
          const T* src = row + oh * g.out_w;
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
            if (iw >= 0 && iw < g.width) dst[iw] += convert<A>(src[ow]);
          }
        }
      }
}

#define HT_INSTANTIATE_IM2COL(T)                                                     \
  template void im2col<T>(const T*, const ImageStrides&, const ConvGeometry&, T*); \
  template void col2im<T, acc_t<T>>(const T*, const ConvGeometry&, acc_t<T>*);
HT_INSTANTIATE_IM2COL(float)
HT_INSTANTIATE_IM2COL(double)
HT_INSTANTIATE_IM2COL(bf16)
HT_INSTANTIATE_IM2COL(f16)
HT_INSTANTIATE_IM2COL(f8e4m3)
HT_INSTANTIATE_IM2COL(f8e5m2)
#undef HT_INSTANTIATE_IM2COL

}  // namespace ht::cpu
