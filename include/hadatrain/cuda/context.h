// The per-thread CUDA device context: current device, current stream per device, and lazily created
// library state (a cuBLASLt handle and its workspace per device and stream). Changed only through the
// RAII guards below, so the implicit state is always restored (DESIGN.md rule 4).
//
// Note [Current stream]
// Each thread starts on device 0 (or whatever cudaGetDevice reports at first use) and, on every device,
// on the legacy default stream (nullptr). Ops launch their kernels on current_stream(); memory is
// allocated and freed in the order of the stream that was current at allocation (see allocator.h).
// A tensor used on another stream must be synchronised with events by the code that does so.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "hadatrain/cuda/check.h"

namespace ht::cuda {

inline constexpr int kMaxDevices = 64;

// Number of visible CUDA devices; 0 (not an exception) when there is no driver or no GPU. Cached.
int device_count();
// Throws ht::Error unless 0 <= index < device_count(), naming `what`.
void check_device(int index, const char* what);

// This thread's current device index.
int current_device();
// This thread's current stream on `device` (default: the current device). nullptr = legacy default stream.
cudaStream_t current_stream(int device = -1);

// Sets the current device for the lifetime of the guard (cudaSetDevice only when it changes).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// Makes `stream` (of `device`, default the current device) current for the lifetime of the guard.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream, int device = -1);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// An owned, non-blocking stream on one device. Memory allocated while it was current is freed in its
// order (Note [Stream-ordered frees]); the destructor synchronises the stream, releases this thread's
// cuBLASLt workspace for it and tells the allocator, which frees tensors that outlive the stream in the
// legacy default stream's order (a free on the destroyed handle crashed inside the driver).
class Stream {
 public:
  explicit Stream(int device = -1, int priority = 0);
  ~Stream();
  Stream(Stream&& o) noexcept : stream_(o.stream_), device_(o.device_) { o.stream_ = nullptr; }
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

// An owned CUDA event (timing disabled unless asked for).
enum class EventTiming { off, on };
class Event {
 public:
  explicit Event(EventTiming timing = EventTiming::off);
  ~Event();
  Event(Event&& o) noexcept : event_(o.event_), device_(o.device_) { o.event_ = nullptr; }
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  // Records the event on `stream` (default: the current stream of the current device).
  void record(cudaStream_t stream);
  void record();
  // Makes `stream` wait for the recorded work without blocking the host (nullptr: the legacy default
  // stream of the current device).
  void wait(cudaStream_t stream) const;
  void synchronize() const;
  bool query() const;  // true when the recorded work has completed
  // Milliseconds between `start` and this event (both recorded, timing on).
  float elapsed_ms_since(const Event& start) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = 0;
};

// This thread's side stream on `device` (Note [Side branches] in tensor/side_branch.h): a non-blocking stream made
// on first use together with its cuBLASLt workspace, kept until the thread exits. nullptr when it does not exist
// yet and this thread is recording a step (a workspace allocated then would be the recording's memory).
cudaStream_t side_stream(int device = -1);

// Blocks until all work queued on the current stream of `device` has finished.
void synchronize_stream(int device = -1);

// cuBLASLt handle for this thread and the current device, created on first use.
cublasLtHandle_t cublaslt_handle();
// Workspace for cuBLASLt on the current device and stream (allocated once per thread, device and stream
// through the caching allocator, kept until the thread exits).
struct Workspace {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};
Workspace cublas_workspace();
inline constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;  // 32 MiB (Hopper)

}  // namespace ht::cuda
