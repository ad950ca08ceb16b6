// Matrix products on the GPU through cuBLASLt, on raw device pointers (host code, CUDA builds only):
//   row-major C (m, n) = alpha · op(A) (m, k) · op(B) (k, n) + beta · C [+ bias broadcast over rows],
// for `batch` matrices at fixed element strides (a stride of 0 reuses one A or B for every batch).
// f32 computes in fp32 (TF32 tensor cores only inside a Tf32Guard(Tf32::on)), f64 in fp64, bf16/f16
// accumulate in fp32 and round each output once. Runs on the current device's current stream with the
// per-thread cuBLASLt handle and workspace (cuda/context.h); descriptors and the chosen algorithm are
// cached per shape key and thread. Low-precision products (int8 -> int32, fp8 -> f32/bf16 with scales in
// device memory) go through gemm_lowp_nt below.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::cuda {

enum class Trans { no, yes };

// One (batched) product. With trans_a == no, A is stored (m, k) with row stride lda; with yes, A is
// stored (k, m) and used transposed. Likewise B: (k, n) or (n, k) with ldb. C is (m, n) with ldc.
// A and B have `dtype`; C has `c_dtype` (= dtype, or f32 for bf16/f16 inputs). `bias` (n elements of
// c_dtype, contiguous, or nullptr) is added to every row of every batch; it requires beta == 0.
struct GemmArgs {
  DType dtype = DType::f32;
  DType c_dtype = DType::f32;
  int64_t m = 0, n = 0, k = 0;
  Trans trans_a = Trans::no, trans_b = Trans::no;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch matrices
  double alpha = 1.0, beta = 0.0;
  const void* bias = nullptr;
};

// Throws ht::Error (bad arguments, unsupported dtypes) or ht::CudaError (cuBLAS failures), naming the shape.
void gemm(const GemmArgs& args);

// Low-precision "NT" products (Note [Low-precision GEMM] in src/cuda/libs/gemm_lowp.cpp), both operands K-contiguous:
//   row-major C (m, n) = a (m, k) · b (n, k)ᵀ                       for i8 x i8 -> i32 (exact), or
//   row-major C (m, n) = scale_a · scale_b · (a (m, k) · b (n, k)ᵀ)  for fp8 -> f32 / bf16,
// per batch at fixed element strides (0 = one a or b shared by every batch). a is stored with row stride
// lda >= k, b with ldb >= k, C with ldc >= n. fp8: a and b each f8e4m3 or f8e5m2 but not both f8e5m2
// (cuBLASLt has no e5m2 x e5m2 kernel); products and accumulation in fp32, one rounding to c_dtype.
// scale_a / scale_b point to one f32 each in DEVICE memory (nullptr = 1) and are read by the GPU when the
// product runs (the host never reads them; the plan cache does not depend on them or their values).
// Any sizes and alignments work: when cuBLASLt's int8/fp8 requirements are not met, the operands are
// copied into zero-padded, aligned buffers; if cuBLASLt still has no algorithm, a simple kernel runs.
// No host synchronisation, except once per new plan (shape) while HADATRAIN_GEMM_TUNE (default `lowp`)
// times the heuristic's candidate algorithms (Note [GEMM algorithm tuning] in src/cuda/libs/gemm_internal.h).
// Throws ht::Error on bad arguments or unsupported dtypes.
enum class Fp8Accum { precise, fast };  // fast = CUBLASLT_MATMUL_DESC_FAST_ACCUM (less accurate)
enum class LowpImpl { automatic, fallback_kernel };  // fallback_kernel: always our simple kernel (tests)
struct LowpGemmArgs {
  DType a_dtype = DType::i8, b_dtype = DType::i8;
  DType c_dtype = DType::i32;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch matrices
  const float* scale_a = nullptr;  // fp8 only: device pointers to one f32 each
  const float* scale_b = nullptr;
  // fp8 only, instead of scale_a / scale_b: outer-vector scales, f32 device vectors of m (one per row of a and
  // of C) and n (one per row of b, a column of C) values: C[i][j] = row_scale_a[i] · col_scale_b[j] ·
  // (a · bᵀ)[i][j], with one rounding (cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F). Only the cuBLASLt
  // path on operands in place takes them: when it cannot run (alignment, no algorithm, batch > 1),
  // gemm_lowp_nt computes nothing and returns LowpPath::unsupported, and the caller falls back.
  const float* row_scale_a = nullptr;
  const float* col_scale_b = nullptr;
  Fp8Accum accum = Fp8Accum::precise;
  LowpImpl impl = LowpImpl::automatic;
};

// How a low-precision product ran: cuBLASLt on the operands in place, cuBLASLt on zero-padded copies,
// the fallback kernel (cuda/kernels/lowp_gemm.cu), nothing to multiply (empty output, or k = 0: zeros), or not at
// all (outer-vector scales that cuBLASLt cannot take here; nothing was written).
enum class LowpPath { cublaslt, cublaslt_padded, kernel, trivial, unsupported };
const char* lowp_path_name(LowpPath p);

LowpPath gemm_lowp_nt(const LowpGemmArgs& args);

// Whether f32 products may use TF32 tensor cores (10-bit mantissa inputs). Per thread, off by default;
// changed only through the guard.
enum class Tf32 { off, on };
Tf32 tf32_mode();
class Tf32Guard {
 public:
  explicit Tf32Guard(Tf32 mode);
  ~Tf32Guard();
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  Tf32 previous_;
};

// Number of cached (shape, dtypes, transposes, batch) plans of this thread, low-precision ones included
// (tests and diagnostics).
std::size_t gemm_plan_cache_size();

}  // namespace ht::cuda
