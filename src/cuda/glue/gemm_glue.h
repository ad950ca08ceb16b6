// Tensor-level matrix products on CUDA (cuBLASLt through cuda/cublaslt_gemm.h): operands to pointers, transposes
// and leading dims, batch dims to strided batches. Internal to src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/tensor/tensor.h"

namespace ht::cuda_ops {

// out (..., M, N), freshly allocated and contiguous, = a (..., M, K) @ b (..., K, N); the batch dims of a
// and b broadcast to those of out. out has a's dtype, or f32 for bf16 / f16 operands. Operands that are row-major
// or transposed views are read in place.
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);

// y (R, out), freshly allocated and contiguous, = x (R, in) · wᵀ [+ bias (out)], w (out, in).
void linear(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias);

}  // namespace ht::cuda_ops
#endif
