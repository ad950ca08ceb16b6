// CPU GEMM: OpenBLAS for f32/f64, a reference loop with fp32 accumulation for bf16/f16/fp8 (see gemm.h).
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

// Reference product: op(B) is widened to fp32 once; each row of C accumulates in fp32 over k in order
// (c_ij = beta·c_ij + sum_p a_ip·b_pj) and is rounded to Out once.
template <class T, class Out>
void gemm_loop(const GemmDims& d, const T* a, const T* b, Out* c) {
  if (trivial_product(d, c)) return;
  using A = acc_t<T>;
  std::vector<A> bw(static_cast<std::size_t>(d.k * d.n));  // (k, n)
  for (int64_t p = 0; p < d.k; ++p)
    for (int64_t j = 0; j < d.n; ++j) bw[static_cast<std::size_t>(p * d.n + j)] = convert<A>(at_b(d, b, p, j));
  std::vector<A> acc(static_cast<std::size_t>(d.n));  // one row of C
  for (int64_t i = 0; i < d.m; ++i) {
    Out* crow = c + i * d.ldc;
    for (int64_t j = 0; j < d.n; ++j)
      acc[static_cast<std::size_t>(j)] = d.beta == 0.0 ? A(0) : static_cast<A>(d.beta) * convert<A>(crow[j]);
    for (int64_t p = 0; p < d.k; ++p) {
      const A av = convert<A>(at_a(d, a, i, p));
      const A* brow = bw.data() + p * d.n;
      for (int64_t j = 0; j < d.n; ++j) acc[static_cast<std::size_t>(j)] += av * brow[j];
    }
    for (int64_t j = 0; j < d.n; ++j) crow[j] = convert<Out>(acc[static_cast<std::size_t>(j)]);
  }
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
    gemm_loop<T, T>(d, a, b, c);
  }
}

template <class T>
void gemm_acc(const GemmDims& d, const T* a, const T* b, acc_t<T>* c) {
  if constexpr (std::is_same_v<acc_t<T>, T>) gemm<T>(d, a, b, c);
  else gemm_loop<T, acc_t<T>>(d, a, b, c);
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
