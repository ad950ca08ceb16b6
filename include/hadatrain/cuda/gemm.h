// Matrix products on the GPU through cuBLASLt, on raw device pointers (host code, CUDA builds only):
//   row-major C (m, n) = alpha · op(A) (m, k) · op(B) (k, n) + beta · C [+ bias broadcast over rows],
// for `batch` matrices at fixed element strides (a stride of 0 reuses one A or B for every batch).
// f32 computes in fp32 (TF32 tensor cores only inside a Tf32Guard(Tf32::on)), f64 in fp64, bf16/f16
// accumulate in fp32 and round each output once. Runs on the current device's current stream with the
// per-thread cuBLASLt handle and workspace (cuda/context.h); descriptors and the chosen algorithm are
// cached per shape key and thread.
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

// Number of cached (shape, dtypes, transposes, batch) plans of this thread (tests and diagnostics).
std::size_t gemm_plan_cache_size();

}  // namespace ht::cuda
