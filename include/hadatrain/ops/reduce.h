// Reductions over dims (sum, mean, max, argmax, var) and sum_to (the backward of broadcasting).
#pragma once
#include "hadatrain/tensor/tensor.h"

namespace ht {

enum class KeepDim { no, yes };

Tensor sum(const Tensor& x);  // all elements -> shape ()
Tensor sum(const Tensor& x, const Dims& dims, KeepDim keep = KeepDim::no);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const Dims& dims, KeepDim keep = KeepDim::no);
// Max values along one dim (gradient flows to the first maximal element).
Tensor max(const Tensor& x, int64_t dim, KeepDim keep = KeepDim::no);
Tensor max(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, KeepDim keep = KeepDim::no);  // i64, first maximal index
// Variance with `correction` (1 = unbiased, 0 = population).
Tensor var(const Tensor& x, const Dims& dims, int64_t correction = 1, KeepDim keep = KeepDim::no);
// Sums x down to `shape` (x's shape must be a broadcast of it).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace ht
