// Copies and conversions: copy_ (any layout, dtype and device to any other), contiguous, clone, to.
#pragma once
#include "hadatrain/tensor/tensor.h"

namespace ht {

// Writes src into dst elementwise (shapes must match; src may broadcast to dst), converting dtype and
// crossing devices as needed. Not recorded by autograd; dst must not require grad.
void copy_(const Tensor& dst, const Tensor& src);
// Differentiable conversions (backward converts the gradient back).
Tensor contiguous(const Tensor& t);
Tensor clone(const Tensor& t);
Tensor to_dtype(const Tensor& t, DType dt);
Tensor to_device(const Tensor& t, Device dev);

}  // namespace ht
