// cp.async (sm_80+): 16-byte and small copies from global into shared memory that complete asynchronously, in
// per-thread groups (commit, then wait until at most N groups are pending). Before sm_80 the copies are plain
// loads and stores (and so complete at once). Used by the staged norm kernels (rows_staged.cuh) and the wide
// HLA projection (hla.cu).
#pragma once

namespace ht::kernels {

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#else
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}
// 4 or 8 bytes (a row statistic).
template <int kBytes>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src), "n"(kBytes)
               : "memory");
#else
  if constexpr (kBytes == 8) *static_cast<unsigned long long*>(dst) = *static_cast<const unsigned long long*>(src);
  else *static_cast<unsigned*>(dst) = *static_cast<const unsigned*>(src);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `pending` (0..3) of this thread's committed copy groups are still in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
  }
#endif
}

}  // namespace ht::kernels
