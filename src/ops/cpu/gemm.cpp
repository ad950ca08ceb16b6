// CPU GEMM: OpenBLAS for every dtype; bf16/f16/fp8 operands are widened to f32 first (see gemm.h).
#include "gemm.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "convert.h"
#include "hadatrain/ops/copy.h"

namespace ht::cpu {
namespace {

// Element (i, p) of op(A), where op(A) is (m, k).
template <class T>
const T& at_a(const GemmDims& d, const T* a, int64_t i, int64_t p) {
  return d.trans_a == Trans::no ? a[i * d.lda + p] : a[p * d.lda + i];
}
// Element (p, j) of op(B), where op(B) is (k, n).
template <class T>
const T& at_b(const GemmDims& d, const T* b, int64_t p, int64_t j) {
  return d.trans_b == Trans::no ? b[p * d.ldb + j] : b[j * d.ldb + p];
}

// Handles the products that read no operand: empty C, or k = 0 (C = beta · C).
template <class Out>
bool trivial_product(const GemmDims& d, Out* c) {
  if (d.m == 0 || d.n == 0) return true;
  if (d.k != 0) return false;
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < d.n; ++j) {
      Out& e = c[i * d.ldc + j];
      e = d.beta == 0.0 ? convert<Out>(0.0) : convert<Out>(to_double(e) * d.beta);
    }
  return true;
}

blasint blas_int(int64_t v, const char* what) {
  HT_CHECK(v >= 0 && v <= std::numeric_limits<blasint>::max(),
           "gemm: {} = {} does not fit the BLAS integer type; split the product", what, v);
  return static_cast<blasint>(v);
}

CBLAS_TRANSPOSE blas_trans(Trans t) { return t == Trans::no ? CblasNoTrans : CblasTrans; }

// Leading dims as BLAS requires them (at least the stored row length, and at least 1).
void check_ld(const GemmDims& d) {
  const int64_t a_cols = d.trans_a == Trans::no ? d.k : d.m;
  const int64_t b_cols = d.trans_b == Trans::no ? d.n : d.k;
  HT_ASSERT(d.lda >= std::max<int64_t>(1, a_cols) && d.ldb >= std::max<int64_t>(1, b_cols) &&
                d.ldc >= std::max<int64_t>(1, d.n),
            "gemm: bad leading dims lda {} ldb {} ldc {} for m {} n {} k {}", d.lda, d.ldb, d.ldc, d.m, d.n, d.k);
}

// Note [Narrow products on the CPU]
// bf16, f16 and fp8 widen to f32 exactly, so the product of narrow operands is OpenBLAS's sgemm over their
// widened copies, accumulated in f32 and rounded to Out once per element (Out = T, or f32 for gemm_acc):
// what the tensor cores compute, and the same precision as a loop over k, in sgemm's summation order. The
// copies (op(A) as (m, k), op(B) as (k, n), and C when beta reads it) cost O(mk + kn + mn) against the
// product's O(mnk), and sgemm is blocked for the caches and threaded, which a loop over k is not: on the CPU the
// products are most of a training step, so narrow dtypes train at nearly f32's speed.
template <class T, class Out>
void gemm_widened(const GemmDims& d, const T* a, const T* b, Out* c) {
  if (trivial_product(d, c)) return;
  std::vector<float> aw(static_cast<std::size_t>(d.m * d.k)), bw(static_cast<std::size_t>(d.k * d.n));
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t p = 0; p < d.k; ++p) aw[static_cast<std::size_t>(i * d.k + p)] = convert<float>(at_a(d, a, i, p));
  for (int64_t p = 0; p < d.k; ++p)
    for (int64_t j = 0; j < d.n; ++j) bw[static_cast<std::size_t>(p * d.n + j)] = convert<float>(at_b(d, b, p, j));
  constexpr bool f32_out = std::is_same_v<Out, float>;  // an f32 C takes sgemm's output (and its beta) directly
  std::vector<float> cw(f32_out ? 0 : static_cast<std::size_t>(d.m * d.n));
  float* cf = nullptr;
  blasint ldc = 0;
  if constexpr (f32_out) {
    cf = c;
    ldc = blas_int(d.ldc, "ldc");
  } else {
    cf = cw.data();
    ldc = blas_int(d.n, "n");
    if (d.beta != 0.0)
      for (int64_t i = 0; i < d.m; ++i)
        for (int64_t j = 0; j < d.n; ++j) cw[static_cast<std::size_t>(i * d.n + j)] = convert<float>(c[i * d.ldc + j]);
  }
  const blasint m = blas_int(d.m, "m"), n = blas_int(d.n, "n"), k = blas_int(d.k, "k");
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, aw.data(), k, bw.data(), n,
              static_cast<float>(d.beta), cf, ldc);
  if constexpr (!f32_out)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) c[i * d.ldc + j] = convert<Out>(cw[static_cast<std::size_t>(i * d.n + j)]);
}

}  // namespace

