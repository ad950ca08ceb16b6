// The CUDA device layer: error checks, device/stream guards, events, pinned memory, the hooks' copies,
// and the caching allocator (reuse, peak accounting, out-of-memory errors).
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cstring>
#include <numeric>

#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/pinned_host.h"
#include "hadatrain/tensor/cuda_hooks.h"

using namespace ht;

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;

std::vector<float> iota_floats(std::size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}
}  // namespace

TEST_CASE("HT_CUDA_CHECK keeps the expression and the CUDA error", "[gpu][device]") {
  CHECK(cuda::device_count() >= 1);
  CHECK(cuda_device_count() == cuda::device_count());
  CHECK_THROWS_WITH([] { HT_CUDA_CHECK(cudaSetDevice(9999)); }(),
                    HasSubstr("cudaSetDevice(9999)") && HasSubstr("cudaErrorInvalidDevice"));
  // The error is not left behind for the next check.
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_THROWS_AS([] { HT_CUDA_CHECK(cudaSetDevice(9999)); }(), CudaError);
  CHECK_THROWS_WITH(cuda::check_device(cuda::device_count(), "test"), HasSubstr("does not exist"));
}

TEST_CASE("DeviceGuard and StreamGuard restore the thread's context", "[gpu][device]") {
  const int dev = cuda::current_device();
  {
    cuda::DeviceGuard g(0);
    CHECK(cuda::current_device() == 0);
  }
  CHECK(cuda::current_device() == dev);
  CHECK_THROWS_WITH(cuda::DeviceGuard(cuda::device_count() + 3), HasSubstr("does not exist"));

  CHECK(cuda::current_stream() == nullptr);  // the legacy default stream
  cuda::Stream s;
  {
    cuda::StreamGuard sg(s.get());
    CHECK(cuda::current_stream() == s.get());
    // Work queued on the guarded stream: an op, then a copy back that synchronises that stream.
    Tensor a = from_vector(iota_floats(1000, 1.0f), {1000}, {DType::f32, test::kCuda});
    Tensor b = mul(a, 3.0);
    const auto v = b.to_vector<float>();
    CHECK(v[0] == 3.0f);
    CHECK(v[999] == 3000.0f);
  }
  CHECK(cuda::current_stream() == nullptr);
}

TEST_CASE("events order streams and time work", "[gpu][device]") {
  cuda::Stream producer, consumer;
  Tensor x = zeros({1 << 20}, {DType::f32, test::kCuda});
  cuda::synchronize_stream();  // the producer stream does not wait for the default stream by itself
  cuda::Event done;
  cuda::Event start(cuda::EventTiming::on), stop(cuda::EventTiming::on);
  Tensor y;
  {
    cuda::StreamGuard sg(producer.get());
    start.record();
    fill_(x, 2.5);
    stop.record();
    done.record();
  }
  {
    cuda::StreamGuard sg(consumer.get());
    done.wait(consumer.get());
    y = add(x, 1.0);
    consumer.synchronize();
  }
  stop.synchronize();
  CHECK(done.query());
  CHECK(stop.elapsed_ms_since(start) >= 0.0f);
  const auto v = y.to_vector<float>();
  CHECK(v.front() == 3.5f);
  CHECK(v.back() == 3.5f);
}

TEST_CASE("pinned buffers and the hooks' host<->device copies", "[gpu][device]") {
  const CudaHooks& hooks = require_cuda("test");
  const std::size_t n = 4097;
  const auto src = iota_floats(n, -7.0f);
  CHECK_FALSE(cuda::is_pinned(src.data()));
  cuda::PinnedBuffer pinned(n * sizeof(float));
  CHECK(cuda::is_pinned(pinned.data()));
  std::memcpy(pinned.data(), src.data(), n * sizeof(float));

  Tensor d = empty({static_cast<int64_t>(n)}, {DType::f32, test::kCuda});
  // pinned -> device is asynchronous: synchronise before reusing the pinned buffer
  hooks.copy_bytes(d.data_ptr(), d.device(), pinned.data(), Device::cpu(), n * sizeof(float));
  hooks.synchronize(d.device());
  std::memset(pinned.data(), 0, n * sizeof(float));
  // device -> pageable host is complete on return
  std::vector<float> back(n, 0.0f);
  hooks.copy_bytes(back.data(), Device::cpu(), d.data_ptr(), d.device(), n * sizeof(float));
  CHECK(back == src);
  // device -> pinned, then synchronise
  hooks.copy_bytes(pinned.data(), Device::cpu(), d.data_ptr(), d.device(), n * sizeof(float));
  hooks.synchronize(d.device());
  CHECK(std::memcmp(pinned.data(), src.data(), n * sizeof(float)) == 0);
  // device -> device
  Tensor e = empty({static_cast<int64_t>(n)}, {DType::f32, test::kCuda});
  hooks.copy_bytes(e.data_ptr(), e.device(), d.data_ptr(), d.device(), n * sizeof(float));
  CHECK(e.to_vector<float>() == src);

  cuda::PinnedBuffer moved = std::move(pinned);
  CHECK(pinned.data() == nullptr);
  CHECK(moved.size() == n * sizeof(float));
}

TEST_CASE("cuBLASLt handle and workspace are created once per thread and stream", "[gpu][device]") {
  cublasLtHandle_t h = cuda::cublaslt_handle();
  CHECK(h != nullptr);
  CHECK(cuda::cublaslt_handle() == h);
  const cuda::Workspace w = cuda::cublas_workspace();
  CHECK(w.ptr != nullptr);
  CHECK(w.bytes == cuda::kCublasWorkspaceBytes);
  CHECK(cuda::cublas_workspace().ptr == w.ptr);
  cuda::Stream s;
  cuda::StreamGuard sg(s.get());
  CHECK(cuda::cublas_workspace().ptr != w.ptr);  // another stream gets its own
}

