// Copies and conversions: copy_ (any layout, dtype and device to any other), contiguous, clone, to.
#pragma once
#include <cstdint>
#include <vector>

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
// t converted to dt (same shape and device) into memory laid out in `order`: the result's permute(order) is
// contiguous (order {0, 2, 3, 1} lays an (O, C, KH, KW) weight out as (O, KH, KW, C), channels last). One pass
// reads t and writes the result. Its backward converts the gradient, of any strides, back to t's dtype in a
// contiguous tensor, also one pass: a gradient that arrives in `order`'s layout is transposed by that pass.
Tensor to_dtype_in_order(const Tensor& t, DType dt, const std::vector<int64_t>& order);

}  // namespace ht
