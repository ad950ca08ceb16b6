// Shape ops: views (reshape, permute, transpose, narrow, slice, select, unsqueeze, squeeze, expand, flatten)
// and copies that combine tensors (cat, stack). Views share storage and are differentiable.
#pragma once
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht {

Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1; copies only when it must
Tensor view(const Tensor& x, const Shape& shape);     // like reshape, but throws if a copy would be needed
Tensor permute(const Tensor& x, const Dims& order);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);  // removes dim
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast view (stride 0)
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);

// Whether a 4-D x is an (N, H, W, C)-contiguous buffer viewed as (N, C, H, W) (a channels-last image) and not
// also NCHW-contiguous (C == 1 or a 1×1 plane): strides (H·W·C, 1, W·C, C), size-1 dims' strides ignored as
// is_contiguous() does.
bool is_channels_last(const Tensor& x);

}  // namespace ht
