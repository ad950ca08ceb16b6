// HALO's square row kernels (Note [HALO square rows] in halo_square.cu): rows of exactly 2048, 4096, 8192 or 16384
// values rotated by H_n (K = 1, no padding): the Llama-3 widths of 2048 and 4096 (every projection input but the
// 14336-wide down_proj's of Llama-3-8B) and 8192, and level 2's token rotation at 2048 to 16384 tokens. The entry
// points of halo_fast.cu hand such rows here; same contract and the same bits as theirs. Internal to
// src/cuda/kernels.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels/halo.cuh"

namespace ht::kernels::halo_square {

// Whether these kernels take rows a: n = C = 2048, 4096, 8192 or 16384, K = 1, input f32, bf16 or f16 from a
// 16-byte aligned start, and a.square (HADATRAIN_HALO_SQUARE is not 0).
bool applies(const HaloRowsArgs& a);

// As halo_fast::absmax, quantize and rotate; quantize needs 16-byte aligned codes, rotate all n columns kept
// (cols == n) into a 16-byte aligned f32 or bf16 out. The callers check those (quantize_applies,
// rotate_applies) and otherwise use the general fast kernels.
void absmax(const HaloRowsArgs& a, float* absmax, cudaStream_t stream);
bool quantize_applies(const HaloRowsArgs& a, const void* codes);
void quantize(const HaloRowsArgs& a, uint8_t* codes, bool int8, const float* absmax, float* scale, cudaStream_t stream);
// As halo_fast::absmax_pair and quantize_pair (Note [HALO paired quantiser]); 16-byte aligned codes and codes_plain.
void absmax_pair(const HaloRowsArgs& a, float* absmax, float* absmax_plain, cudaStream_t stream);
bool quantize_pair_applies(const HaloRowsArgs& a, const void* codes, const void* codes_plain);
void quantize_pair(const HaloRowsArgs& a, uint8_t* codes, uint8_t* codes_plain, bool int8, const float* absmax,
                   const float* absmax_plain, float* scale, float* scale_plain, cudaStream_t stream);
bool rotate_applies(const HaloRowsArgs& a, const void* out, DType out_dtype, int64_t cols);
void rotate(const HaloRowsArgs& a, void* out, DType out_dtype, float mult, cudaStream_t stream);

}  // namespace ht::kernels::halo_square
