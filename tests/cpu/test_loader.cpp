// The data loader: coverage of every index per epoch, identical batches for any worker count, per-epoch
// shuffles, drop_last, resume from (epoch, batch), epoch boundaries, errors from workers, bounded prefetch,
// and the named tensors of a batch.
#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <unistd.h>

#include <filesystem>

#include "hadatrain/data/cifar.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"

using namespace ht;
using namespace ht::data;

namespace {

// Sample i is a 1x1x3 CHW image: pixels (i % 256, i / 256, one byte of the sample's first random word);
// label i % 7. Index `fail_at` throws.
class IndexDataset final : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  Sample get(int64_t i, SampleRng& rng) const override {
    calls.fetch_add(1);
    HT_CHECK(i != fail_at_, "bad record {} (checksum mismatch)", i);
    Image img = Image::zeros(1, 1, 3, ImageLayout::chw);
    img.pixels = {static_cast<uint8_t>(i % 256), static_cast<uint8_t>(i / 256), static_cast<uint8_t>(rng.next_u32() & 0xFF)};
    return {img, i % 7};
  }
  std::string describe_sample(int64_t i) const override { return "item-" + std::to_string(i); }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_, fail_at_;
};

// Everything a batch holds, as plain values.
struct Flat {
  std::vector<int64_t> indices, labels;
  std::vector<double> images;
  LoaderPosition pos;
  bool operator==(const Flat& o) const {
    return indices == o.indices && labels == o.labels && images == o.images && pos == o.pos;
  }
};
Flat flat(const Batch& b) { return {b.indices, b.at("label").to_vector<int64_t>(), b.at("image").to_vector<double>(), b.position}; }

// All batches of `epochs` epochs (nullopt marks each epoch's end).
std::vector<Flat> run(std::shared_ptr<const Dataset> ds, LoaderOptions o, int epochs, LoaderPosition start = {}) {
  DataLoader loader(std::move(ds), o, start);
  std::vector<Flat> out;
  for (int e = 0; e < epochs; ++e)
    while (auto b = loader.next()) out.push_back(flat(*b));
  return out;
}

LoaderOptions options(int workers, int64_t batch = 10) {
  LoaderOptions o;
  o.batch_size = batch;
  o.num_workers = workers;
  o.prefetch = 3;
  o.seed = 1234;
  return o;
}

}  // namespace

TEST_CASE("every index appears exactly once per epoch, rows match their samples", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(103);
  DataLoader loader(ds, options(2));
  CHECK(loader.batches_per_epoch() == 11);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    int64_t b = 0;
    while (auto batch = loader.next()) {
      CHECK(batch->position == LoaderPosition{epoch, b});
      CHECK(batch->size() == (b < 10 ? 10 : 3));
      REQUIRE(batch->at("image").shape() == Shape{batch->size(), 3, 1, 1});
      CHECK(batch->at("label").dtype() == DType::i64);
      const auto img = batch->at("image").to_vector<double>();
      const auto lab = batch->at("label").to_vector<int64_t>();
      for (int64_t k = 0; k < batch->size(); ++k) {
        const int64_t idx = batch->indices[static_cast<std::size_t>(k)];
        // Row k is sample idx, normalised to [0, 1], with its own (seed, epoch, idx) random draw.
        CHECK(img[static_cast<std::size_t>(3 * k)] == Approx((idx % 256) / 255.0));
        CHECK(img[static_cast<std::size_t>(3 * k + 1)] == Approx((idx / 256) / 255.0));
        const uint32_t w = SampleRng::for_sample(1234, epoch, idx).next_u32();
        CHECK(img[static_cast<std::size_t>(3 * k + 2)] == Approx((w & 0xFF) / 255.0));
        CHECK(lab[static_cast<std::size_t>(k)] == idx % 7);
        seen.push_back(idx);
      }
      ++b;
      CHECK(loader.position() == LoaderPosition{epoch, b});
    }
    CHECK(b == 11);
    CHECK(loader.position() == LoaderPosition{epoch + 1, 0});
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(103);
    std::iota(all.begin(), all.end(), 0);
    CHECK(sorted == all);
    CHECK(seen != all);  // shuffled
  }
}