template <class T>
void gemm(const GemmDims& d, const T* a, const T* b, T* c) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (trivial_product(d, c)) return;
    check_ld(d);
    const blasint m = blas_int(d.m, "m"), n = blas_int(d.n, "n"), k = blas_int(d.k, "k");
    const blasint lda = blas_int(d.lda, "lda"), ldb = blas_int(d.ldb, "ldb"), ldc = blas_int(d.ldc, "ldc");
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, blas_trans(d.trans_a), blas_trans(d.trans_b), m, n, k, 1.0f, a, lda, b, ldb,
                  static_cast<float>(d.beta), c, ldc);
    else
      cblas_dgemm(CblasRowMajor, blas_trans(d.trans_a), blas_trans(d.trans_b), m, n, k, 1.0, a, lda, b, ldb, d.beta,
                  c, ldc);
  } else {
    gemm_widened<T, T>(d, a, b, c);
  }
}

template <class T>
void gemm_acc(const GemmDims& d, const T* a, const T* b, acc_t<T>* c) {
  if constexpr (std::is_same_v<acc_t<T>, T>) gemm<T>(d, a, b, c);
  else gemm_widened<T, acc_t<T>>(d, a, b, c);
}

#define HT_INSTANTIATE_GEMM(T)                                         \
  template void gemm<T>(const GemmDims&, const T*, const T*, T*); \
  template void gemm_acc<T>(const GemmDims&, const T*, const T*, acc_t<T>*);
HT_INSTANTIATE_GEMM(float)
HT_INSTANTIATE_GEMM(double)
HT_INSTANTIATE_GEMM(bf16)
HT_INSTANTIATE_GEMM(f16)
HT_INSTANTIATE_GEMM(f8e4m3)
HT_INSTANTIATE_GEMM(f8e5m2)
#undef HT_INSTANTIATE_GEMM

std::optional<MatrixLayout> gemm_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  // The stride of a size-1 dim is never used, so it cannot spoil either layout.
  const bool one_row = rows == 1, one_col = cols == 1;
  if ((one_col || col_stride == 1) && (one_row || row_stride >= std::max<int64_t>(1, cols)))
    return MatrixLayout{Trans::no, one_row ? std::max<int64_t>(1, cols) : row_stride};
  if ((one_row || row_stride == 1) && (one_col || col_stride >= std::max<int64_t>(1, rows)))
    return MatrixLayout{Trans::yes, one_col ? std::max<int64_t>(1, rows) : col_stride};
  return std::nullopt;
}

GemmOperand gemm_operand(const Tensor& t) {
  HT_ASSERT(t.dim() >= 2, "gemm_operand: {} is not a matrix", t.describe());
  const int nd = t.dim();
  auto layout = [](const Tensor& m) {
    const int n = m.dim();
    return gemm_layout(m.shape()[n - 2], m.shape()[n - 1], m.strides()[n - 2], m.strides()[n - 1]);
  };
  if (t.numel() == 0) return {t, MatrixLayout{Trans::no, std::max<int64_t>(1, t.shape()[nd - 1])}};  // never read
  if (auto l = layout(t)) return {t, *l};
  Tensor c = contiguous(t);
  auto l = layout(c);
  HT_ASSERT(l.has_value(), "gemm_operand: contiguous copy {} (dims {}) has no GEMM layout", c.describe(), nd);
  return {c, *l};
}

GemmDims gemm_dims(int64_t m, int64_t n, int64_t k, const MatrixLayout& a, const MatrixLayout& b) {
  GemmDims d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_a = a.trans;
  d.lda = a.ld;
  d.trans_b = b.trans;
  d.ldb = b.ld;
  d.ldc = std::max<int64_t>(1, n);
  return d;
}

}  // namespace ht::cpu
