// Page-locked host buffers, the pinned-memory query used by host<->device copies, and the pinned-host cache
// behind empty_pinned (pinned data-loader batches).
#include "hadatrain/cuda/pinned_host.h"

#include <map>
#include <mutex>
#include <vector>

#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/check.h"

namespace ht::cuda {

// Note [Pinned host memory]
// Batches bound for a CUDA device are assembled in page-locked memory (empty_pinned; the data loader with
// LoaderOptions::pin_memory), so their host->device copy is one cudaMemcpyAsync on the current stream that
// returns at once: the host goes on queuing kernels while the DMA engine runs, and the kernels that read the
// copy are ordered after it on the stream. (Copies from pageable memory still synchronise the stream before
// they return, CudaHooks::copy_bytes.)
// The rule that makes this safe: the host memory of a copy must not be reused before the copy has run.
// Freeing it with cudaFreeHost would synchronise the device, so blocks go back to this cache instead, and
// every host<->device copy that touches a cached block records an event on its stream against the block
// (record_pinned_use, called by copy_bytes). A freed block is handed out again only once all its events have
// completed. So a caller may drop the host tensor right after `.to(cuda)` (the trainer does), and a loader
// worker can never assemble a new batch in memory that an earlier copy is still reading. What is NOT
// covered: writing into a pinned tensor that is still alive while its copy runs (nothing in hadatrain does:
// loader batches are written once, before they are handed out), and reading a pinned destination of a raw
// copy_bytes before synchronising (tensor-level copies to the host synchronise, ops/copy.cpp).
// Blocks are allocated with cudaHostAllocPortable (usable from every device) and kept until the process
// ends; a failed allocation first frees the idle blocks and retries.
namespace {

struct HostBlock {
  std::size_t size = 0;
  bool in_use = false;
  std::vector<cudaEvent_t> events;  // copies that used the block and may still be running
};

class PinnedHostCache {
 public:
  void* allocate(std::size_t nbytes) {
    const std::size_t want = round_up(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      HostBlock* best = nullptr;
      char* best_ptr = nullptr;
      for (auto& [ptr, b] : blocks_) {
        if (b.in_use || b.size < want || b.size > 2 * want || (best && b.size >= best->size)) continue;
        if (!drain(b)) continue;
        best = &b;
        best_ptr = ptr;
      }
      if (best) {
        best->in_use = true;
        return best_ptr;
      }
    }
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, want, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_idle();
      err = cudaHostAlloc(&p, want, cudaHostAllocPortable);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        HT_FAIL("out of pinned host memory: cudaHostAlloc of {} failed (set data.pin_memory: false to load "
                "batches into pageable memory)",
                format_bytes(want));
      }
    }
    HT_CUDA_CHECK(err);
    std::lock_guard<std::mutex> lock(mu_);
    HostBlock& b = blocks_[static_cast<char*>(p)];
    b.size = want;
    b.in_use = true;
    return p;
  }

  void release(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(static_cast<char*>(ptr));
    if (it != blocks_.end()) it->second.in_use = false;  // its pending events keep it from reuse
  }

  void record_use(const void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    HostBlock* b = find(ptr);
    if (b == nullptr) return;
    drain(*b);  // forget finished copies so the list stays short
    cudaEvent_t e = nullptr;
    HT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(e, stream);
    if (err != cudaSuccess) (void)cudaEventDestroy(e);
    HT_CUDA_CHECK(err);
    b->events.push_back(e);
  }

  PinnedCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    PinnedCacheStats s;
    for (const auto& [ptr, b] : blocks_) ++s.blocks, s.bytes += b.size;
    return s;
  }

 private:
  // Page-size multiples below 1 MiB, 1 MiB multiples above: equal batch sizes map to equal blocks.
  static std::size_t round_up(std::size_t n) {
    const std::size_t unit = n <= (std::size_t{1} << 20) ? 4096 : (std::size_t{1} << 20);
    return n == 0 ? unit : (n + unit - 1) / unit * unit;
  }

  // The block containing ptr (any address inside it), or nullptr.
  HostBlock* find(const void* ptr) {
    auto* p = static_cast<char*>(const_cast<void*>(ptr));
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return nullptr;
    --it;
    return p < it->first + it->second.size ? &it->second : nullptr;
  }

  // Drops the completed events of b; true when none is left.
  static bool drain(HostBlock& b) {
    std::size_t kept = 0;
    cudaError_t failure = cudaSuccess;
    for (cudaEvent_t e : b.events) {
      const cudaError_t q = cudaEventQuery(e);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        b.events[kept++] = e;
        continue;
      }
      (void)cudaEventDestroy(e);
      if (failure == cudaSuccess) failure = q;
    }
    b.events.resize(kept);
    HT_CUDA_CHECK(failure);  // a failed copy (sticky device error): report it here rather than reuse the block
    return kept == 0;
  }

  // Frees the idle blocks whose copies have finished (cudaFreeHost synchronises; only under memory pressure).
  void release_idle() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      if (!it->second.in_use && drain(it->second)) {
        (void)cudaFreeHost(it->first);
        it = blocks_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::mutex mu_;
  std::map<char*, HostBlock> blocks_;  // every block, by base address
};

PinnedHostCache& cache() {
  static PinnedHostCache* const c = new PinnedHostCache();  // never destroyed: tensors may outlive statics
  return *c;
}

}  // namespace

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    HT_FAIL("out of pinned host memory: cudaHostAlloc of {} failed", format_bytes(bytes));
  }
  HT_CUDA_CHECK(err);
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) (void)cudaFreeHost(ptr_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) (void)cudaFreeHost(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

bool is_pinned(const void* ptr) {
  if (ptr == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

DataPtr allocate_pinned_host(std::size_t nbytes) {
  if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, Device::cpu());
  void* p = cache().allocate(nbytes);
  return DataPtr(p, nullptr, [](void* ptr, void*) { cache().release(ptr); }, Device::cpu());
}

void record_pinned_use(const void* ptr, cudaStream_t stream) { cache().record_use(ptr, stream); }

PinnedCacheStats pinned_cache_stats() { return cache().stats(); }

}  // namespace ht::cuda
