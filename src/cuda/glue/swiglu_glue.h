// Tensor-level glue of the fused SwiGLU kernels (cuda/kernels/swiglu.cuh). Internal to src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/tensor/tensor.h"

namespace ht::cuda_ops {

// y = silu(g) * u. y contiguous; g, u any layout; all one shape and one dtype among f32 f64 bf16 f16.
void swiglu_forward(const Tensor& y, const Tensor& g, const Tensor& u);
// dg = dy * u * silu'(g), du = dy * silu(g) (Note [SwiGLU bits]). dg, du contiguous; the rest any layout.
void swiglu_backward(const Tensor& dg, const Tensor& du, const Tensor& dy, const Tensor& g, const Tensor& u);

}  // namespace ht::cuda_ops
#endif
