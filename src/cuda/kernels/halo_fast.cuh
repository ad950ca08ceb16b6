// HALO's row kernels for rotations whose power-of-two part P = n / K is at least 512 (every LLaMA width: 2048,
// 4096, 8192 = 2^j; 14336 = 28·512; token counts of 512 and more), used by the launchers of cuda/kernels/halo.cuh
// when they apply. Same contract and the same bits as the general kernels there (Note [HALO fast rows] in
// halo_fast.cu says how they get there faster). Internal to src/cuda/kernels.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels/halo.cuh"

namespace ht::kernels::halo_fast {

// Whether these kernels take rows a (a rotation, n = K·P with P >= 512 a power of two, n <= 32768; input f32,
// bf16 or f16). The quantiser also needs 4-byte aligned codes and the rotation an out_dtype of f32 or bf16.
bool applies(const HaloRowsArgs& a);

// As launch_halo_rotate.
void rotate(const HaloRowsArgs& a, const HaloSigns& signs, void* out, DType out_dtype, int64_t cols, float mult,
            cudaStream_t stream);
// *absmax = max(*absmax, max |v|) over the rotated rows (the caller zeroes it first).
void absmax(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, cudaStream_t stream);
// As launch_halo_quantize_given; codes 4-byte aligned.
void quantize(const HaloRowsArgs& a, const HaloSigns& signs, uint8_t* codes, bool int8, const float* absmax,
              float* scale, cudaStream_t stream);

// Note [HALO paired quantiser] (halo_fast.cu): launch_halo_absmax and launch_halo_absmax of the unrotated rows in
// one kernel (both words zeroed by the caller), and the two quantise passes likewise (codes (R, n) rotated,
// codes_plain (R, C) unrotated; codes 4-byte aligned).
void absmax_pair(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, float* absmax_plain,
                 cudaStream_t stream);
void quantize_pair(const HaloRowsArgs& a, const HaloSigns& signs, uint8_t* codes, uint8_t* codes_plain, bool int8,
                   const float* absmax, const float* absmax_plain, float* scale, float* scale_plain,
                   cudaStream_t stream);

}  // namespace ht::kernels::halo_fast
