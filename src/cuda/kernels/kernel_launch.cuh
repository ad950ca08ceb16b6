// Shared by every kernel launcher: grid sizing and the launch check. Kept free of fmt/spdlog so .cu files
// compile quickly; the check's message is built in src/cuda/runtime/check.cpp.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace ht::cuda {

// Throws ht::CudaError (declared in hadatrain/cuda/check.h, which .cu files cannot include: nvcc cannot
// compile fmt). HT_CUDA_CHECK below is the same macro as there.
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err);
// Throws ht::CudaError naming `kernel` when cudaGetLastError() reports a failed launch.
void check_launch(const char* kernel, const char* file, int line);
// Throws ht::InternalError: a launcher was called with a dtype it has no kernel for (op files convert
// unsupported dtypes before launching, so this is a hadatrain bug).
[[noreturn]] void unsupported_dtype(const char* kernel, int dtype_code, const char* file, int line);

inline constexpr int kBlock = 256;
// Blocks for a grid-stride loop over `work` items: enough to fill the GPU (capped), at least 1.
inline unsigned grid_for(int64_t work, int block = kBlock) {
  const int64_t blocks = (work + block - 1) / block;
  constexpr int64_t kMaxBlocks = 132 * 32;  // 4 waves of 8 resident 256-thread blocks on an H200's 132 SMs
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Blocks of `kernel` (threads and dynamic shared memory per block as given) resident at once on the current device:
// occupancy × SMs, for persistent grids; 0 when a query fails (the error is cleared, the caller picks a grid).
inline int64_t resident_blocks(const void* kernel, int threads, size_t smem) {
  int per_sm = 0, dev = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess ||
      cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(per_sm) * sms;
}

}  // namespace ht::cuda

#ifndef HT_CUDA_CHECK
#define HT_CUDA_CHECK(expr)                                                             \
  do {                                                                                  \
    const cudaError_t ht_cuda_err_ = (expr);                                            \
    if (ht_cuda_err_ != cudaSuccess) [[unlikely]]                                       \
      ::ht::cuda::throw_cuda_error(__FILE__, __LINE__, #expr, ht_cuda_err_);            \
  } while (0)
#endif
#define HT_CHECK_LAUNCH(kernel) ::ht::cuda::check_launch(kernel, __FILE__, __LINE__)
#define HT_UNSUPPORTED_DTYPE(kernel, dt) \
  ::ht::cuda::unsupported_dtype(kernel, static_cast<int>(dt), __FILE__, __LINE__)

namespace ht::kernels {

// Launches of one kernel path in this process (the GPU tests read it to see which kernel ran).
class LaunchCounter {
 public:
  void add() { n_.fetch_add(1, std::memory_order_relaxed); }
  int64_t get() const { return n_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> n_{0};
};

}  // namespace ht::kernels
