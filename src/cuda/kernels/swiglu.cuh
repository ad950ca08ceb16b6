// Launchers of the fused SwiGLU kernels (src/ops/swiglu.cpp): y = silu(g) * u and its backward, each one pass
// over contiguous buffers of n elements. Dtypes f32 f64 bf16 f16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

// y = R(R(silu(g)) * u), R the rounding to the dtype: the bits of CUDA's silu op followed by its mul op.
void launch_swiglu_forward(DType dt, void* y, const void* g, const void* u, int64_t n, cudaStream_t stream);

// With s = R(silu(g)): du = R(dy * s), dg = R(R(dy * u) * silu'(g)): the bits of the backward of CUDA's mul op
// followed by silu's fused backward.
struct SwigluBackwardArgs {
  void* dg;
  void* du;
  const void* dy;
  const void* g;
  const void* u;
  int64_t n;
};
void launch_swiglu_backward(DType dt, const SwigluBackwardArgs& a, cudaStream_t stream);

}  // namespace ht::kernels
