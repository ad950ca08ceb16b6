// Shared by src/grad/quant.cpp, luq.cpp and src/cuda/glue/grad_quant_glue.cpp: input checks and the scale-group geometry of
// include/hadatrain/grad/quant.h. Every granularity's groups are contiguous runs of `len` elements in
// row-major order (tensor: all, sample: everything under one index of dim 0, row: one row of the last dim).
// Internal to src/grad.
#pragma once
#include <cstdint>

#include "hadatrain/grad/quant.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::grad::detail {

struct Groups {
  int64_t count = 0;  // number of scales
  int64_t len = 0;    // elements per group
  Shape scale_shape;  // (1), (B) or (numel / last dim)
};

inline Groups groups_of(const Tensor& x, Granularity g) {
  const Shape& s = x.shape();
  const int64_t last = s[s.size() - 1];
  int64_t rows = 1;  // product of all dims but the last (well defined when the last dim is 0)
  for (int i = 0; i + 1 < s.size(); ++i) rows *= s[i];
  int64_t rest = 1;  // product of all dims but the first
  for (int i = 1; i < s.size(); ++i) rest *= s[i];
  switch (g) {
    case Granularity::tensor: return {1, x.numel(), Shape{1}};
    case Granularity::sample: return {s[0], rest, Shape{s[0]}};
    case Granularity::row: return {rows, last, Shape{rows}};
  }
  return {};
}

inline bool is_power_of_two(int64_t n) { return n >= 1 && (n & (n - 1)) == 0; }

// Throws unless x is a defined floating tensor with >= 1 dim.
void check_quant_input(const char* op, const Tensor& x);
// Throws unless block is a power of two dividing the last dim of x.
void check_hadamard_block(const char* op, const Tensor& x, int64_t block);
// QuantSpec::report_column_sums by the sum op: sum(x, every dim but the last), in the sum's result dtype.
Tensor column_sums_by_op(const Tensor& x);

}  // namespace ht::grad::detail