TEST_CASE("batches are identical for 0, 1 and 3 workers", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(57);
  const auto ref = run(ds, options(0, 8), 3);
  CHECK(ref.size() == 3 * 8);
  CHECK(run(ds, options(1, 8), 3) == ref);
  CHECK(run(ds, options(3, 8), 3) == ref);
  LoaderOptions many = options(3, 8);
  many.prefetch = 1;  // workers mostly wait: still the same stream
  CHECK(run(ds, many, 3) == ref);
}

TEST_CASE("pin_memory gives the same batches; without a CUDA device it is a no-op", "[data][loader]") {
  // In a CPU-only build (or with no visible GPU) pinned batches are ordinary host tensors; with a GPU they
  // are page-locked. Either way every batch holds the same values as the pageable loader's.
  const CudaHooks* hooks = cuda_hooks();
  const bool can_pin = hooks != nullptr && hooks->device_count() > 0;
  auto ds = std::make_shared<IndexDataset>(53);
  for (int workers : {0, 2}) {
    LoaderOptions pinned = options(workers, 8);
    pinned.pin_memory = true;
    CHECK(run(ds, pinned, 2) == run(ds, options(workers, 8), 2));
    DataLoader loader(ds, pinned, {1, 3});
    const auto b = loader.next();
    REQUIRE(b.has_value());
    CHECK(b->position == LoaderPosition{1, 3});
    CHECK(b->at("image").is_cpu());
    CHECK(b->at("image").is_contiguous());
    CHECK(is_pinned(b->at("image")) == can_pin);
    CHECK(is_pinned(b->at("label")) == can_pin);
  }
  CHECK_FALSE(is_pinned(empty({4}, {DType::f32})));
  const Tensor p = empty_pinned({2, 3}, DType::f64);
  CHECK(p.is_cpu());
  CHECK(p.shape() == Shape{2, 3});
  CHECK(p.dtype() == DType::f64);
  CHECK(is_pinned(p) == can_pin);
  CHECK(empty_pinned({0}, DType::f32).numel() == 0);
}

