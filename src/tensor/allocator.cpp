// DataPtr ownership, the 64-byte-aligned CPU allocator and the per-device-type allocator table.
#include "hadatrain/tensor/allocator.h"

#include <array>
#include <cstdlib>
#include <new>

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/cuda_hooks.h"

namespace ht {

DataPtr& DataPtr::operator=(DataPtr&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    ctx_ = o.ctx_;
    del_ = o.del_;
    device_ = o.device_;
    o.ptr_ = o.ctx_ = nullptr;
    o.del_ = nullptr;
  }
  return *this;
}

void DataPtr::reset() {
  if (del_ && (ptr_ || ctx_)) del_(ptr_, ctx_);
  ptr_ = ctx_ = nullptr;
  del_ = nullptr;
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  DataPtr allocate(std::size_t nbytes, Device device) override {
    HT_ASSERT(device.is_cpu(), "CPU allocator asked for {}", to_string(device));
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, device);
    const std::size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    HT_CHECK(p != nullptr, "out of host memory: failed to allocate {} bytes", nbytes);
    return DataPtr(p, nullptr, [](void* ptr, void*) { std::free(ptr); }, device);
  }
};

CpuAllocator g_cpu_allocator;
std::array<Allocator*, 2> g_allocators{&g_cpu_allocator, nullptr};

}  // namespace

Allocator& allocator_for(DeviceType type) {
  if (type == DeviceType::CUDA) require_cuda("allocating CUDA memory");  // the first call installs the allocator
  Allocator* a = g_allocators[static_cast<std::size_t>(type)];
  HT_CHECK(a != nullptr, "no CUDA allocator is installed (the CUDA backend was not initialised)");
  return *a;
}

void set_allocator(DeviceType type, Allocator* alloc) { g_allocators[static_cast<std::size_t>(type)] = alloc; }

}  // namespace ht
