// HALO's square row kernels (Note [HALO square rows] in halo_square.cu): rows of exactly 2048, 4096, 8192 or 16384
// values rotated by H_n (K = 1, no padding): the Llama-3 widths of 2048 and 4096 (every projection input but the
// 14336-wide down_proj's of Llama-3-8B) and 8192, and level 2's token rotation at 2048 to 16384 tokens. The entry
// points of halo_fast.cu offer every pass here first; same contract and the same bits as the fast row kernels.
// Internal to src/cuda/kernels.
#pragma once
#include <cuda_runtime_api.h>

#include "cuda/kernels/halo.cuh"
#include "cuda/kernels/halo_fast_rows.cuh"

namespace ht::kernels::halo_square {

// Launches pass `mode` (paired: Note [HALO paired quantiser] in halo_fast.cu) with outputs o, as
// halo_fast::rows::run would, and returns true, when these kernels take the rows a: n = C = 2048, 4096, 8192 or
// 16384, K = 1, input f32, bf16 or f16 from a 16-byte aligned start, a.square (HADATRAIN_HALO_SQUARE is not 0),
// 16-byte aligned codes (quantize), and for rotate all n columns kept (o.cols == n) into a 16-byte aligned f32 or
// bf16 out. Otherwise it launches nothing and returns false.
bool run(halo_fast::rows::Mode mode, bool pair, const HaloRowsArgs& a, const halo_fast::rows::Out& o,
         cudaStream_t stream);

}  // namespace ht::kernels::halo_square
