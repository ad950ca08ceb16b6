// Messages of failed CUDA / cuBLAS calls and kernel launches (HT_CUDA_CHECK, HT_CUBLAS_CHECK, launch checks).
#include <cstring>

#include "hadatrain/cuda/check.h"
#include "hadatrain/tensor/dtype.h"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::cuda {
namespace {
const char* basename_of(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace

void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err) {
  (void)cudaGetLastError();  // clear the (non-sticky) error so it is reported once
  throw CudaError(fmt::format("CUDA error: {} failed with {} ({}) [{}:{}]", expr, cudaGetErrorName(err),
                              cudaGetErrorString(err), basename_of(file), line),
                  static_cast<int>(err));
}

void throw_cublas_error(const char* file, int line, const char* expr, cublasStatus_t status) {
  throw CudaError(fmt::format("cuBLAS error: {} failed with {} ({}) [{}:{}]", expr, cublasGetStatusName(status),
                              cublasGetStatusString(status), basename_of(file), line),
                  static_cast<int>(status));
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) [[unlikely]]
    throw_cuda_error(file, line, fmt::format("launch of {}", kernel).c_str(), err);
}

void unsupported_dtype(const char* kernel, int dtype_code, const char* file, int line) {
  const std::string what = dtype_code >= 0 && dtype_code < kNumDTypes
                               ? std::string(dtype_name(static_cast<DType>(dtype_code)))
                               : "(unsupported element size)";
  throw_assert_failure(file, line, "dtype supported", fmt::format("{}: no CUDA kernel for dtype {}", kernel, what));
}

}  // namespace ht::cuda
