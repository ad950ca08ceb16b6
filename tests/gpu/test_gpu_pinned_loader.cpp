// Pinned data-loader batches and asynchronous host->device copies (Note [Pinned batches], Note [Pinned host
// memory]): batches from a pinned loader, copied to CUDA behind queued work and dropped at once (so their
// blocks go back to the cache while the copies are pending), equal the pageable loader's bit for bit; a
// freed pinned block is not handed out while a copy still reads it; tensor-level copies into pinned host
// memory are readable on return; the cache recycles blocks instead of growing.
#include "support/catch.h"
#include "support/gpu_testing.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <vector>

#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/pinned_host.h"
#include "hadatrain/data/loader.h"

using namespace ht;
using namespace ht::data;

namespace {

// Sample i: a 3x40x40 CHW image of random bytes drawn from the sample's own stream, label i % 10.
class NoiseDataset final : public Dataset {
 public:
  explicit NoiseDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Sample get(int64_t i, SampleRng& rng) const override {
    Image img = Image::zeros(40, 40, 3, ImageLayout::chw);
    for (auto& p : img.pixels) p = static_cast<uint8_t>(rng.next_u32() >> 24);
    return {img, i % 10};
  }
  std::string describe_sample(int64_t i) const override { return "noise-" + std::to_string(i); }

 private:
  int64_t n_;
};

// Queues about a millisecond of elementwise work on the current stream, so a copy issued next waits in the
// queue while the host goes on (drops the batch, lets the workers allocate new ones).
void keep_stream_busy(Tensor& busy) {
  for (int k = 0; k < 10; ++k) busy = busy * 1.0000001;
}

// A host tensor with a pattern that depends on `seed` (pageable memory).
Tensor pattern(int64_t n, uint32_t seed) {
  Tensor t = empty({n}, {DType::i32, Device::cpu()});
  auto* p = t.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(seed * 2654435761u + static_cast<uint32_t>(i) * 40503u);
  return t;
}

bool stream_pending() {
  const cudaError_t q = cudaStreamQuery(cuda::current_stream());
  (void)cudaGetLastError();  // cudaErrorNotReady is not an error: do not leave it for the next check
  return q == cudaErrorNotReady;
}

}  // namespace

TEST_CASE("pinned loader batches copied to CUDA equal the pageable path bit for bit", "[gpu][data][pinned]") {
  auto ds = std::make_shared<NoiseDataset>(300);  // 9 batches of 32 and one of 12 per epoch
  LoaderOptions o;
  o.batch_size = 32;
  o.num_workers = 2;
  o.prefetch = 2;  // few batches in flight: blocks come back to the workers quickly
  o.seed = 7;
  o.normalize = Normalize::cifar10();
  LoaderOptions po = o;
  po.pin_memory = true;
  DataLoader pageable(ds, o), pinned(ds, po);
  Tensor busy = full({int64_t{1} << 25}, 1.0, {DType::f32, test::kCuda});
  std::vector<Tensor> images_dev, labels_dev, images_ref, labels_ref;
  for (int epoch = 0; epoch < 3; ++epoch) {
    while (auto b = pinned.next()) {
      REQUIRE(is_pinned(b->at("image")));
      REQUIRE(is_pinned(b->at("label")));
      keep_stream_busy(busy);
      images_dev.push_back(b->at("image").to(test::kCuda));  // asynchronous: queued behind the busy work
      labels_dev.push_back(b->at("label").to(test::kCuda));
      // The pinned batch dies at the end of this iteration, while its copies are still queued.
      const auto r = pageable.next();
      REQUIRE(r.has_value());
      CHECK_FALSE(is_pinned(r->at("image")));
      CHECK(r->position == b->position);
      images_ref.push_back(r->at("image"));
      labels_ref.push_back(r->at("label"));
    }
    CHECK_FALSE(pageable.next().has_value());
  }
  REQUIRE(images_dev.size() == 30);
  for (std::size_t i = 0; i < images_dev.size(); ++i) {
    INFO("batch " << i);
    CHECK(test::compare_bits(images_dev[i], images_ref[i]) == "");
    CHECK(test::compare_bits(labels_dev[i], labels_ref[i]) == "");
  }
}

TEST_CASE("a freed pinned block is not reused while its copy is pending", "[gpu][pinned]") {
  const int64_t n = 750'001;  // an unusual size (about 3 MB): its own cache blocks
  Tensor busy = full({int64_t{1} << 25}, 1.0, {DType::f32, test::kCuda});
  for (uint32_t round = 0; round < 5; ++round) {
    const Tensor expected = pattern(n, round);
    Tensor a = empty_pinned({n}, DType::i32);
    REQUIRE(is_pinned(a));
    std::memcpy(a.data_ptr(), expected.data_ptr(), expected.nbytes());
    keep_stream_busy(busy);
    const Tensor on_device = a.to(test::kCuda);
    const void* a_ptr = a.data_ptr();
    a = Tensor();  // back to the cache with the copy still queued
    Tensor b = empty_pinned({n}, DType::i32);
    // If the stream is still busy now, the copy had not run when b was allocated: b must be another block.
    if (stream_pending()) CHECK(b.data_ptr() != a_ptr);
    std::memcpy(b.data_ptr(), pattern(n, 1000 + round).data_ptr(), b.nbytes());  // overwrite whatever b is
    CHECK(test::compare_bits(on_device, expected) == "");
  }
  cuda::synchronize_stream();
  // With nothing pending the cache hands the same blocks out again instead of growing.
  { Tensor warm = empty_pinned({n}, DType::i32); }
  const cuda::PinnedCacheStats before = cuda::pinned_cache_stats();
  for (int k = 0; k < 4; ++k) {
    Tensor t = empty_pinned({n}, DType::i32);
    const Tensor c = t.to(test::kCuda);
    cuda::synchronize_stream();
  }
  const cuda::PinnedCacheStats after = cuda::pinned_cache_stats();
  CHECK(after.blocks == before.blocks);
  CHECK(after.bytes == before.bytes);
}

TEST_CASE("copies into pinned host tensors are readable on return", "[gpu][pinned]") {
  const int64_t n = 100'003;
  Tensor busy = full({int64_t{1} << 25}, 1.0, {DType::f32, test::kCuda});
  const Tensor expected = pattern(n, 42);
  const Tensor on_device = expected.to(test::kCuda);
  Tensor host = empty_pinned({n}, DType::i32);
  REQUIRE(is_pinned(host));
  std::memset(host.data_ptr(), 0, host.nbytes());
  keep_stream_busy(busy);
  copy_(host, on_device);  // device -> pinned host behind queued work; must be complete on return
  CHECK(std::memcmp(host.data_ptr(), expected.data_ptr(), expected.nbytes()) == 0);
  // to(cpu) of a CUDA tensor and a non-contiguous pinned source keep working as before.
  keep_stream_busy(busy);
  const Tensor back = on_device.to(Device::cpu());
  CHECK(std::memcmp(back.data_ptr(), expected.data_ptr(), expected.nbytes()) == 0);
  const Tensor strided = slice(host, 0, 1, n, 2);  // every other element of the pinned tensor
  CHECK(test::compare_bits(strided.to(test::kCuda), slice(expected, 0, 1, n, 2).contiguous()) == "");
}
