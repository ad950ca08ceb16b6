// Launcher of the HLA projection kernel (CPU reference and contract: src/grad/hla.cpp,
// include/hadatrain/grad/hla.h Note [HLA projection]). One CTA per (sample, block, channel tile): the n × tile
// slab is loaded into shared memory as f32, transformed with the butterfly of Note [Bit-identical
// quantisation] (__fadd_rn / __fsub_rn, stages h = 1, 2, ..., n/2), and the kept rows are written as f32 in
// the rows (B, R, C) or channels (B, C, R) layout. Bit-identical to the CPU. Input dtypes: f32 f64 bf16 f16.
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
};
void launch_hla_project(const HlaProjectArgs& args, const HlaRows& rows, cudaStream_t stream);

}  // namespace ht::kernels
