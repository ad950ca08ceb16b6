// Page-locked (pinned) host buffers for fast, truly asynchronous host<->device transfers.
// A copy from or to pinned memory returns before the transfer is done: synchronise the stream (or an
// event recorded after the copy) before reading the destination or reusing the source.
#pragma once
#include <cstddef>

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

}  // namespace ht::cuda
