// cuBLASLt matrix products on raw device pointers (see cuda/cublaslt_gemm.h): gemm() for f32, f64, bf16 and f16,
// with the cublasGemmStridedBatchedEx fallback and the TF32 mode. The int8 / fp8 products are in
// gemm_lowp.cpp; the plan cache and algorithm tuning both use are in gemm_internal.h and gemm_plan.cpp.
//
// Note [Row-major GEMM on column-major cuBLAS]
// A row-major (r, c) matrix with row stride ld is, byte for byte, a column-major (c, r) matrix with
// leading dim ld: its transpose. So the row-major product C = op(A)·op(B) is computed as the column-major
// product Cᵀ (n, m) = op(B)ᵀ (n, k) · op(A)ᵀ (k, m): cuBLAS's first operand is our B and its second our A,
// each with our own transpose flag, and the bias (one value per column of C) is cuBLAS's per-row bias of
// Cᵀ, which is what CUBLASLT_EPILOGUE_BIAS adds.
#include "hadatrain/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <memory>

#include "gemm_internal.h"
#include "hadatrain/cuda/check.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/tensor/dtype.h"

namespace ht::cuda {
using namespace gemm_detail;

std::string gemm_detail::describe(const GemmArgs& g) {
  return fmt::format("gemm {} -> {}: m {} n {} k {}, trans_a {} trans_b {}, lda {} ldb {} ldc {}, batch {} (strides {} {} {}){}",
                     dtype_name(g.dtype), dtype_name(g.c_dtype), g.m, g.n, g.k, g.trans_a == Trans::yes ? "T" : "N",
                     g.trans_b == Trans::yes ? "T" : "N", g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b,
                     g.stride_c, g.bias ? ", bias" : "");
}

namespace {

thread_local Tf32 t_tf32 = Tf32::off;

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: HT_FAIL("gemm: no cuBLAS product for dtype {} (f32, f64, bf16 and f16 are supported)", dtype_name(dt));
  }
}

cublasComputeType_t compute_type(DType dt) {
  if (dt == DType::f64) return CUBLAS_COMPUTE_64F;
  if (dt == DType::f32 && t_tf32 == Tf32::on) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;  // f32, and fp32 accumulation for bf16/f16
}

cublasOperation_t op_of(Trans t) { return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

void check_args(const GemmArgs& g) {
  HT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, "gemm: negative size in {}", describe(g));
  HT_CHECK(g.c_dtype == g.dtype || (g.c_dtype == DType::f32 && (g.dtype == DType::bf16 || g.dtype == DType::f16)),
           "gemm: output dtype {} with inputs {} is not supported (same dtype, or f32 for bf16/f16 inputs)",
           dtype_name(g.c_dtype), dtype_name(g.dtype));
  const int64_t a_cols = g.trans_a == Trans::no ? g.k : g.m, b_cols = g.trans_b == Trans::no ? g.n : g.k;
  HT_CHECK(g.lda >= std::max<int64_t>(1, a_cols) && g.ldb >= std::max<int64_t>(1, b_cols) &&
               g.ldc >= std::max<int64_t>(1, g.n),
           "gemm: leading dims too small in {}", describe(g));
  HT_CHECK(g.batch <= INT32_MAX, "gemm: batch count above 2^31-1 in {}", describe(g));
  HT_CHECK(!g.bias || g.beta == 0.0, "gemm: a bias requires beta = 0 in {}", describe(g));
}

// Descriptors and the heuristic's best algorithm for g (Note [Row-major GEMM on column-major cuBLAS]).
std::unique_ptr<Plan> make_plan(const GemmArgs& g, const std::array<uint32_t, 4>& align) {
  auto p = std::make_unique<Plan>();
  const cublasComputeType_t ct = compute_type(g.dtype);
  const cudaDataType_t scale = g.dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  HT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, ct, scale));
  const cublasOperation_t opa = op_of(g.trans_b), opb = op_of(g.trans_a);
  HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  }
  const cudaDataType_t in = cuda_type(g.dtype), out = cuda_type(g.c_dtype);
  // cuBLAS's A = op(B)ᵀ (n, k): stored col-major (n, k) when B is not transposed, else (k, n).
  p->la = g.trans_b == Trans::no ? make_layout(in, g.n, g.k, g.ldb, g.batch, g.stride_b)
                                 : make_layout(in, g.k, g.n, g.ldb, g.batch, g.stride_b);
  // cuBLAS's B = op(A)ᵀ (k, m): stored col-major (k, m) when A is not transposed, else (m, k).
  p->lb = g.trans_a == Trans::no ? make_layout(in, g.k, g.m, g.lda, g.batch, g.stride_a)
                                 : make_layout(in, g.m, g.k, g.lda, g.batch, g.stride_a);
  p->lc = make_layout(out, g.n, g.m, g.ldc, g.batch, g.stride_c);

  find_algo(*p, align, tune_mode() == Tune::all && g.beta == 0.0);
  return p;
}

