// unfold2d / fold2d: token-major im2col and its adjoint col2im, differentiable (each is the other's
// backward), so a Conv2d can run as unfold2d + a matmul with the flattened weight (the gradient pipelines
// replace that matmul's backward; hlq.md §2).
#pragma once
#include <cstdint>

#include "hadatrain/tensor/tensor.h"

namespace ht {

struct Unfold2dParams {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
};

// The image fold2d produces and the window it was unfolded with.
struct Fold2dParams {
  int64_t channels = 0, height = 0, width = 0;  // output (N, C, H, W)
  Unfold2dParams window;
  // The output's memory order: false, a contiguous (N, C, H, W) tensor; true, the (N, C, H, W) view of a contiguous
  // (N, H, W, C) tensor (the gradient of a channels-last image, which then needs no transpose). Same values.
  bool channels_last = false;
};

// unfold2d's output grid (OH, OW) for an H×W image (formula below), after the window checks every user of the
// window shares: kernel, stride and dilation >= 1, padding >= 0, H, W >= 1, and a dilated kernel that fits the
// padded image. Errors name `op`.
struct Unfold2dGrid {
  int64_t h = 0, w = 0;
};
Unfold2dGrid unfold2d_grid(const char* op, int64_t H, int64_t W, const Unfold2dParams& p);

// x (N, C, H, W) -> cols (N, L, C·kh·kw), L = OH·OW (row-major over (oh, ow)), OH = (H + 2·pad_h −
// dilation_h·(kh − 1) − 1) / stride_h + 1 (same for W); column index c·kh·kw + i·kw + j (the flattening of a
// conv weight (O, C, kh, kw) -> (O, C·kh·kw)); cols[n, oh·OW + ow, c·kh·kw + i·kw + j] =
// x[n, c, oh·stride_h − pad_h + i·dilation_h, ow·stride_w − pad_w + j·dilation_w], 0 in the padding.
// So conv2d(x, w) (groups 1, no bias) == matmul(unfold2d(x), w.reshape({O, −1}).t()) viewed as (N, L, O).
Tensor unfold2d(const Tensor& x, const Unfold2dParams& p);

// cols (N, L, C·kh·kw) -> (N, C, H, W): every image element is the sum of the column entries unfold2d would
// copy from it (the adjoint of unfold2d), added in ascending (i, j) kernel order in fp32 (fp64 for f64) and
// rounded once; deterministic on both backends (CUDA: one thread per image element, no atomics). The result is
// contiguous, or channels-last with p.channels_last.
Tensor fold2d(const Tensor& cols, const Fold2dParams& p);

}  // namespace ht
