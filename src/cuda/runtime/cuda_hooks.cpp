// The CUDA build's CudaHooks: device count, copies between host and device memory, synchronisation,
// pinned host memory, side branches.
// The first call of cuda_hooks() installs the caching allocator for DeviceType::CUDA.
#include "hadatrain/tensor/cuda_hooks.h"

#include <cstring>
#include <optional>
#include <vector>

#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/core/capture.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/pinned_host.h"

namespace ht {
namespace {

// A fork of one device's current stream (Note [Side branches] in tensor/side_branch.h). Its events (the fork and
// one per mark) are its own, destroyed with it: a recorded event may be destroyed before its work completes.
class CudaBranch final : public BranchBackend {
 public:
  CudaBranch(int device, cudaStream_t main, cudaStream_t side) : device_(device), main_(main), side_(side) {
    cuda::DeviceGuard g(device_);
    const cudaEvent_t fork = record(main_);
    HT_CUDA_CHECK(cudaStreamWaitEvent(side_, fork, 0));
  }
  ~CudaBranch() override {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  void enter() override {
    device_guard_.emplace(device_);
    stream_guard_.emplace(side_, device_);
  }
  void leave() override {
    stream_guard_.reset();
    device_guard_.reset();
  }
  int mark() override {
    cuda::DeviceGuard g(device_);
    record(side_);
    return static_cast<int>(events_.size()) - 1;
  }
  void wait(int mark, const std::vector<StorageImpl*>& produced) override {
    HT_ASSERT(mark >= 1 && mark < static_cast<int>(events_.size()), "side branch: no mark {}", mark);
    cuda::DeviceGuard g(device_);
    HT_CUDA_CHECK(cudaStreamWaitEvent(main_, events_[static_cast<std::size_t>(mark)], 0));
    for (StorageImpl* s : produced) cuda::free_on_stream(s->data, main_);
  }

 private:
  cudaEvent_t record(cudaStream_t stream) {
    cudaEvent_t e = nullptr;
    HT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
    HT_CUDA_CHECK(cudaEventRecord(e, stream));
    return e;
  }
  int device_;
  cudaStream_t main_, side_;
  std::vector<cudaEvent_t> events_;  // [0] the fork, then one per mark
  std::optional<cuda::DeviceGuard> device_guard_;
  std::optional<cuda::StreamGuard> stream_guard_;
};

class CudaHooksImpl final : public CudaHooks {
 public:
  int device_count() const override { return cuda::device_count(); }

  // Host<->device copies from/to pageable host memory synchronise the stream, so the data is valid (and
  // the host buffer reusable) on return; with pinned host memory they stay asynchronous.
  void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t nbytes) const override {
    if (nbytes == 0) return;
    if (dst_dev.is_cpu() && src_dev.is_cpu()) {
      std::memcpy(dst, src, nbytes);
      return;
    }
    if (src_dev.is_cpu() || dst_dev.is_cpu()) {
      const bool to_device = src_dev.is_cpu();
      const int d = to_device ? dst_dev.index : src_dev.index;
      HT_CHECK(!step_capture_active() || cuda::is_pinned(to_device ? src : dst),
               "a {} copy of {} bytes through pageable host memory (item(), to_vector(), a CPU tensor used on the GPU) "
               "waits for the device, which a recorded step graph cannot do",
               to_device ? "host-to-device" : "device-to-host", nbytes);
      cuda::check_device(d, "copy_bytes");
      cuda::DeviceGuard g(d);
      const cudaStream_t s = cuda::current_stream(d);
      HT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
      const void* host = to_device ? src : dst;
      if (cuda::is_pinned(host)) cuda::record_pinned_use(host, s);  // Note [Pinned host memory]
      else HT_CUDA_CHECK(cudaStreamSynchronize(s));
      return;
    }
    cuda::check_device(src_dev.index, "copy_bytes");
    cuda::check_device(dst_dev.index, "copy_bytes");
    if (dst_dev.index == src_dev.index) {
      cuda::DeviceGuard g(dst_dev.index);
      HT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cuda::current_stream()));
      return;
    }
    // Across devices: the copy runs on the destination's current stream after the source's pending work,
    // and the source's stream waits for the copy (its memory may be freed in that stream's order).
    // Each stream is used while its device is current (nullptr names the current device's default stream).
    const cudaStream_t s_src = cuda::current_stream(src_dev.index), s_dst = cuda::current_stream(dst_dev.index);
    cuda::DeviceGuard gs(src_dev.index);
    cuda::Event src_ready;  // an event of the source device
    src_ready.record(s_src);
    std::optional<cuda::Event> copied;
    {
      cuda::DeviceGuard gd(dst_dev.index);
      copied.emplace();  // an event of the destination device
      src_ready.wait(s_dst);
      HT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, s_dst));
      copied->record(s_dst);
    }
    copied->wait(s_src);
  }

  DataPtr allocate_pinned(std::size_t nbytes, Device device) const override {
    HT_CHECK(device.is_cuda(), "pinned host memory is allocated for a CUDA device, got {}", to_string(device));
    cuda::check_device(device.index, "allocating pinned host memory");
    cuda::DeviceGuard g(device.index);  // every CUDA call of the cache (alloc, event queries) on that device
    return cuda::allocate_pinned_host(nbytes);
  }
  bool is_pinned(const void* ptr) const override { return cuda::is_pinned(ptr); }

  std::unique_ptr<BranchBackend> fork(Device dev) const override {
    cuda::check_device(dev.index, "fork");
    const cudaStream_t side = cuda::side_stream(dev.index);
    if (side == nullptr) return nullptr;
    return std::make_unique<CudaBranch>(dev.index, cuda::current_stream(dev.index), side);
  }

  void synchronize(Device dev) const override {
    if (dev.is_cpu()) return;
    cuda::check_device(dev.index, "synchronize");
    cuda::synchronize_stream(dev.index);
  }
};

}  // namespace

const CudaHooks* cuda_hooks() {
  static const CudaHooksImpl* const hooks = [] {
    set_allocator(DeviceType::CUDA, &cuda::caching_allocator());
    return new CudaHooksImpl();
  }();
  return hooks;
}

const CudaHooks& require_cuda(const char* what) {
  const CudaHooks* h = cuda_hooks();
  HT_CHECK(h->device_count() > 0,
           "{}: no CUDA device is visible (hadatrain was built with CUDA; check the driver, nvidia-smi and "
           "CUDA_VISIBLE_DEVICES)",
           what);
  return *h;
}

}  // namespace ht
