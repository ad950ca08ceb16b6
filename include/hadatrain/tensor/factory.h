// Tensor factories: zeros/ones/full, tensors from host data, ranges and Philox-random tensors.
#pragma once
#include <vector>

#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/tensor.h"

namespace ht {

Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// Fills t (any layout, any device) with value, in place.
void fill_(const Tensor& t, double value);

// Copies host values into a new tensor of `shape` (converted to opts.dtype, placed on opts.device).
Tensor from_vector(const std::vector<float>& values, const Shape& shape, TensorOptions opts = {});
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});
// 0, 1, ..., n-1
Tensor arange(int64_t n, TensorOptions opts = {});

// Philox-random tensors: element i draws from stream `gen.next_stream()` at index i (Note [Philox stream
// layout]), so CPU and CUDA give the same values for the same generator state.
Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts = {});   // U[0, 1)
Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts = {});  // N(0, 1), Box-Muller
Tensor uniform(const Shape& shape, double low, double high, Generator& gen, TensorOptions opts = {});
// mean + std·z with z as randn draws it (the same stream layout), computed in f64 and rounded once to opts.dtype
Tensor normal(const Shape& shape, double mean, double std, Generator& gen, TensorOptions opts = {});

}  // namespace ht
