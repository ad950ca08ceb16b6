// The random bits of stochastic rounding in quantize() (include/hadatrain/grad/quant.h), shared by the CPU
// reference (src/grad/quant.cpp) and the CUDA kernels (cuda/kernels/grad_quant_common.cuh) so both draw the same bits.
//
// Note [SR noise layout]
// Element i of a quantised tensor (its row-major index in the rotated input) uses 16 random bits:
//   block  = philox4x32_10(counter = (i / 8 low, i / 8 high, stream low, stream high), key = seed),
//   word   = block[(i % 8) / 2],
//   h      = (i even) ? word & 0xFFFF : word >> 16,
//   u      = (2·h + 1)·2^−17            (exact in f32; the midpoints of the 2^16 cells of [0, 1)).
// One Philox call serves 8 consecutive elements (a 16-element register unit of the CUDA kernels is two calls).
// Rounding up iff u < frac gives P(up) = frac + e with |e| <= 2^−17 (u takes the cell midpoints), so the
// bias of E[q] is at most 2^−17 of a quantisation step. LUQ keeps 32 bits per element (philox_word,
// uniform_from_word): its underflow probabilities can be far below 2^−16.
#pragma once
#include <cstdint>

#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/scalar_types.h"  // HT_HD

namespace ht::grad {

// The four words of the Philox block that serves elements 8·blk .. 8·blk + 7.
HT_HD inline void sr_block(uint64_t seed, uint64_t stream, uint64_t blk, uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32), static_cast<uint32_t>(stream),
                           static_cast<uint32_t>(stream >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  philox4x32_10(ctr, key, out);
}

// The 16 bits of element k (0..7) of a block.
HT_HD inline uint32_t sr_bits(const uint32_t w[4], int k) { return (w[k >> 1] >> (16 * (k & 1))) & 0xFFFFu; }

// u = (2h + 1)·2^−17, built from the f32 bit pattern 1 + (2h + 1)·2^−17 minus 1 (both steps exact).
HT_HD inline float sr_uniform(uint32_t h) {
  return ht::detail::f32_from_bits(0x3F800000u | (h << 7) | 0x40u) - 1.0f;
}

// The 16 bits of element i of stream (seed, stream).
HT_HD inline uint32_t sr_noise(uint64_t seed, uint64_t stream, uint64_t i) {
  uint32_t w[4];
  sr_block(seed, stream, i >> 3, w);
  return sr_bits(w, static_cast<int>(i & 7));
}

}  // namespace ht::grad
