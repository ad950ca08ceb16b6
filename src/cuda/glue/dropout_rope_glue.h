// Tensor-level glue of the dropout and rotary-embedding kernels (cuda/kernels/dropout_rope.cuh). Internal to
// src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/dropout_rope.cuh"

namespace ht::cuda_ops {

// out (contiguous, x's shape and dtype) = dropout mask of (seed, stream) applied to x (any layout); the
// mask index is the row-major position in x's shape, as on the CPU. `step_word` (device int64, or null) is added
// to the stream when the kernel runs (Note [Step-keyed streams] in tensor/philox.h).
void dropout(const Tensor& out, const Tensor& x, double p, uint64_t seed, uint64_t stream,
             const int64_t* step_word = nullptr);

struct RopeCall {
  kernels::RopeFreqArgs freq;  // the frequencies of the op's parameters (cuda/kernels/rope_freq.h)
  int64_t position_offset;
  bool interleaved;
  double sign;  // +1 forward, -1 inverse
};
// out ((B, H, T, D), any layout that does not overlap x, or x itself) = x (any layout) rotated.
void rope(const Tensor& out, const Tensor& x, const RopeCall& call);

}  // namespace ht::cuda_ops
#endif
