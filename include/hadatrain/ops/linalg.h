// Matrix products. matmul: (..., M, K) @ (..., K, N) with broadcast batch dims (either side may be 2-D).
// f32/f64 run on OpenBLAS; other floating dtypes run reference loops with fp32 accumulation.
#pragma once
#include "hadatrain/tensor/tensor.h"

namespace ht {

Tensor matmul(const Tensor& a, const Tensor& b);
// x (..., in) · weight (out, in)ᵀ + bias (out), the product of a Linear layer.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace ht
