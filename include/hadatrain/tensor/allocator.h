// Allocator -> DataPtr -> Storage. A DataPtr owns raw bytes on one device; Storage shares a DataPtr
// between tensors that view the same memory. Each device type has one registered allocator:
// the CPU one (64-byte aligned) is built in; the CUDA backend registers its caching allocator.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hadatrain/tensor/device.h"

namespace ht {

class DataPtr {
 public:
  using Deleter = void (*)(void* ptr, void* ctx);
  DataPtr() = default;
  DataPtr(void* ptr, void* ctx, Deleter del, Device dev) : ptr_(ptr), ctx_(ctx), del_(del), device_(dev) {}
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  DataPtr(DataPtr&& o) noexcept { *this = std::move(o); }
  DataPtr& operator=(DataPtr&& o) noexcept;
  ~DataPtr() { reset(); }

  void* get() const { return ptr_; }
  Device device() const { return device_; }
  // The allocator's bookkeeping for this block and the function that frees it (the CUDA allocator reads them
  // back to move a block's free to another stream: Note [Side branches] in tensor/side_branch.h).
  void* context() const { return ctx_; }
  Deleter deleter() const { return del_; }
  void reset();

 private:
  void* ptr_ = nullptr;
  void* ctx_ = nullptr;
  Deleter del_ = nullptr;
  Device device_{};
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Allocates `nbytes` on `device`. Throws ht::Error saying how much was asked when it fails.
  virtual DataPtr allocate(std::size_t nbytes, Device device) = 0;
};

// The allocator for a device type. Throws "built without CUDA" for CUDA in a CPU-only build.
Allocator& allocator_for(DeviceType type);
// Installs the allocator for a device type (the CUDA backend does this once at start-up).
void set_allocator(DeviceType type, Allocator* alloc);

inline constexpr std::size_t kCpuAlignment = 64;

struct StorageImpl {
  DataPtr data;
  std::size_t nbytes = 0;
  // How many tensors kept for backward (SavedTensor: autograd nodes, pipeline states) hold this storage now.
  // A gradient pipeline that compresses its input need not when this is > 0 (Note [Shared saved inputs]).
  std::atomic<int32_t> graph_saves{0};
  // Note [Storage versions]: raised by every in-place write through the tensor API (copy_, fill_, add_, mul_) and
  // by the writers that update a storage outside it (an optimiser's step, in its host half Optimizer::begin_step,
  // which also runs before a replayed step graph; FSDP's gathers; a broadcast of parameters). What is derived from
  // a tensor's values and kept across steps (the halo pipeline's codes of a frozen weight) is valid while the
  // version it was made at is the storage's: code that writes an existing tensor through data_ptr() must call
  // mark_written (tensor/tensor.h). Freshly allocated outputs need not: a new storage is another identity. A
  // replayed CUDA graph runs no host code, so a write recorded in it raises the version only where host code
  // outside the graph does so for it, as begin_step does for the optimiser's update.
  std::atomic<uint64_t> version{0};
};

}  // namespace ht
