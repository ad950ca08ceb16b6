// Launchers of the HLA projection kernel (CPU reference and contract: src/grad/hla.cpp,
// include/hadatrain/grad/hla.h Note [HLA projection]). One CTA per (sample, block, channel tile): the n × tile
// slab is loaded into shared memory as f32, transformed with the butterfly of Note [Bit-identical
// quantisation] (__fadd_rn / __fsub_rn, stages h = 1, 2, ..., n/2), and the kept rows are written as f32 in
// the rows (B, R, C) or channels (B, C, R) layout. Bit-identical to the CPU. Input dtypes: f32 f64 bf16 f16.
// The variants of kernels/hla_variants.cu: two sources share one kernel body (a loader template parameter, Note
// [HLA loaders] there): strided
// columns x (B, L, C), and the im2col columns of an image read through the index map of
// include/hadatrain/ops/unfold.h without materialising them (launch_hla_project_unfolded).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

inline constexpr int64_t kHlaMaxRows = 4096;    // kept rows per block passed by value to the kernel
inline constexpr int64_t kHlaMaxBlock = 32768;  // n: the slab of one channel must fit shared memory

// Kept natural Hadamard indices (plan.rows), by value (8 KiB of kernel parameters, CUDA >= 12.1).
struct HlaRows {
  int16_t idx[kHlaMaxRows];
};

// Kernel variant. classic (4, the default): the session-8 kernel in kernels/hla.cu, radix-8 passes over the
// shared-memory slab, measured on the H200. The others are in kernels/hla_variants.cu (Note [HLA register
// butterfly] there; written in session 9 and not yet run on a GPU, so opt-in until measured):
//   slab (1): the classic algorithm through a loader template (strided columns or the im2col index map) with
//             launch bounds;
//   reg32 (2): radix up to 32 in registers (ceil(log2 n / 5) passes: n = 1024 is the load pass and one more),
//             the last pass writing the kept rows of the rows layout straight to global memory through a
//             natural row -> output slot table (the channels layout writes the slab back and reads it as slab).
//   reg16 (3): the same with at most 16 rows per item (n = 1024: 4 + 3 + 3 stages, two slab writes and reads),
//             for 3 CTAs per SM within 80 registers (reg32 takes ~128 registers: 2 CTAs per SM).
// automatic (0) takes HADATRAIN_HLA_KERNEL = classic | slab | reg32 | reg16 (or 4 | 1 | 2 | 3), read once per
// process; unset or unknown: classic. The same bits every way. The fused im2col path
// (launch_hla_project_unfolded) has no classic kernel and runs slab in its place.
enum class HlaKernel : int { automatic = 0, slab = 1, reg32 = 2, reg16 = 3, classic = 4 };
inline constexpr HlaKernel kHlaKernels[] = {HlaKernel::slab, HlaKernel::reg32, HlaKernel::reg16};  // the new ones
inline const char* hla_kernel_name(HlaKernel v) {
  return v == HlaKernel::slab      ? "slab"
         : v == HlaKernel::reg32   ? "reg32"
         : v == HlaKernel::reg16   ? "reg16"
         : v == HlaKernel::classic ? "classic"
                                   : "auto";
}
HlaKernel hla_kernel_default();

// Which columns one CTA of the im2col path owns (Note [HLA im2col tiles] in kernels/hla_variants.cu):
//   runs (1): `tile` consecutive columns k = c·kh·kw + t (as the strided path): output rows written contiguously,
//             image reads scattered over the kh·kw taps of 1–3 channels;
//   taps (2): one tap t of `tile` consecutive input channels: lanes read consecutive c (coalesced for a
//             channels-last image), output columns c·kh·kw + t written with stride kh·kw;
//   automatic (0): HADATRAIN_HLA_IM2COL = runs | taps | auto (or 1 | 2 | 3), read once per process; auto or a
//             caller's explicit automatic: taps when the image's channel stride is 1 and C >= 16, else runs.
enum class HlaIm2colTiles : int { automatic = 0, runs = 1, taps = 2 };
// Whether grad::hla_project_unfolded runs the fused im2col kernel on CUDA: HADATRAIN_HLA_IM2COL set to runs,
// taps or auto (read once per process). Unset (or off): it runs unfold2d + hla_project, the path measured on
// the H200, until the fused kernel has run on a GPU.
bool hla_im2col_enabled();

struct HlaProjectArgs {
  DType dtype;                     // of x
  const void* x;                   // (B, L, C) with element strides sb, sl, sc
  int64_t B = 0, L = 0, C = 0;
  int64_t sb = 0, sl = 0, sc = 0;
  int64_t block = 1;               // n, a power of two dividing L, <= kHlaMaxBlock
  int64_t kept = 1;                // r, <= kHlaMaxRows
  bool channels = false;           // out (B, C, R) instead of (B, R, C), R = (L / n)·r
  float* out;                      // contiguous
  float* absmax = nullptr;         // optional: max(*absmax, max |out|) by atomicMax on the f32 bits
  HlaKernel variant = HlaKernel::automatic;
};
void launch_hla_project(const HlaProjectArgs& args, const HlaRows& rows, cudaStream_t stream);
// The kernels of kernels/hla_variants.cu (slab, reg32, reg16; classic and automatic run slab there):
// launch_hla_project forwards every variant but classic to it.
void launch_hla_project_variant(const HlaProjectArgs& args, const HlaRows& rows, cudaStream_t stream);

// The projection of cols = unfold2d(x, window) (N, L, C·kh·kw), L = OH·OW, read from the image x.
struct HlaUnfoldedArgs {
  DType dtype;                          // of x
  const void* x;                        // (N, C, H, W) with element strides sn, sc, sh, sw >= 0; within one
                                        // sample, offsets (C−1)·sc + (H−1)·sh + (W−1)·sw < 2^31 (int32)
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t sn = 0, sc = 0, sh = 0, sw = 0;
  int64_t OH = 0, OW = 0;               // output grid (validated by the caller)
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t block = 1;                    // n, a power of two dividing OH·OW, <= kHlaMaxBlock (1 allowed)
  int64_t kept = 1;                     // r
  bool channels = false;                // out (N, C·kh·kw, R) instead of (N, R, C·kh·kw)
  float* out;                           // contiguous
  float* absmax = nullptr;              // as HlaProjectArgs::absmax
  HlaKernel variant = HlaKernel::automatic;
  HlaIm2colTiles tiles = HlaIm2colTiles::automatic;
};
void launch_hla_project_unfolded(const HlaUnfoldedArgs& args, const HlaRows& rows, cudaStream_t stream);

}  // namespace ht::kernels
