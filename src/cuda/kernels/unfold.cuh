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

// Unfold kernel variant (Note [Unfold, staged kernel] in cuda/kernels/unfold.cu): 1 (old), one CTA per column row
// above (per-entry index divisions, strided gathers); 2 (staged), a block per (n, oh, channel group, ow tile)
// stages the image patch its positions read (cb channels x the dilated kernel's rows x the tile's input
// columns, zero padding included) in shared memory with reads along the image's contiguous dimension (w for
// NCHW, c for channels-last views), then writes its column entries contiguously from a per-entry offset table.
// 3 (vec, the default; Note [Unfold, vec kernel]): variant 2's tiles and staging (indices stepped without divisions),
// then each thread writes a pack of 16 / sizeof(T) consecutive column entries with one 16-byte store, gathered
// from the patch through a table of 2-byte offsets (one shared-memory load a pack); taken when K·sizeof(T) and
// the channel group's run are multiples of 16 bytes and the columns 16-byte aligned, else variant 2 runs. A copy every way: the bits are the same. Shapes whose patch does
// not fit in 48 KB take variant 1.
// HADATRAIN_UNFOLD_KERNEL = old | staged | vec (or 1 | 2 | 3), read once per process (unset: 3, the fastest on
// every run-31 shape, e.g. C 64 32x32 3x3 bf16 NHWC at N 256: vec 0.1038 ms, staged 0.3394, old 0.7273; unknown: 1); set_unfold_variant(v) overrides it
// (0: back to the environment).
inline constexpr int kUnfoldVariants = 3;
int unfold_variant();
void set_unfold_variant(int variant);
// Launches of variant 2's staged unfold kernel in this process (variant 3's fallbacks included).
int64_t unfold_staged_launches();
// Launches of variant 3's vec unfold kernel in this process.
int64_t unfold_vec_launches();

// x (N, C, H, W) contiguous <- fold of cols with element strides (n, l, k).
struct FoldStrides3 {
  int64_t n = 0, l = 0, k = 0;
};
void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x,
                   cudaStream_t stream);

// Fold kernel variant: 1 (old), the thread-per-element gather above (its column reads are strided: ~16x sector
// amplification on (N, L, C·3·3) bf16 columns); 2 (tiles; Note [Fold, tiles kernel] in
// cuda/kernels/unfold_fold.cu), a block per (n, channel group, chunk of image rows, w tile) stages every column entry its
// elements need in one pass (16-byte loads where the runs allow, kept in the column dtype), one barrier, then sums
// its elements in the same ascending (i, j) order in fp32 (fp64 for f64) as 1 and the CPU: bit-identical. Shapes
// whose stage does not fit in 48 KB (huge dilations) take variant 1. Run 26 (bf16, N 256, ms old / tiles): C 64
// 32x32 3x3 0.744 / 0.240, C 128 16x16 0.382 / 0.124, C 64 32x32 stride 2 0.471 / 0.390. 3 (tiles2, the default; Note
// [Fold, tiles2]): variant 2, but 3x3 windows at stride and dilation 1 in f32 / bf16 / f16 stage a halo (R + 2
// rows x tw + 2 positions, zeros outside the column grid) and sum without bounds checks: the same bits (adding +0
// to a sum that starts at +0 changes nothing); other shapes run variant 2 (run 31: level with or faster than
// tiles on every bench shape, C 64 56x56 0.2157 -> 0.1914 ms). HADATRAIN_FOLD_KERNEL = old | tiles | tiles2 (or 1 | 2 | 3), read once per process (unset: tiles2;
// unknown: old); set_fold_variant(v) overrides it (0: back to the environment; the GPU tests and bench_kernels run
// every variant).
inline constexpr int kFoldVariants = 3;
int fold_variant();
void set_fold_variant(int variant);
// Launches of the tiles kernel in this process, variant 3's included (the GPU tests assert that variant 2 takes it).
int64_t fold_tiles_launches();
// Launches of variant 3's halo tiles kernel in this process.
int64_t fold_tiles2_launches();

}  // namespace ht::kernels
