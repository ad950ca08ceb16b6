// The per-thread CUDA device context (Note [Current stream] in cuda/context.h): device and stream guards,
// owned streams and events, and the lazily created cuBLASLt handle and workspace.
#include "hadatrain/cuda/context.h"

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "hadatrain/core/capture.h"
#include "hadatrain/cuda/caching_allocator.h"

namespace ht::cuda {
namespace {

struct ThreadContext {
  int device = -1;                                   // -1 until first asked (then cudaGetDevice)
  std::array<cudaStream_t, kMaxDevices> stream{};    // current stream per device; nullptr = legacy default
  std::array<cublasLtHandle_t, kMaxDevices> lt{};    // cuBLASLt handles, created on first use
  std::map<std::pair<int, cudaStream_t>, DataPtr> workspaces;  // cuBLASLt workspace per (device, stream)

  ~ThreadContext() {
    workspaces.clear();  // frees through the caching allocator (errors at process exit are ignored there)
    for (cublasLtHandle_t h : lt)
      if (h) (void)cublasLtDestroy(h);
  }
};

ThreadContext& tctx() {
  thread_local ThreadContext ctx;
  return ctx;
}

int resolve(int device) { return device < 0 ? current_device() : device; }

}  // namespace

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver, no GPU, or driver too old: no devices
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

void check_device(int index, const char* what) {
  const int n = device_count();
  HT_CHECK(n > 0, "{}: no CUDA device is visible (check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES)", what);
  HT_CHECK(index >= 0 && index < n && index < kMaxDevices, "{}: cuda:{} does not exist ({} CUDA device{} visible)",
           what, index, n, n == 1 ? " is" : "s are");
}

int current_device() {
  ThreadContext& c = tctx();
  if (c.device < 0) {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
      (void)cudaGetLastError();
      d = 0;
    }
    c.device = d;
  }
  return c.device;
}

cudaStream_t current_stream(int device) {
  const int d = resolve(device);
  HT_ASSERT(d >= 0 && d < kMaxDevices, "current_stream: device index {} out of range", d);
  return tctx().stream[static_cast<std::size_t>(d)];
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()) {
  if (device != previous_) {
    check_device(device, "DeviceGuard");
    HT_CUDA_CHECK(cudaSetDevice(device));
    tctx().device = device;
  }
}

DeviceGuard::~DeviceGuard() {
  ThreadContext& c = tctx();
  if (c.device != previous_) {
    (void)cudaSetDevice(previous_);  // cannot throw from a destructor; the device was valid before
    c.device = previous_;
  }
}

StreamGuard::StreamGuard(cudaStream_t stream, int device) : device_(resolve(device)) {
  check_device(device_, "StreamGuard");
  auto& slot = tctx().stream[static_cast<std::size_t>(device_)];
  previous_ = slot;
  slot = stream;
}

StreamGuard::~StreamGuard() { tctx().stream[static_cast<std::size_t>(device_)] = previous_; }

Stream::Stream(int device, int priority) : device_(resolve(device)) {
  DeviceGuard g(device_);
  HT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  note_stream_created(stream_);
}

Stream::~Stream() {
  if (!stream_) return;
  (void)cudaStreamSynchronize(stream_);
  tctx().workspaces.erase({device_, stream_});  // freed in this stream's order while it still exists
  note_stream_destroyed(stream_);  // tensors allocated here and still alive are freed on the legacy stream
  (void)cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { HT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(EventTiming timing) : device_(current_device()) {
  DeviceGuard g(device_);
  HT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing == EventTiming::on ? cudaEventDefault
                                                                            : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_) (void)cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) {
  DeviceGuard g(device_);
  HT_CUDA_CHECK(cudaEventRecord(event_, stream));
}
void Event::record() { record(current_stream(device_)); }
void Event::wait(cudaStream_t stream) const { HT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
void Event::synchronize() const { HT_CUDA_CHECK(cudaEventSynchronize(event_)); }

bool Event::query() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  HT_CUDA_CHECK(err);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  HT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

cudaStream_t side_stream(int device) {
  const int d = resolve(device);
  check_device(d, "side_stream");
  (void)tctx();  // made before the side streams, so destroyed after them (a Stream's destructor uses it)
  thread_local std::array<std::unique_ptr<Stream>, kMaxDevices> side;
  std::unique_ptr<Stream>& s = side[static_cast<std::size_t>(d)];
  if (!s) {
    if (step_capture_active()) return nullptr;
    DeviceGuard dg(d);
    // The default priority: a side stream of the greatest priority measured the same as HLQ's backward on the H200.
    s = std::make_unique<Stream>(d);
    StreamGuard on(s->get(), d);
    (void)cublas_workspace();  // now, outside any recording: a recorded branch's GEMMs find it
  }
  return s->get();
}

void synchronize_stream(int device) {
  const int d = resolve(device);
  DeviceGuard g(d);
  HT_CUDA_CHECK(cudaStreamSynchronize(current_stream(d)));
}

cublasLtHandle_t cublaslt_handle() {
  const int d = current_device();
  check_device(d, "cublaslt_handle");
  cublasLtHandle_t& h = tctx().lt[static_cast<std::size_t>(d)];
  if (!h) HT_CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

Workspace cublas_workspace() {
  const int d = current_device();
  const cudaStream_t s = current_stream(d);
  auto& ws = tctx().workspaces;
  auto it = ws.find({d, s});
  if (it == ws.end())
    it = ws.emplace(std::make_pair(d, s), caching_allocator().allocate(kCublasWorkspaceBytes, Device::cuda(d))).first;
  return {it->second.get(), kCublasWorkspaceBytes};
}

}  // namespace ht::cuda
