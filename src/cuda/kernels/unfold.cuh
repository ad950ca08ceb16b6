// Launchers of the unfold (token-major im2col) and fold (col2im) kernels; CPU reference and contract:
// src/ops/unfold.cpp, include/hadatrain/ops/unfold.h. unfold's gather kernel: one CTA per column row (n, l),
// its threads over the entries (coalesced writes).
// fold's gather kernel: one thread per image element gathering its contributions in ascending (i, j) order in fp32 (fp64 for
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

// launch_unfold2d picks one of three kernels, all copies of the same bits: the vec kernel (Note [Unfold, vec
// kernel] in cuda/kernels/unfold.cu: a thread writes a pack of 16 / sizeof(T) consecutive column entries with one
// 16-byte store) when K·sizeof(T) and the channel group's run are multiples of 16 bytes and the columns 16-byte
// aligned; else the staged kernel (Note [Unfold, staged kernel]: a block per (n, oh, channel group, ow tile)
// stages the image patch its positions read in shared memory, reading along the image's contiguous dimension,
// then writes its column entries contiguously); else, when the patch does not fit in 48 KB, the gather kernel
// (one CTA per column row above).
//
// Launches of the staged unfold kernel in this process (the GPU tests read them to see which kernel ran).
int64_t unfold_staged_launches();
// Launches of the vec unfold kernel in this process.
int64_t unfold_vec_launches();

// x (N, C, H, W) contiguous, or (N, H, W, C) contiguous with channels_last, <- fold of cols with element
// strides (n, l, k).
struct FoldStrides3 {
  int64_t n = 0, l = 0, k = 0;
};
void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x, bool channels_last,
                   cudaStream_t stream);

// launch_fold2d picks one of three kernels, all summing in the same order (the same bits): the tiles kernel
// (Note [Fold, tiles kernel] in cuda/kernels/unfold_fold.cu: a block per (n, channel group, chunk of image rows,
// w tile) stages every column entry its elements need in one pass, 16-byte loads where the runs allow, then sums
// its elements), with a halo stage and no bounds checks for 3x3 windows at stride and dilation 1 in f32 / bf16 /
// f16 (Note [Fold, tiles2]); the gather kernel above when the stage does not fit in 48 KB (huge dilations).
//
// Launches of the tiles kernel in this process, the halo form included (the GPU tests read them).
int64_t fold_tiles_launches();
// Launches of the tiles kernel with the halo stage in this process.
int64_t fold_tiles2_launches();

}  // namespace ht::kernels
