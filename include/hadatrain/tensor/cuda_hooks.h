// The narrow interface through which device-independent code reaches the CUDA backend (copies,
// device count, synchronisation). A CPU-only build has no hooks: cuda_hooks() returns nullptr and
// require_cuda() throws "built without CUDA".
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "hadatrain/tensor/allocator.h"
#include "hadatrain/tensor/device.h"

namespace ht {

// A fork of the current stream (Note [Side branches] in tensor/side_branch.h).
class BranchBackend {
 public:
  virtual ~BranchBackend() = default;
  virtual void enter() = 0;  // makes the side stream current on this thread
  virtual void leave() = 0;  // restores the stream current before enter()
  // Records the side stream's work queued so far; returns the mark's number.
  virtual int mark() = 0;
  // The forking stream waits for the marked work; each storage's memory is then freed in the forking stream's order.
  virtual void wait(int mark, const std::vector<StorageImpl*>& produced) = 0;
};

class CudaHooks {
 public:
  virtual ~CudaHooks() = default;
  virtual int device_count() const = 0;
  // Copies nbytes between any two of host/device memory, ordered on the current stream of the device side.
  virtual void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t nbytes) const = 0;
  // Waits for all work queued on the current stream of `dev`.
  virtual void synchronize(Device dev) const = 0;
  // Page-locked host memory (a CPU DataPtr) from the pinned-host cache, allocated with `device` (the CUDA
  // device the memory is meant for) current, so a worker thread creates no context on another GPU; its
  // deleter returns the block to the cache, which reuses it only after every copy that used it has finished
  // (Note [Pinned host memory]).
  virtual DataPtr allocate_pinned(std::size_t nbytes, Device device) const = 0;
  // True when `ptr` points into page-locked host memory.
  virtual bool is_pinned(const void* ptr) const = 0;
  // Forks the current stream of `dev` (a CUDA device): work queued on the returned branch's side stream runs
  // after everything queued so far and beside what follows. nullptr when no side stream can be used now (a
  // step is being recorded and this thread has not made its side stream yet).
  virtual std::unique_ptr<BranchBackend> fork(Device dev) const = 0;
};

// The CUDA backend's hooks, or nullptr in a CPU-only build.
const CudaHooks* cuda_hooks();
// The hooks; throws ht::Error "<what>: hadatrain was built without CUDA" when there are none.
const CudaHooks& require_cuda(const char* what);

}  // namespace ht
