// Launchers of the HLA projection kernel (CPU reference and contract: src/grad/hla.cpp,
// include/hadatrain/grad/hla.h Note [HLA projection]). Blocks of n <= 16 in the rows layout run in registers,
// several blocks per CTA (Note [HLA small blocks] in cuda/kernels/hla.cu); blocks of 256 <= n <= 2048 in the rows
// layout with 16-byte aligned runs of 8 columns in registers, shuffles and one shared-memory exchange (Note [HLA
// wide blocks]). Otherwise one CTA per (sample, block,
// column tile): the n × tile slab is loaded into shared memory as f32, transformed with the butterfly of Note
// [Bit-identical quantisation] (__fadd_rn / __fsub_rn, stages h = 1, 2, ..., n/2), and the kept rows are
// written as f32 in the rows (B, R, C) or channels (B, C, R) layout. Bit-identical to the CPU either way.
// Input dtypes: f32 f64 bf16 f16.
// One kernel body (cuda/kernels/hla.cu, Note [HLA butterfly passes]) serves two sources through a loader (Note
// [HLA loaders] there): strided columns x (B, L, C) (launch_hla_project), and the im2col columns of an image
// read through the index map of include/hadatrain/ops/unfold.h without materialising them
// (launch_hla_project_unfolded).
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
  bool slab_only = false;          // benchmarks: the slab kernel even where the register kernel of n <= 16 or
                                   // the wide kernel would run (Notes [HLA small blocks], [HLA wide blocks])
};
void launch_hla_project(const HlaProjectArgs& args, const HlaRows& rows, cudaStream_t stream);
// Launches of the wide-block kernel (Note [HLA wide blocks] in cuda/kernels/hla.cu: rows layout, 256 <= n <= 2048,
// 2- or 4-byte elements, 8-column runs 16-byte aligned) in this process; the GPU tests read it.
int64_t hla_wide_launches();

// The projection of cols = unfold2d(x, window) (N, L, C·kh·kw), L = OH·OW, read from the image x; a CTA owns
// consecutive columns, as in launch_hla_project (Note [HLA im2col tiles] in cuda/kernels/hla.cu).
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
  bool slab_only = false;               // as HlaProjectArgs::slab_only
};
void launch_hla_project_unfolded(const HlaUnfoldedArgs& args, const HlaRows& rows, cudaStream_t stream);

// The adjoint, P_rᵀ·g (Note [HLA back-projection] in include/hadatrain/grad/hla.h): g (B, R, C) f32 with
// element strides -> out (B, L, C) contiguous in out_dtype (f32 f64 bf16 f16), mult times the butterfly of the
// kept rows scattered to their natural indices, one rounding. The slab kernel with a loader that reads the kept
// rows (zeros elsewhere) and writes all n rows.
struct HlaBackArgs {
  DType out_dtype;
  const float* g;                  // (B, R, C) with element strides sb, sr, sc
  int64_t B = 0, L = 0, C = 0;
  int64_t sb = 0, sr = 0, sc = 0;
  int64_t block = 1;               // n, a power of two dividing L, <= kHlaMaxBlock
  int64_t kept = 1;                // r, <= kHlaMaxRows
  float mult = 1.0f;
  void* out;
};
void launch_hla_back_project(const HlaBackArgs& args, const HlaRows& rows, cudaStream_t stream);

}  // namespace ht::kernels
