// Launchers of the dropout and rotary-embedding kernels. Dtypes f32 f64 bf16 f16 (the op files compute
// fp8 in f32); contiguous row-major buffers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/rope_freq.h"

namespace ht::kernels {

// out[i] = keep(i) ? in[i] * 1/(1-p) : 0 with keep(i) = uniform_from_word(philox_word(seed, stream, i)) >= p
// (src/ops/dropout.cpp; the same Philox bits as the CPU). n elements; in and out may alias.
struct DropoutArgs {
  double p;
  uint64_t seed, stream;
  int64_t n;
  const int64_t* step_word = nullptr;  // device; added to stream when the kernel runs (Note [Step-keyed streams])
};
void launch_dropout(DType dt, void* out, const void* in, const DropoutArgs& a, cudaStream_t stream);

// Rotary embedding of x (B, H, T, D) into out (same shape), both strided (element strides, any layout, out
// not overlapping x unless both have the same strides): pair j of position t rotates by
// angle = (offset + t) * rope_inv_freq_at(freq, j) (double, rope_freq.h, as the CPU path), times `sign` (+1
// forward, -1 the inverse rotation). The shared table of one position, (3 * D/2) doubles (inv_freq, cos, sin), must
// fit kRopeTableBytes (D <= 4096; Note [RoPE kernel tiling] in dropout_rope.cu).
struct RopeArgs {
  int64_t B, H, T, D, offset;
  int64_t in_stride[4], out_stride[4];
  double sign;
  int32_t interleaved;  // pairs (2j, 2j+1) instead of (j, j + D/2)
  RopeFreqArgs freq;
};
inline constexpr int64_t kRopeTableBytes = 48 * 1024;
void launch_rope(DType dt, void* out, const void* in, const RopeArgs& a, cudaStream_t stream);

}  // namespace ht::kernels
