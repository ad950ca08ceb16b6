// CPU reference loop helpers: strided N-operand iteration with broadcasting, and typed element access.
// Internal to src/ops.
#pragma once
#include <array>
#include <cstdint>

#include "hadatrain/tensor/tensor.h"

namespace ht::cpu {

// Strides of `t` viewed as broadcast to `shape` (0 on broadcast dims, leading dims added).
inline Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  Strides st;
  st.resize(shape.size());
  const int off = shape.size() - t.dim();
  for (int i = 0; i < shape.size(); ++i) {
    const int j = i - off;
    st[i] = (j < 0 || t.shape()[j] == 1) ? 0 : t.strides()[j];
  }
  return st;
}

// Merges neighbouring dims that every operand steps through as one (stride[d] == stride[d + 1] · size[d + 1]
// for all operands) and drops size-1 dims, so that e.g. a contiguous (N, C, H, W) walk against a (1, C, 1, 1)
// broadcast becomes (N, C, H·W) with a long inner loop. The visiting order (row-major) is unchanged.
template <std::size_t N>
void coalesce_dims(Shape& shape, std::array<Strides, N>& strides) {
  Shape cs;
  std::array<Strides, N> cst;
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const int last = cs.size() - 1;
    bool merge = last >= 0;
    for (std::size_t k = 0; k < N && merge; ++k) merge = cst[k][last] == strides[k][d] * shape[d];
    if (merge) {
      cs[last] *= shape[d];
      for (std::size_t k = 0; k < N; ++k) cst[k][last] = strides[k][d];
    } else {
      cs.push_back(shape[d]);
      for (std::size_t k = 0; k < N; ++k) cst[k].push_back(strides[k][d]);
    }
  }
  shape = cs;
  strides = cst;
}

// Calls f(offsets) for every index of `shape` in row-major order, where offsets[k] is the element offset
// of operand k (strides[k] dotted with the index). Inner dimension runs in a tight loop.
template <std::size_t N, class F>
void for_each_offset(const Shape& full_shape, const std::array<Strides, N>& full_strides, F&& f) {
  if (numel_of(full_shape) == 0) return;
  Shape shape = full_shape;
  std::array<Strides, N> strides = full_strides;
  coalesce_dims<N>(shape, strides);
  const int nd = shape.size();
  std::array<int64_t, N> off{};
  if (nd == 0) {
    f(off);
    return;
  }
  const int64_t inner = shape[nd - 1];
  std::array<int64_t, N> inner_stride{};
  for (std::size_t k = 0; k < N; ++k) inner_stride[k] = strides[k][nd - 1];
  Dims idx;
  idx.resize(nd - 1);
  for (;;) {
    std::array<int64_t, N> o = off;
    for (int64_t i = 0; i < inner; ++i) {
      f(o);
      for (std::size_t k = 0; k < N; ++k) o[k] += inner_stride[k];
    }
    int d = nd - 2;
    for (; d >= 0; --d) {
      for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (++idx[d] < shape[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Typed base pointer of a tensor's element 0 (offset applied).
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace ht::cpu
