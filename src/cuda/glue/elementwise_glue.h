// Tensor-level entry points to the CUDA kernels (the CUDA counterpart of src/ops/cpu): they turn tensors
// into raw pointers and layouts, pick the device and stream, and compute dtypes that have no kernel of
// their own in a wider one with identical results (fp8 in f32, bool in i64 or u8), exactly as the CPU
// reference computes them in acc_t. Internal to src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include <vector>

#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/reduce.cuh"

namespace ht::cuda_ops {

// out = a op b; a and b have out's dtype and broadcast to out's shape. Integer division checks for zero
// divisors first (one host synchronisation), like the CPU path.
void binary(kernels::BinaryOp op, double alpha, const Tensor& out, const Tensor& a, const Tensor& b);
// out (bool) = a cmp b; a and b have the same dtype and broadcast to out's shape.
void compare(kernels::CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b);

struct UnaryCall {
  kernels::UnaryOp op;
  kernels::UnaryMode mode = kernels::UnaryMode::value;
  double s0 = 0, s1 = 0;  // scalar operands (clamp bounds, the scalar of add/mul/rsub/pow)
};
// out = f(x); x has out's dtype and broadcasts to out's shape (out may be x itself: in place).
void unary(const UnaryCall& call, const Tensor& out, const Tensor& x);

// gx = g * f'(x) in one pass (call.op a unary math op; call.s0 / s1 the clamp bounds); gx, g and x have one
// floating dtype with a kernel (f32 f64 bf16 f16) and g, x broadcast to gx's shape.
void unary_backward(const UnaryCall& call, const Tensor& gx, const Tensor& g, const Tensor& x);

// out = cond ? a : b; a and b have out's dtype; all broadcast to out's shape.
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);

// dst = src converted, both on the same CUDA device, src broadcast to dst (no packed int4).
void copy(const Tensor& dst, const Tensor& src);
// Every element of dst = value, a one-element host tensor of dst's dtype.
void fill(const Tensor& dst, const Tensor& value);

// out (contiguous, one element per kept position) = scale * sum of x over the dims where reduced[d].
void sum(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double scale);

}  // namespace ht::cuda_ops
#endif
