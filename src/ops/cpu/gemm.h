// CPU GEMM on raw pointers, shared by matmul, linear and conv2d: row-major
//   C (m, n) = op(A) (m, k) · op(B) (k, n) + beta · C.
// f32/f64 call OpenBLAS; bf16, f16 and fp8 are widened to f32 and multiplied by OpenBLAS's sgemm, which
// accumulates in fp32, and each output element is rounded once (Note [Narrow products on the CPU] in gemm.cpp).
// Internal to src/ops.
#pragma once
#include <cstdint>
#include <optional>

#include "hadatrain/tensor/tensor.h"

namespace ht::cpu {

enum class Trans { no, yes };

// Sizes and layout of one product (all row-major). With trans_a == no, A is stored (m, k) with leading
// dim lda; with yes, A is stored (k, m) with leading dim lda and used transposed. Likewise B: (k, n) or
// (n, k) with ldb. C is (m, n) with leading dim ldc.
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
  Trans trans_a = Trans::no, trans_b = Trans::no;
  int64_t lda = 0, ldb = 0, ldc = 0;
  double beta = 0.0;  // 0: C is overwritten (its old contents are never read); 1: the product is added to C
};

template <class T>
void gemm(const GemmDims& d, const T* a, const T* b, T* c);
// The same product written into a wide accumulator C (fp32 for the narrow floats, T itself for f32/f64),
// so a caller can sum several products of narrow operands and round once at the end.
template <class T>
void gemm_acc(const GemmDims& d, const T* a, const T* b, acc_t<T>* c);

// How a strided (rows, cols) matrix is handed to gemm without a copy: row-major (trans = no, row stride
// = ld, column stride 1) or a transposed view (trans = yes, row stride 1, column stride = ld). Strides of
// size-1 dims do not matter. nullopt when neither holds (e.g. a column step of 2): copy it first.
struct MatrixLayout {
  Trans trans = Trans::no;
  int64_t ld = 1;
};
std::optional<MatrixLayout> gemm_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);

// A tensor whose last two dims form GEMM-ready matrices: `t` itself when its layout allows, otherwise a
// contiguous copy. Leading (batch) dims keep whatever strides they had.
struct GemmOperand {
  Tensor t;
  MatrixLayout layout;
};
GemmOperand gemm_operand(const Tensor& t);

// The GemmDims of C (m, n) = A (m, k) · B (k, n) for operands laid out as `a` and `b`, C contiguous
// (ldc = n), beta 0.
GemmDims gemm_dims(int64_t m, int64_t n, int64_t k, const MatrixLayout& a, const MatrixLayout& b);

}  // namespace ht::cpu
