// Launchers of the unfold (token-major im2col) and fold (col2im) kernels; CPU reference and contract:
// src/ops/unfold.cpp, include/hadatrain/ops/unfold.h. unfold: one CTA per column row (n, l), its threads over the entries (coalesced writes).
// fold: one thread per image element gathering its contributions in ascending (i, j) order in fp32 (fp64 for
// f64) and rounding once, as the CPU does: deterministic, no atomics, bit-identical. Dtypes f32 f64 bf16 f16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

struct UnfoldGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0;  // image (N, C, H, W)
  int64_t OH = 0, OW = 0;              // output grid, L = OH·OW
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

// cols (N, L, C·kh·kw) contiguous <- x with element strides xs[4] (n, c, h, w).
struct UnfoldStrides4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
};
void launch_unfold2d(DType dt, const void* x, UnfoldStrides4 xs, const UnfoldGeometry& g, void* cols,
                     cudaStream_t stream);

// x (N, C, H, W) contiguous <- fold of cols with element strides (n, l, k).
struct FoldStrides3 {
  int64_t n = 0, l = 0, k = 0;
};
void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x,
                   cudaStream_t stream);

}  // namespace ht::kernels
