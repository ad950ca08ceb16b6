// CPU reference helper for ops that work along one dim (softmax, max/argmax, norms, cross-entropy):
// visits every "line" of a tensor along `dim`. Internal to src/ops.
#pragma once
#include "loops.h"

namespace ht::cpu {

// Calls f(base) once per line along `dim` of `shape`, where base[k] is the element offset of operand k's
// first element on that line; element j of the line is at base[k] + j * strides[k][dim]. Every operand has
// `shape`, except that it may have size 1 on `dim` (a keepdim reduction output: only j = 0 is valid).
// A 0-d shape is one line of length 1 (use line_length / line_stride below).
template <std::size_t N, class F>
void for_each_line(const Shape& shape, int dim, const std::array<Strides, N>& strides, F&& f) {
  Shape outer = shape;
  if (!outer.empty()) outer[dim] = 1;
  for_each_offset<N>(outer, strides, std::forward<F>(f));
}

inline int64_t line_length(const Tensor& t, int dim) { return t.dim() == 0 ? 1 : t.shape()[dim]; }
inline int64_t line_stride(const Tensor& t, int dim) { return t.dim() == 0 ? 0 : t.strides()[dim]; }

// Shape of `s` with `dim` set to 1 (0-d stays 0-d).
inline Shape keepdim_shape(const Shape& s, int dim) {
  Shape out = s;
  if (!out.empty()) out[dim] = 1;
  return out;
}

}  // namespace ht::cpu
