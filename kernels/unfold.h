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

// Unfold kernel variant (Note [Unfold, staged kernel] in kernels/unfold.cu): 1 (old), one CTA per column row
// above (per-entry index divisions, strided gathers); 2 (staged), a block per (n, oh, channel group, ow tile)
// stages the image patch its positions read (cb channels x the dilated kernel's rows x the tile's input
// columns, zero padding included) in shared memory with reads along the image's contiguous dimension (w for
// NCHW, c for channels-last views), then writes its column entries contiguously from a per-entry offset table.
// A copy either way: the bits are the same. Shapes whose patch does not fit in 48 KB take variant 1.
// HADATRAIN_UNFOLD_KERNEL = old | staged (or 1 | 2), read once per process (unset: 1, until measured);
// set_unfold_variant(v) overrides it (0: back to the environment).
inline constexpr int kUnfoldVariants = 2;
int unfold_variant();
void set_unfold_variant(int variant);
// Launches of variant 2's staged unfold kernel in this process.
int64_t unfold_staged_launches();

// x (N, C, H, W) contiguous <- fold of cols with element strides (n, l, k).
struct FoldStrides3 {
  int64_t n = 0, l = 0, k = 0;
};
void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x,
                   cudaStream_t stream);

// Fold kernel variant (Note [Fold, staged kernel] in kernels/unfold.cu): 1 (old), the thread-per-element gather
// above (its column reads are strided: ~16x sector amplification on (N, L, C·3·3) bf16 columns); 2 (staged), a
// block per (n, channel group, w tile) walks the image rows top to bottom, staging the column rows it needs
// (read once, K-contiguous runs) in a ring of shared-memory rows, and gathers every element's contributions in
// the same ascending (i, j) order in fp32 (fp64 for f64): bit-identical to variant 1 and the CPU. Shapes whose
// ring does not fit in 48 KB (huge dilations) take variant 1 under every variant. 3 (ahead): variant 2 staging
// each time one column row more than needed (a ring slot more), so it stages twice the rows half as often (twice
// the loads in flight, half the barriers); bit-identical too. HADATRAIN_FOLD_KERNEL = old | staged | ahead (or
// 1 | 2 | 3), read once per process (unset: 1, until measured); set_fold_variant(v) overrides it (0: back to the
// environment; the GPU tests and bench_kernels run every variant).
inline constexpr int kFoldVariants = 3;
int fold_variant();
void set_fold_variant(int variant);
// Launches of the staged kernel (variants 2 and 3) in this process (the GPU tests assert that they take it).
int64_t fold_staged_launches();

}  // namespace ht::kernels
