// Checks for CUDA runtime and cuBLAS calls. HT_CUDA_CHECK(expr) throws ht::CudaError naming the
// expression, the file and line, and the CUDA error name and description. Host C++ (src/cuda, src/ops
// CUDA branches and kernel launchers) uses it; kernels themselves never check or throw.
#pragma once
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "hadatrain/core/error.h"

namespace ht {

// A failed CUDA/cuBLAS call. `code()` is the raw status (cudaError_t or cublasStatus_t value).
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

namespace cuda {
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err);
[[noreturn]] void throw_cublas_error(const char* file, int line, const char* expr, cublasStatus_t status);
}  // namespace cuda

}  // namespace ht

// HT_CUDA_CHECK(cudaMemcpyAsync(...)): throws ht::CudaError when the call does not return cudaSuccess.
// The runtime's last-error slot is cleared first so that a later cudaGetLastError() does not see it again.
#ifndef HT_CUDA_CHECK  // cuda/kernels/kernel_launch.cuh defines the same macro for .cu files
#define HT_CUDA_CHECK(expr)                                                             \
  do {                                                                                  \
    const cudaError_t ht_cuda_err_ = (expr);                                            \
    if (ht_cuda_err_ != cudaSuccess) [[unlikely]]                                       \
      ::ht::cuda::throw_cuda_error(__FILE__, __LINE__, #expr, ht_cuda_err_);            \
  } while (0)
#endif

// HT_CUBLAS_CHECK(cublasLtMatmul(...)): throws ht::CudaError when the status is not CUBLAS_STATUS_SUCCESS.
#define HT_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                  \
    const cublasStatus_t ht_cublas_st_ = (expr);                                        \
    if (ht_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                            \
      ::ht::cuda::throw_cublas_error(__FILE__, __LINE__, #expr, ht_cublas_st_);         \
  } while (0)

// After a kernel launch: throws if the launch failed (bad configuration, no device, earlier fault).
#define HT_CUDA_CHECK_LAUNCH() HT_CUDA_CHECK(cudaGetLastError())