TEST_CASE("shuffles differ across epochs and seeds; Shuffle::off is the identity", "[data][loader]") {
  const auto e0 = epoch_order(1000, 7, 0, Shuffle::on), e1 = epoch_order(1000, 7, 1, Shuffle::on);
  CHECK(e0 != e1);
  CHECK(e0 != epoch_order(1000, 8, 0, Shuffle::on));
  CHECK(e0 == epoch_order(1000, 7, 0, Shuffle::on));
  CHECK(std::set<int64_t>(e1.begin(), e1.end()).size() == 1000);
  // Fisher-Yates by hand for a small n: i = n-1 .. 1 swaps with below(i + 1).
  SampleRng rng = SampleRng::for_shuffle(7, 3);
  std::vector<int64_t> expect = {0, 1, 2, 3, 4};
  for (int64_t i = 4; i >= 1; --i) std::swap(expect[static_cast<std::size_t>(i)], expect[rng.below(static_cast<uint64_t>(i) + 1)]);
  CHECK(epoch_order(5, 7, 3, Shuffle::on) == expect);
  // The first element is roughly uniform over many epochs (a biased shuffle would fail this).
  std::vector<int> first(4, 0);
  for (int64_t e = 0; e < 4000; ++e) first[static_cast<std::size_t>(epoch_order(4, 1, e, Shuffle::on)[0])]++;
  for (int c : first) CHECK(std::abs(c - 1000) < 150);

  auto ds = std::make_shared<IndexDataset>(20);
  LoaderOptions o = options(2, 6);
  o.shuffle = Shuffle::off;
  const auto batches = run(ds, o, 2);
  REQUIRE(batches.size() == 8);
  CHECK(batches[0].indices == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(batches[3].indices == std::vector<int64_t>{18, 19});
  CHECK(batches[4].indices == batches[0].indices);
  CHECK(batches[4].images != batches[0].images);  // same samples, new epoch: new augmentation draws
}

TEST_CASE("drop_last keeps only full batches", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(23);
  LoaderOptions o = options(2, 5);
  o.drop_last = DropLast::yes;
  const auto batches = run(ds, o, 2);
  REQUIRE(batches.size() == 8);
  std::set<int64_t> seen;
  for (int i = 0; i < 4; ++i) {
    CHECK(batches[static_cast<std::size_t>(i)].indices.size() == 5);
    seen.insert(batches[static_cast<std::size_t>(i)].indices.begin(), batches[static_cast<std::size_t>(i)].indices.end());
  }
  CHECK(seen.size() == 20);  // 3 samples of the shuffled epoch are left out
  o.batch_size = 30;
  CHECK_THROWS_WITH(DataLoader(ds, o),
                    HasSubstr("23 samples per epoch in batches of 30 give no batch") &&
                        HasSubstr("(drop_last keeps full batches only)"));
}

TEST_CASE("min_last_batch drops a last batch with fewer rows, and only that one", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(23);
  LoaderOptions o = options(0, 5);
  o.min_last_batch = 4;  // the last batch holds 3 rows: dropped
  CHECK(DataLoader(ds, o).batches_per_epoch() == 4);
  auto batches = run(ds, o, 2);
  REQUIRE(batches.size() == 8);
  for (const auto& b : batches) CHECK(b.indices.size() == 5);
  o.min_last_batch = 3;  // kept
  batches = run(ds, o, 1);
  REQUIRE(batches.size() == 5);
  CHECK(batches.back().indices.size() == 3);
  CHECK(epoch_batches(25, 5, DropLast::no, 6) == 5);  // full batches are never dropped
  CHECK(epoch_batches(23, 5, DropLast::yes, 1) == 4);
  o.batch_size = 30;
  o.min_last_batch = 24;
  CHECK_THROWS_WITH(DataLoader(ds, o),
                    HasSubstr("23 samples per epoch in batches of 30 give no batch (a batch needs at least 24 rows)"));
  o.min_last_batch = 0;
  CHECK_THROWS_WITH(DataLoader(ds, o), HasSubstr("min_last_batch must be >= 1, got 0"));
}

// The rows [start, start + rows) of a flattened batch of 1x1x3 images.
Flat rows_of(const Flat& f, RowSlice s) {
  Flat out;
  out.pos = f.pos;
  out.indices.assign(f.indices.begin() + s.start, f.indices.begin() + s.start + s.rows);
  out.labels.assign(f.labels.begin() + s.start, f.labels.begin() + s.start + s.rows);
  out.images.assign(f.images.begin() + 3 * s.start, f.images.begin() + 3 * (s.start + s.rows));
  return out;
}

TEST_CASE("row_slice cuts a batch into even slices of consecutive rows, the first ones one row larger", "[data][loader]") {
  CHECK(row_slice(10, 0, 4).start == 0);
  CHECK(row_slice(10, 0, 4).rows == 3);
  CHECK(row_slice(10, 1, 4).start == 3);
  CHECK(row_slice(10, 1, 4).rows == 3);
  CHECK(row_slice(10, 2, 4).start == 6);
  CHECK(row_slice(10, 2, 4).rows == 2);
  CHECK(row_slice(10, 3, 4).start == 8);
  CHECK(row_slice(10, 3, 4).rows == 2);
  CHECK(row_slice(7, 0, 1).rows == 7);
  CHECK_THROWS_WITH(row_slice(3, 0, 4), HasSubstr("a batch of 3 rows cannot be cut over 4 ranks"));
  CHECK_THROWS_WITH(row_slice(8, 4, 4), HasSubstr("slice 4 of 4 does not exist"));
}

TEST_CASE("a sliced loader makes only its rows, equal to the whole batch's, and reads only their samples",
          "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(45);  // batches of 10: four whole ones and one of 5
  const auto whole = run(ds, options(0, 10), 2);
  REQUIRE(whole.size() == 10);
  const int64_t whole_calls = ds->calls.exchange(0);
  int64_t sliced_calls = 0;
  for (int workers : {0, 2}) {
    for (int r = 0; r < 3; ++r) {
      LoaderOptions o = options(workers, 10);
      o.slice_index = r;
      o.slice_count = 3;
      DataLoader loader(ds, o);
      std::size_t i = 0;
      for (int e = 0; e < 2; ++e)
        while (auto b = loader.next()) {
          REQUIRE(i < whole.size());
          const Flat& w = whole[i++];
          INFO("slice " << r << " of 3, batch " << b->position.batch << " of epoch " << b->position.epoch);
          CHECK(b->global_rows == static_cast<int64_t>(w.indices.size()));
          CHECK(flat(*b) == rows_of(w, row_slice(static_cast<int64_t>(w.indices.size()), r, 3)));
        }
      CHECK(i == whole.size());
    }
    sliced_calls = ds->calls.exchange(0);
    // The three slices read each sample once between them (workers also make batches ahead, past the end).
    if (workers == 0) CHECK(sliced_calls == whole_calls);
  }
  // The last batch has 5 rows: cut six ways one slice would get none, an error naming the sizes.
  LoaderOptions o = options(0, 10);
  o.slice_index = 5;
  o.slice_count = 6;
  DataLoader loader(ds, o);
  for (int k = 0; k < 4; ++k) REQUIRE(loader.next().has_value());
  CHECK_THROWS_WITH(loader.next(), HasSubstr("a batch of 5 rows cannot be cut over 6 ranks"));
  o.slice_index = 6;
  CHECK_THROWS_WITH(DataLoader(ds, o), HasSubstr("slice 6 of 6 does not exist"));
}

TEST_CASE("repeated augmentation: each index k times in a row, its own augmentation per copy, epochs of about N",
          "[data][loader]") {
  const int64_t n = 600, k = 3;  // 600 samples: epochs of 512 (a multiple of 256), 171 distinct images
  auto ds = std::make_shared<IndexDataset>(n);
  LoaderOptions o = options(0, 64);
  o.repeats = k;
  DataLoader loader(ds, o);
  CHECK(loader.samples_per_epoch() == 512);
  CHECK(loader.batches_per_epoch() == 8);
  const std::vector<int64_t> order = epoch_order(n, o.seed, 0, Shuffle::on);
  const auto plain = run(ds, options(0, 64), 1);  // the same seed without repeats
  std::map<int64_t, double> plain_byte;           // dataset index -> its augmentation byte without repeats
  for (const Flat& b : plain)
    for (std::size_t r = 0; r < b.indices.size(); ++r) plain_byte[b.indices[r]] = b.images[3 * r + 2];
  std::vector<int64_t> seen;
  std::vector<double> bytes;
  while (auto b = loader.next()) {
    const Flat f = flat(*b);
    for (std::size_t r = 0; r < f.indices.size(); ++r) {
      seen.push_back(f.indices[r]);
      bytes.push_back(f.images[3 * r + 2]);
      CHECK(f.images[3 * r] == Approx(static_cast<double>(f.indices[r] % 256) / 255.0));  // the dataset sample
    }
  }
  REQUIRE(seen.size() == 512);
  int copies_differ = 0;
  for (std::size_t p = 0; p < seen.size(); ++p) {
    INFO("position " << p);
    CHECK(seen[p] == order[p / k]);  // the shuffled order, each index k times in a row
    if (p % k == 0) CHECK(bytes[p] == plain_byte.at(seen[p]));  // copy 0 draws what the sample draws alone
    if (p % k != 0 && bytes[p] != bytes[p - 1]) ++copies_differ;
  }
  CHECK(copies_differ > 300);  // 341 later copies, each with its own stream (a byte repeats 1 in 256)
  // The same batches with workers, sliced over ranks and after a seek.
  LoaderOptions ow = o;
  ow.num_workers = 2;
  CHECK(run(ds, ow, 1) == run(ds, o, 1));
  const auto whole = run(ds, o, 1);
  LoaderOptions os = o;
  os.slice_index = 1;
  os.slice_count = 2;
  const auto half = run(ds, os, 1);
  REQUIRE(half.size() == whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK(half[i] == rows_of(whole[i], row_slice(64, 1, 2)));
  const auto tail = run(ds, o, 1, {0, 5});
  REQUIRE(tail.size() == 3);
  CHECK(tail[0] == whole[5]);
  // Below 256 samples the epoch keeps the dataset's size.
  LoaderOptions small = options(0, 10);
  small.repeats = 2;
  CHECK(DataLoader(std::make_shared<IndexDataset>(45), small).samples_per_epoch() == 45);
  CHECK(repeated_order({4, 2, 0}, 2) == std::vector<int64_t>{4, 7, 2});  // virtual indices i + copy * N
}

TEST_CASE("with a batch transform a sliced loader cuts the transformed whole batch", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(30);
  LoaderOptions o = options(0, 10);
  // A transform that reads every row: each row's image becomes the batch's sum of images minus itself.
  o.batch_transform = [](Batch& b) {
    const Tensor img = b.at("image");
    b.set("image", sub(sum(img, {0}, KeepDim::yes), img));
  };
  const auto whole = run(ds, o, 1);
  REQUIRE(whole.size() == 3);
  for (int r = 0; r < 2; ++r) {
    o.slice_index = r;
    o.slice_count = 2;
    DataLoader loader(ds, o);
    for (const Flat& w : whole) {
      const auto b = loader.next();
      REQUIRE(b.has_value());
      CHECK(b->global_rows == 10);
      CHECK(flat(*b) == rows_of(w, row_slice(10, r, 2)));
    }
  }
}

TEST_CASE("resuming from (epoch, batch) reproduces the remaining batches", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(45);
  const LoaderOptions o = options(3, 7);  // 7 batches per epoch
  const auto full = run(ds, o, 3);
  REQUIRE(full.size() == 21);
  // Interrupted at epoch 1, batch 4: a new loader started there gives batches 11..20.
  const auto rest = run(ds, o, 2, {1, 4});
  REQUIRE(rest.size() == 10);
  for (std::size_t i = 0; i < rest.size(); ++i) CHECK(rest[i] == full[11 + i]);

  // seek() on a running loader (with prefetched batches in flight) does the same.
  DataLoader loader(ds, o);
  for (int i = 0; i < 3; ++i) loader.next();
  loader.seek({2, 5});
  CHECK(flat(*loader.next()) == full[19]);
  CHECK(flat(*loader.next()) == full[20]);
  CHECK_FALSE(loader.next().has_value());
  CHECK(loader.position() == LoaderPosition{3, 0});

  // A checkpoint taken after the last batch of an epoch: the end is reported, then the next epoch starts.
  DataLoader at_end(ds, o, {0, 7});
  CHECK_FALSE(at_end.next().has_value());
  CHECK(flat(*at_end.next()) == full[7]);
  CHECK_THROWS_WITH(DataLoader(ds, o, {0, 8}), HasSubstr("batch 8 is outside"));
}

TEST_CASE("a worker's exception is thrown by next() with the sample it concerned", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(30, 17);
  LoaderOptions o = options(3, 4);
  o.shuffle = Shuffle::off;  // index 17 is in batch 4
  DataLoader loader(ds, o);
  for (int b = 0; b < 4; ++b) {
    auto batch = loader.next();
    REQUIRE(batch);
    CHECK(batch->position.batch == b);  // the batches before the failing one still arrive, in order
  }
  CHECK_THROWS_WITH(loader.next(), HasSubstr("bad record 17 (checksum mismatch)") && HasSubstr("dataset index 17") &&
                                       HasSubstr("item-17") && HasSubstr("epoch 0, batch 4"));
  CHECK_THROWS_WITH(loader.next(), HasSubstr("bad record 17"));  // stays failed
  loader.seek({0, 5});                                         // ... until moved past it
  CHECK(loader.next()->indices.front() == 20);
  // Same with no workers.
  LoaderOptions o0 = o;
  o0.num_workers = 0;
  DataLoader sync(ds, o0, {0, 4});
  CHECK_THROWS_WITH(sync.next(), HasSubstr("bad record 17"));
}

TEST_CASE("prefetching is bounded and the destructor stops busy workers", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(1000);
  LoaderOptions o = options(3, 2);
  o.prefetch = 2;
  {
    DataLoader loader(ds, o);
    loader.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // At most the consumed batch plus `prefetch` more were made.
    CHECK(ds->calls.load() <= (1 + o.prefetch) * o.batch_size);
    CHECK(ds->calls.load() >= 1 * o.batch_size);
  }  // joins here with workers blocked on a full queue
  CHECK(ds->calls.load() <= (1 + o.prefetch) * o.batch_size);
}

TEST_CASE("loader option and image-size errors", "[data][loader]") {
  auto ds = std::make_shared<IndexDataset>(10);
  LoaderOptions o = options(1, 0);
  CHECK_THROWS_WITH(DataLoader(ds, o), HasSubstr("batch_size must be positive"));
  o = options(1, 2);
  o.prefetch = 0;
  CHECK_THROWS_WITH(DataLoader(ds, o), HasSubstr("prefetch"));
  CHECK_THROWS_WITH(DataLoader(std::make_shared<IndexDataset>(0), options(1)), HasSubstr("empty"));
  o = options(1, 2);
  o.normalize = {{0.5f}, {0.25f}};  // 1 channel, the images have 3
  DataLoader wrong(ds, o);
  CHECK_THROWS_WITH(wrong.next(), HasSubstr("statistics for 1 channels, but the image has 3"));
  // Images of different sizes cannot share a batch.
  struct Varying final : Dataset {
    int64_t size() const override { return 4; }
    Sample get(int64_t i, SampleRng&) const override { return {Image::zeros(2 + i % 2, 2, 3, ImageLayout::hwc), 0}; }
  };
  LoaderOptions v = options(2, 4);
  v.shuffle = Shuffle::off;
  DataLoader mixed(std::make_shared<Varying>(), v);
  CHECK_THROWS_WITH(mixed.next(), HasSubstr("dataset index 1 (sample 1)") && HasSubstr("same size"));
}

TEST_CASE("CIFAR through transforms and the loader: (B, 3, 32, 32) normalised batches", "[data][loader][cifar]") {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("ht_test_loader_cifar_" + std::to_string(::getpid()) + ".bin");
  Tensor images = empty({9, 3, 32, 32}, {DType::u8});
  uint8_t* p = images.data<uint8_t>();
  for (int64_t i = 0; i < images.numel(); ++i) p[i] = static_cast<uint8_t>((i * 13) % 251);
  write_cifar_file(file, CifarVariant::cifar10, images, {0, 1, 2, 3, 4, 5, 6, 7, 8});
  auto data = std::make_shared<const CifarData>(read_cifar_file(file, {}));
  fs::remove(file);
  auto ds = with_transform(std::make_shared<CifarDataset>(data), cifar_train_transform());
  LoaderOptions o = options(2, 4);
  o.normalize = Normalize::cifar10();
  DataLoader loader(ds, o);
  auto b = loader.next();
  REQUIRE(b);
  CHECK(b->at("image").shape() == Shape{4, 3, 32, 32});
  CHECK(b->at("label").to_vector<int64_t>() == b->indices);  // label i for record i
  // Row 0 equals the transform applied by hand with the sample's stream, then normalised.
  const int64_t idx = b->indices[0];
  SampleRng rng = SampleRng::for_sample(o.seed, 0, idx);
  const Tensor expect = to_tensor(cifar_train_transform()(data->image(idx), rng), Normalize::cifar10());
  const auto got = b->at("image").to_vector<float>();
  CHECK(std::vector<float>(got.begin(), got.begin() + 3072) == expect.to_vector<float>());
  CHECK(b->to(Device::cpu()).at("image").to_vector<float>() == got);
}

TEST_CASE("a batch is a set of named tensors: the loader fills image and label", "[data][loader]") {
  DataLoader loader(std::make_shared<IndexDataset>(5), options(0, 4));
  auto b = loader.next();
  REQUIRE(b);
  std::vector<std::string> keys;
  for (const auto& [k, t] : b->tensors) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"image", "label"});
  CHECK(b->has(batch_key::image));
  CHECK_FALSE(b->has("tokens"));
  CHECK(b->size() == 4);
  CHECK_THROWS_WITH(b->at("tokens"), HasSubstr("the batch has no tensor 'tokens' (it has: image, label)"));

  // A batch made by hand: its size is dim 0 of its tensors; set() replaces; to() copies every tensor.
  Batch hand;
  CHECK(hand.size() == 0);
  hand.set("tokens", from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3}, {DType::i64}));
  hand.set("loss_mask", from_vector(std::vector<float>{1, 1, 0, 1, 1, 1}, {2, 3}));
  CHECK(hand.size() == 2);
  hand.set("tokens", from_vector(std::vector<int64_t>{7, 8, 9, 10, 11, 12}, {2, 3}, {DType::i64}));
  const Batch moved = hand.to(Device::cpu());
  CHECK(moved.tensors.size() == 2);
  CHECK(moved.at("tokens").to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9, 10, 11, 12});
  CHECK(moved.at("loss_mask").to_vector<float>() == std::vector<float>{1, 1, 0, 1, 1, 1});
}
