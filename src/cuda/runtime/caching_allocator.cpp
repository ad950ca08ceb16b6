// The CUDA caching allocator (Note [Stream-ordered frees] in cuda/caching_allocator.h): cudaMallocFromPoolAsync
// from each device's default memory pool with an unlimited release threshold, plus byte accounting.
#include "hadatrain/cuda/caching_allocator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "hadatrain/core/capture.h"
#include "hadatrain/cuda/context.h"

namespace ht::cuda {
namespace {

struct DeviceState {
  std::once_flag init;
  cudaMemPool_t pool = nullptr;
  std::size_t total_bytes = 0;  // device memory size
  std::atomic<std::size_t> allocated{0}, peak{0};
  std::atomic<uint64_t> allocs{0}, frees{0}, ooms{0};
};

std::array<DeviceState, kMaxDevices> g_state;
std::atomic<int> g_poison_byte{-1};

// What a DataPtr's context records about its block: where and on which stream it was allocated, and
// whether it was allocated while a step graph was recorded (then it is the graph's memory: cuda/graph.h).
struct Block {
  int device;
  cudaStream_t stream;
  std::size_t nbytes;
  bool graph;
};

// Step-graph bookkeeping (Note [Step graphs]): recordings in progress in the process, graph blocks alive,
// and frees of older blocks that arrived during a recording (held back until it ends).
std::atomic<int> g_recordings{0};
std::atomic<int64_t> g_graph_blocks{0};
std::mutex g_deferred_mutex;
std::vector<std::pair<void*, Block*>> g_deferred;

// Owned streams (cuda::Stream) destroyed while blocks allocated on them were still alive: such a block is
// freed in the legacy default stream's order (the destroyed stream was synchronised first, so every use of
// the block queued there has run). A new stream that reuses a handle takes it off the list.
std::mutex g_retired_mutex;
std::vector<cudaStream_t> g_retired;
std::atomic<int> g_retired_count{0};

// The stream to free `b` in: its allocation stream, or the legacy default stream once that was destroyed.
cudaStream_t free_stream(const Block* b) {
  if (b->stream == nullptr || g_retired_count.load(std::memory_order_acquire) == 0) return b->stream;
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  return std::find(g_retired.begin(), g_retired.end(), b->stream) == g_retired.end() ? b->stream : nullptr;
}

void release(void* ptr, Block* b) {
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != b->device) (void)cudaSetDevice(b->device);
  if (cudaFreeAsync(ptr, free_stream(b)) != cudaSuccess) (void)cudaGetLastError();  // e.g. runtime shutting down
  if (prev >= 0 && prev != b->device) (void)cudaSetDevice(prev);
  DeviceState& st = g_state[static_cast<std::size_t>(b->device)];
  st.allocated.fetch_sub(b->nbytes, std::memory_order_relaxed);
  st.frees.fetch_add(1, std::memory_order_relaxed);
  delete b;
}

DeviceState& state(int device, const char* what) {
  check_device(device, what);
  DeviceState& st = g_state[static_cast<std::size_t>(device)];
  std::call_once(st.init, [&] {
    DeviceGuard g(device);
    HT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&st.pool, device));
    uint64_t threshold = std::numeric_limits<uint64_t>::max();  // never give freed memory back on sync
    HT_CUDA_CHECK(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    std::size_t free = 0;
    HT_CUDA_CHECK(cudaMemGetInfo(&free, &st.total_bytes));
  });
  return st;
}

uint64_t pool_attr(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t v = 0;
  HT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, attr, &v));
  return v;
}

