// Launcher of the quantised reduce-scatter's receiving side (CPU reference and contract: src/dist/comm_quant.cpp,
// Note [Quantised reduce-scatter] in include/hadatrain/dist/comm_quant.h): the sum over ranks, in rank order, of
// the dequantised block codes of one destination chunk. One thread per output element (grid-stride); each term is
// one f32 product and one f32 sum (__fmul_rn / __fadd_rn: nothing contracted), as on the CPU.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ht::kernels {

struct CommDequantSumArgs {
  const uint8_t* codes = nullptr;  // (ranks, chunks_per_rank·chunk_padded·bits/8): each rank's codes in turn
  const float* scales = nullptr;   // (ranks, chunks_per_rank·chunk_padded/block): each rank's block scales
  int64_t ranks = 0;
  // Destination chunks each rank's codes hold: `ranks` when every rank's whole input was gathered, 1 when each rank
  // sent only this destination's chunk (an all-to-all; dest is then 0).
  int64_t chunks_per_rank = 0;
  int64_t chunk = 0;         // c: values of the output
  int64_t chunk_padded = 0;  // c' = ceil(c/block)·block: one destination's values in a rank's codes
  int64_t dest = 0;          // which destination chunk (this rank)
  int64_t block = 0;         // values per scale
  int bits = 8;              // 8 (int8 levels) or 4 (two int4 levels per byte, low nibble first)
};

// out (chunk) f32: out[e] = Σ_r float(level_r[dest·c' + e]) · scale_r[(dest·c' + e) / block], r = 0, 1, ...
// (level_r, scale_r: rank r's codes and scales, chunks_per_rank·c' values each)
void launch_comm_dequant_sum(const CommDequantSumArgs& a, float* out, cudaStream_t stream);

}  // namespace ht::kernels
