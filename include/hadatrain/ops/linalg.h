// Matrix products. matmul: (..., M, K) @ (..., K, N) with broadcast batch dims (either side may be 2-D).
// f32/f64 run on OpenBLAS; other floating dtypes run reference loops with fp32 accumulation.
#pragma once
#include "hadatrain/tensor/tensor.h"

namespace ht {

Tensor matmul(const Tensor& a, const Tensor& b);
// a (M, K) @ b (K, N) of one floating dtype -> (M, N) f32: fp32 accumulation rounded once to f32, not to the inputs'
// 16-bit dtype (bf16 / f16 on CUDA: cuBLASLt with an f32 C; the CPU multiplies the f32 conversions, exact for those
// dtypes, on OpenBLAS). Either operand may be a transposed view. Not differentiable (operands are read detached).
Tensor matmul_f32(const Tensor& a, const Tensor& b);
// x (..., in) · weight (out, in)ᵀ + bias (out), the product of a Linear layer.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace ht