Plan& plan_for(const GemmArgs& g) {
  const std::size_t item = itemsize(g.dtype), citem = itemsize(g.c_dtype);
  // cuBLAS's A is our B, its B our A (Note [Row-major GEMM on column-major cuBLAS]).
  const std::array<uint32_t, 4> align = {alignment(g.b, g.stride_b, item, g.batch),
                                         alignment(g.a, g.stride_a, item, g.batch),
                                         alignment(g.c, g.stride_c, citem, g.batch),
                                         alignment(g.c, g.stride_c, citem, g.batch)};
  const uint32_t bias_align = g.bias ? alignment(g.bias, 0, citem, 1) : 0;
  const Key key = {current_device(), static_cast<int64_t>(g.dtype), static_cast<int64_t>(g.c_dtype),
                   static_cast<int64_t>(compute_type(g.dtype)), g.m, g.n, g.k,
                   static_cast<int64_t>(g.trans_a) * 2 + static_cast<int64_t>(g.trans_b), g.lda, g.ldb, g.ldc,
                   g.batch, g.stride_a, g.stride_b, g.stride_c, bias_align, align[0], align[1], align[2],
                   g.bias ? 1 : 0};
  auto& plans = state().plans;
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  if (plans.size() >= kMaxPlans) plans.clear();
  return *plans.emplace(key, make_plan(g, align)).first->second;
}

cublasHandle_t blas_handle(cudaStream_t stream) {
  const int d = current_device();
  cublasHandle_t& h = state().blas[static_cast<std::size_t>(d)];
  if (!h) HT_CUBLAS_CHECK(cublasCreate(&h));
  HT_CUBLAS_CHECK(cublasSetStream(h, stream));
  return h;
}

// cublasGemmStridedBatchedEx for products cuBLASLt has no algorithm for (no bias epilogue there).
void gemm_fallback(const GemmArgs& g, cudaStream_t stream) {
  HT_CHECK(!g.bias, "gemm: cuBLASLt has no algorithm with a bias epilogue for {}; add the bias separately",
           describe(g));
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
    HT_CHECK(v <= INT32_MAX, "gemm: size {} above 2^31-1 has no cuBLAS fallback ({})", v, describe(g));
  const cudaDataType_t in = cuda_type(g.dtype), out = cuda_type(g.c_dtype);
  const cublasComputeType_t ct = compute_type(g.dtype);
  const float af = static_cast<float>(g.alpha), bf = static_cast<float>(g.beta);
  const void* alpha = g.dtype == DType::f64 ? static_cast<const void*>(&g.alpha) : &af;
  const void* beta = g.dtype == DType::f64 ? static_cast<const void*>(&g.beta) : &bf;
  HT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas_handle(stream), op_of(g.trans_b), op_of(g.trans_a), static_cast<int>(g.n), static_cast<int>(g.m),
      static_cast<int>(g.k), alpha, g.b, in, static_cast<int>(g.ldb), g.stride_b, g.a, in, static_cast<int>(g.lda),
      g.stride_a, beta, g.c, out, static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch), ct,
      CUBLAS_GEMM_DEFAULT));
}

// k = 0: C = beta·C (no operand is read). Only beta 0 (zeros) and 1 (unchanged) are needed by the ops.
void gemm_empty_k(const GemmArgs& g, cudaStream_t stream) {
  HT_CHECK(!g.bias && (g.beta == 0.0 || g.beta == 1.0),
           "gemm: k = 0 is supported only with beta 0 or 1 and no bias ({})", describe(g));
  if (g.beta == 1.0) return;
  const std::size_t item = itemsize(g.c_dtype);
  for (int64_t i = 0; i < g.batch; ++i)  // all-zero bytes are +0 in every floating dtype
    HT_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(g.c) + i * g.stride_c * item, g.ldc * item, 0, g.n * item,
                                    g.m, stream));
}

}  // namespace

void gemm(const GemmArgs& g) {
  check_args(g);
  (void)cuda_type(g.dtype);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const cudaStream_t stream = current_stream();
  with_shape(g, [&] {
    if (g.k == 0) return gemm_empty_k(g, stream);
    Plan& p = plan_for(g);
    if (!p.has_algo) return gemm_fallback(g, stream);
    if (g.bias)
      HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    const float af = static_cast<float>(g.alpha), bf = static_cast<float>(g.beta);
    const void* alpha = g.dtype == DType::f64 ? static_cast<const void*>(&g.alpha) : &af;
    const void* beta = g.dtype == DType::f64 ? static_cast<const void*>(&g.beta) : &bf;
    run_plan(p, {alpha, beta, g.a, g.b, g.c}, stream);
  });
}

Tf32 tf32_mode() { return t_tf32; }
Tf32Guard::Tf32Guard(Tf32 mode) : previous_(t_tf32) { t_tf32 = mode; }
Tf32Guard::~Tf32Guard() { t_tf32 = previous_; }

std::size_t gemm_plan_cache_size() { return state().plans.size() + state().lowp_plans.size(); }

}  // namespace ht::cuda
