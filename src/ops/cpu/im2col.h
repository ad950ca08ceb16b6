// im2col / col2im for 2-D convolution on one image (one sample, one channel group), on raw pointers.
// The column matrix col is (C·KH·KW, OH·OW), row-major with row stride `ld` >= OH·OW: row (c, kh, kw),
// column (oh, ow) holds x[c, oh·sh - ph + kh·dh, ow·sw - pw + kw·dw], and 0 where that position lies in the
// padding. A convolution is then W (O, C·KH·KW) · col. With ld = S·OH·OW and col advanced by s·OH·OW for
// sample s, S samples fill one wide (C·KH·KW, S·OH·OW) matrix, so a whole chunk of the batch is one GEMM.
// Internal to src/ops.
#pragma once
#include <cstdint>

#include "hadatrain/tensor/dtype.h"

namespace ht::cpu {

struct ConvGeometry {
  int64_t channels = 0, height = 0, width = 0;  // of the image (one group's channels)
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t out_h = 0, out_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;

  int64_t col_rows() const { return channels * kernel_h * kernel_w; }
  int64_t col_cols() const { return out_h * out_w; }
};

// Element strides of an image (C, H, W) in any layout (e.g. a channels-last tensor viewed as NCHW).
struct ImageStrides {
  int64_t c = 0, h = 0, w = 0;
};

// col (C·KH·KW, OH·OW), row stride ld, <- image (C, H, W) read through `s`.
template <class T>
void im2col(const T* image, const ImageStrides& s, const ConvGeometry& g, T* col, int64_t ld);

// image (C, H, W), contiguous, += the entries of col scattered back to where im2col read them (overlapping
// windows sum). A is the accumulator type (fp32 for the narrow floats), so sums round once at the end.
// col has row stride ld, as in im2col.
template <class T, class A>
void col2im(const T* col, int64_t ld, const ConvGeometry& g, A* image);

}  // namespace ht::cpu
