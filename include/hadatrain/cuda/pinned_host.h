// Page-locked (pinned) host buffers for fast, truly asynchronous host<->device transfers.
// A copy from or to pinned memory returns before the transfer is done: synchronise the stream (or an
// event recorded after the copy) before reading the destination or reusing the source.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "hadatrain/tensor/allocator.h"

namespace ht::cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);  // cudaHostAlloc; throws ht::Error on failure
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// True when `ptr` points into page-locked host memory (cudaHostAlloc or cudaHostRegister).
bool is_pinned(const void* ptr);

// The pinned-host cache behind empty_pinned (Note [Pinned host memory] in cuda/runtime/pinned_host.cpp): a CPU
// DataPtr whose deleter returns the block to the cache. Throws ht::Error when page-locked memory runs out.
DataPtr allocate_pinned_host(std::size_t nbytes);
// Marks the cached block holding `ptr` as used by work queued on `stream` (a stream of the current device):
// the block is not handed out again before that work has finished. No-op for memory outside the cache.
void record_pinned_use(const void* ptr, cudaStream_t stream);
// Blocks held by the cache (in use or free) and their total size, for tests and diagnostics.
struct PinnedCacheStats {
  std::size_t blocks = 0;
  std::size_t bytes = 0;
};
PinnedCacheStats pinned_cache_stats();

}  // namespace ht::cuda
