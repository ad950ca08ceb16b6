// Launchers of the elementwise kernels: binary arithmetic, comparisons, unary math (with the scalar ops)
// and where. Raw pointers (each pointing at element 0 of its operand), a Layout of element strides over
// the output's index space (broadcast dims have stride 0), a stream. Formulas are those of the CPU
// reference in src/ops/{arithmetic,unary,compare,where}.cpp: computed in float for bf16/f16/f32, double
// for f64, int64 (saturated on store) for integers.
// Dtypes: f32 f64 bf16 f16 i8 u8 i32 i64 (the op files compute fp8 in f32 and bool in i64 / u8).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/kernel_layout.h"

namespace ht::kernels {

enum class BinaryOp : uint8_t { add, sub, mul, div, max, min, add_scaled /* a + alpha * b */ };
enum class CompareOp : uint8_t { eq, ne, lt, le, gt, ge };

// Operands of a binary kernel: out (3 operands in the layout: out, a, b).
struct BinaryArgs {
  void* out;
  const void* a;
  const void* b;
  Layout<3> layout;
};

// out = a op b, all of dtype dt. `alpha` is used by add_scaled only.
void launch_binary(DType dt, BinaryOp op, double alpha, const BinaryArgs& args, cudaStream_t stream);
// out (bool) = a cmp b, a and b of dtype dt.
void launch_compare(DType dt, CompareOp op, const BinaryArgs& args, cudaStream_t stream);

enum class UnaryOp : uint8_t {
  neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu_erf, gelu_tanh, silu,
  clamp,        // clamp to [s0, s1]
  add_scalar,   // x + s0
  mul_scalar,   // x * s0
  rsub_scalar,  // s0 - x
  pow_scalar,   // x ^ s0 (computed in double, as on the CPU)
};
enum class UnaryMode : uint8_t { value, derivative };  // f(x) or f'(x) (derivative: the unary math ops only)

struct UnaryArgs {
  UnaryOp op;
  UnaryMode mode;
  double s0, s1;  // scalar operands (see UnaryOp)
  void* out;
  const void* in;
  Layout<2> layout;  // out, in
};

// out = f(in), both of dtype dt (integers compute through double and saturate, like the CPU path).
void launch_unary(DType dt, const UnaryArgs& args, cudaStream_t stream);

// Fused backward of a unary math op: out = g * f'(x), computed in float (double for f64) and rounded once
// (the op-based composition rounds f'(x) first). args: out, a = g, b = x, all of dtype dt (f32 f64 bf16 f16).
// s0, s1: clamp bounds. bf16 / f16 GELU and SiLU use the fast forms (Note [Fast GELU / SiLU for bf16 and f16]).
void launch_unary_backward(DType dt, UnaryOp op, double s0, double s1, const BinaryArgs& args, cudaStream_t stream);

struct WhereArgs {
  void* out;
  const bool* cond;
  const void* a;
  const void* b;
  Layout<4> layout;  // out, cond, a, b
};

// out = cond ? a : b for elements of `itemsize` bytes (1, 2, 4 or 8): a bit copy, any dtype.
void launch_where(std::size_t itemsize, const WhereArgs& args, cudaStream_t stream);

}  // namespace ht::kernels
