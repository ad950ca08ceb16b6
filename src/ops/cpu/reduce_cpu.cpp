// Reduction shape helpers shared by the reduce ops.
#include "reduce_cpu.h"

namespace ht::cpu {

std::vector<bool> reduce_mask(const Tensor& x, const Dims& dims, const char* op) {
  std::vector<bool> mask(static_cast<std::size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) {
    const int w = wrap_dim(d, x.dim(), op);
    if (x.dim() == 0) continue;
    HT_CHECK(!mask[static_cast<std::size_t>(w)], "{}: dim {} appears twice in {}", op, d, to_string(dims));
    mask[static_cast<std::size_t>(w)] = true;
  }
  return mask;
}

Shape reduced_shape_keepdim(const Shape& s, const std::vector<bool>& mask) {
  Shape out = s;
  for (int i = 0; i < s.size(); ++i)
    if (mask[static_cast<std::size_t>(i)]) out[i] = 1;
  return out;
}

Strides reduce_out_strides(const Shape& keep_shape, const std::vector<bool>& mask) {
  Strides st = contiguous_strides(keep_shape);
  for (int i = 0; i < keep_shape.size(); ++i)
    if (mask[static_cast<std::size_t>(i)]) st[i] = 0;
  return st;
}

}  // namespace ht::cpu