TEST_CASE("the caching allocator reuses freed memory", "[gpu][allocator]") {
  cuda::synchronize_stream();
  const cuda::MemoryStats before = cuda::memory_stats();
  std::size_t reserved_after_first = 0;
  {
    Tensor t = empty({static_cast<int64_t>(64 * kMiB)}, {DType::u8, test::kCuda});
    const cuda::MemoryStats s = cuda::memory_stats();
    CHECK(s.allocated_bytes == before.allocated_bytes + 64 * kMiB);
    CHECK(s.reserved_bytes >= s.allocated_bytes);
    reserved_after_first = s.reserved_bytes;
  }
  CHECK(cuda::memory_stats().allocated_bytes == before.allocated_bytes);
  for (int i = 0; i < 10; ++i) {  // same size again and again: served from the pool's cache
    Tensor t = empty({static_cast<int64_t>(64 * kMiB)}, {DType::u8, test::kCuda});
    CHECK(cuda::memory_stats().reserved_bytes == reserved_after_first);
  }
  cuda::synchronize_stream();
  CHECK(cuda::memory_stats().reserved_bytes == reserved_after_first);  // freed memory stays cached
  const cuda::MemoryStats after = cuda::memory_stats();
  CHECK(after.num_allocs == before.num_allocs + 11);
  CHECK(after.num_frees == before.num_frees + 11);
  // Zero-byte tensors need no memory.
  Tensor empty_t = empty({0, 5}, {DType::f32, test::kCuda});
  CHECK(empty_t.numel() == 0);
  CHECK(cuda::memory_stats().allocated_bytes == before.allocated_bytes);
}

TEST_CASE("peak accounting follows allocations and reset_peak", "[gpu][allocator]") {
  cuda::reset_peak();
  const std::size_t base = cuda::memory_stats().allocated_bytes;
  CHECK(cuda::memory_stats().peak_allocated_bytes == base);
  {
    Tensor a = empty({static_cast<int64_t>(10 * kMiB)}, {DType::u8, test::kCuda});
    Tensor b = empty({static_cast<int64_t>(20 * kMiB)}, {DType::u8, test::kCuda});
    a = Tensor();
    const cuda::MemoryStats s = cuda::memory_stats();
    CHECK(s.allocated_bytes == base + 20 * kMiB);
    CHECK(s.peak_allocated_bytes == base + 30 * kMiB);
    CHECK(s.peak_reserved_bytes >= s.reserved_bytes);
    cuda::reset_peak();
    CHECK(cuda::memory_stats().peak_allocated_bytes == base + 20 * kMiB);
  }
  CHECK(cuda::memory_stats().peak_allocated_bytes == base + 20 * kMiB);
  cuda::reset_peak();
  CHECK(cuda::memory_stats().peak_allocated_bytes == base);
}

TEST_CASE("an impossible allocation throws the documented out-of-memory error", "[gpu][allocator]") {
  const uint64_t ooms = cuda::memory_stats().num_ooms;
  const int64_t pib = int64_t{1} << 50;
  CHECK_THROWS_WITH(empty({pib}, {DType::u8, test::kCuda}),
                    HasSubstr("CUDA out of memory on cuda:0: tried to allocate 1.00 PiB; allocated ") &&
                        HasSubstr(", reserved ") && HasSubstr(", free ") && HasSubstr(" of total "));
  CHECK_THROWS_AS(empty({pib}, {DType::u8, test::kCuda}), Error);
  // A request the size of the whole device reaches cudaMallocAsync, fails there and is reported the same way.
  std::size_t free = 0, total = 0;
  HT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  CHECK_THROWS_WITH(empty({static_cast<int64_t>(total)}, {DType::u8, test::kCuda}),
                    HasSubstr("CUDA out of memory on cuda:0: tried to allocate "));
  CHECK(cuda::memory_stats().num_ooms == ooms + 3);
  // Nothing is left broken: allocation and kernels still work.
  Tensor t = full({1000}, 1.5, {DType::f32, test::kCuda});
  CHECK(sum(t).item() == 1500.0);
}

TEST_CASE("format_bytes is human readable", "[gpu][allocator]") {
  CHECK(cuda::format_bytes(512) == "512 bytes");
  CHECK(cuda::format_bytes(1536) == "1.50 KiB");
  CHECK(cuda::format_bytes(std::size_t{3} << 30) == "3.00 GiB");
  CHECK(cuda::format_bytes(std::size_t{1} << 50) == "1.00 PiB");
}

TEST_CASE("CUDA tensors move between host and device with any dtype and layout", "[gpu][device]") {
  const Tensor host = test::random_input({37, 11}, 7, DType::f32);
  const Tensor dev = host.to(test::kCuda);
  CHECK(dev.is_cuda());
  CHECK(dev.device() == test::kCuda);
  CHECK(test::compare_bits(dev, host) == "");
  // non-contiguous source on either side
  CHECK(test::compare_bits(host.transpose(0, 1).to(test::kCuda), host.transpose(0, 1).contiguous()) == "");
  CHECK(dev.transpose(0, 1).to(Device::cpu()).to_vector<float>() == host.transpose(0, 1).to_vector<float>());
  // host -> device with conversion, device -> host with conversion
  CHECK(test::compare_bits(host.to(DType::bf16).to(test::kCuda), host.to(DType::bf16)) == "");
  CHECK(dev.to(Device::cpu()).to(DType::f64).to_vector<double>() == host.to(DType::f64).to_vector<double>());
  CHECK(dev.narrow(0, 3, 1).narrow(1, 4, 1).item() == host.narrow(0, 3, 1).narrow(1, 4, 1).item());
}