void update_peak(DeviceState& st, std::size_t now) {
  std::size_t peak = st.peak.load(std::memory_order_relaxed);
  while (now > peak && !st.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// DataPtr deleter: frees on the allocation stream (Note [Stream-ordered frees]). Never throws; it touches
// neither the thread context nor anything that may already be destroyed at process exit.
// A block allocated before a recording and dropped during it on the recording stream is held back: the
// recorded work may still read it at replay, and a free node may only release the graph's own memory.
void free_block(void* ptr, void* ctx) {
  Block* b = static_cast<Block*>(ctx);
  if (b->graph) {
    g_graph_blocks.fetch_sub(1, std::memory_order_relaxed);
  } else if (g_recordings.load(std::memory_order_relaxed) > 0) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const cudaStream_t stream = free_stream(b);
    if (stream != nullptr && cudaStreamIsCapturing(stream, &cs) != cudaSuccess) (void)cudaGetLastError();
    if (cs != cudaStreamCaptureStatusNone) {
      std::lock_guard<std::mutex> lock(g_deferred_mutex);
      g_deferred.emplace_back(ptr, b);
      return;
    }
  }
  release(ptr, b);
}

[[noreturn]] void throw_oom(DeviceState& st, int device, std::size_t nbytes) {
  st.ooms.fetch_add(1, std::memory_order_relaxed);
  std::size_t free = 0, total = st.total_bytes;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
  uint64_t reserved = 0;
  if (cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess)
    (void)cudaGetLastError();
  throw Error(fmt::format(
      "CUDA out of memory on cuda:{}: tried to allocate {}; allocated {}, reserved {}, free {} of total {} "
      "(reduce the batch or model size, or drop tensors that are no longer needed)",
      device, format_bytes(nbytes), format_bytes(st.allocated.load()), format_bytes(reserved), format_bytes(free),
      format_bytes(total)));
}

class CachingAllocator final : public Allocator {
 public:
  DataPtr allocate(std::size_t nbytes, Device device) override {
    HT_ASSERT(device.is_cuda(), "CUDA allocator asked for {}", to_string(device));
    DeviceState& st = state(device.index, "allocating CUDA memory");
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, device);
    if (nbytes > st.total_bytes) throw_oom(st, device.index, nbytes);  // can never fit
    DeviceGuard guard(device.index);
    const cudaStream_t stream = current_stream(device.index);
    void* p = nullptr;
    cudaError_t err = cudaMallocFromPoolAsync(&p, nbytes, st.pool, stream);
    if (err == cudaErrorMemoryAllocation) {
      // Let frees pending on other streams complete and return fragmented cached memory, then retry once.
      (void)cudaGetLastError();
      HT_CUDA_CHECK(cudaDeviceSynchronize());
      HT_CUDA_CHECK(cudaMemPoolTrimTo(st.pool, 0));
      err = cudaMallocFromPoolAsync(&p, nbytes, st.pool, stream);
    }
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw_oom(st, device.index, nbytes);
    }
    HT_CUDA_CHECK(err);
    if (const int poison = g_poison_byte.load(std::memory_order_relaxed); poison >= 0)
      HT_CUDA_CHECK(cudaMemsetAsync(p, poison, nbytes, stream));
    const std::size_t now = st.allocated.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
    update_peak(st, now);
    st.allocs.fetch_add(1, std::memory_order_relaxed);
    const bool graph = step_capture_active();
    if (graph) g_graph_blocks.fetch_add(1, std::memory_order_relaxed);
    return DataPtr(p, new Block{device.index, stream, nbytes, graph}, &free_block, device);
  }
};

int resolve(int device) { return device < 0 ? current_device() : device; }

}  // namespace

Allocator& caching_allocator() {
  static CachingAllocator alloc;
  return alloc;
}

MemoryStats memory_stats(int device) {
  const int d = resolve(device);
  DeviceState& st = state(d, "memory_stats");
  MemoryStats s;
  s.allocated_bytes = st.allocated.load();
  s.peak_allocated_bytes = st.peak.load();
  s.reserved_bytes = pool_attr(st.pool, cudaMemPoolAttrReservedMemCurrent);
  // The pool's high-water mark restarts from zero on reset and only moves when the pool grows again.
  s.peak_reserved_bytes = std::max<std::size_t>(pool_attr(st.pool, cudaMemPoolAttrReservedMemHigh), s.reserved_bytes);
  s.num_allocs = st.allocs.load();
  s.num_frees = st.frees.load();
  s.num_ooms = st.ooms.load();
  return s;
}

void reset_peak(int device) {
  const int d = resolve(device);
  DeviceState& st = state(d, "reset_peak");
  st.peak.store(st.allocated.load());
  uint64_t zero = 0;  // the pool's high-water marks can only be reset to zero (= restart from current)
  HT_CUDA_CHECK(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReservedMemHigh, &zero));
  HT_CUDA_CHECK(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

void empty_cache(int device) {
  const int d = resolve(device);
  DeviceState& st = state(d, "empty_cache");
  DeviceGuard g(d);
  HT_CUDA_CHECK(cudaDeviceSynchronize());
  HT_CUDA_CHECK(cudaMemPoolTrimTo(st.pool, 0));
}

void free_on_stream(const DataPtr& data, cudaStream_t stream) {
  if (data.deleter() != &free_block || data.context() == nullptr) return;
  static_cast<Block*>(data.context())->stream = stream;
}

void recording_started() { g_recordings.fetch_add(1); }

std::size_t recording_finished() {
  g_recordings.fetch_sub(1);
  std::vector<std::pair<void*, Block*>> held;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    held.swap(g_deferred);
  }
  for (auto& [ptr, b] : held) release(ptr, b);
  return held.size();
}

int64_t live_graph_blocks() { return g_graph_blocks.load(); }

void note_stream_created(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  const auto it = std::find(g_retired.begin(), g_retired.end(), stream);
  if (it != g_retired.end()) {
    g_retired.erase(it);
    g_retired_count.fetch_sub(1, std::memory_order_release);
  }
}

void note_stream_destroyed(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  if (std::find(g_retired.begin(), g_retired.end(), stream) != g_retired.end()) return;
  g_retired.push_back(stream);
  g_retired_count.fetch_add(1, std::memory_order_release);
}

void set_poison_byte(int byte) { g_poison_byte.store(byte >= 0 && byte <= 255 ? byte : -1); }

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

}  // namespace ht::cuda
