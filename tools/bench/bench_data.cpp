// Data-path benchmark (CPU; every build): what the loader can feed a GPU.
//  (a) CIFAR-shaped loader throughput: synthetic CIFAR-100 records (random bytes) written in the binary format
//      to a temporary directory, read back with read_cifar_file, the cifar training augmentation (RandomCrop
//      32 padding 4 + flip), CIFAR-100 normalisation, batch 256, 1/2/4/8 workers (prefetch max(4, 2 x workers)):
//      images per second over whole epochs after a few warm-up batches. With a visible GPU (CUDA build) one
//      more row uses pin_memory (batches in page-locked memory).
//  (b) JPEG decode throughput per core: photo-like 500x375 RGB images (smooth gradients + noise), encoded at
//      quality 90 in memory, decoded on one thread (full size, as the trainer does), then RandomResizedCrop to
//      224 + flip, then normalised to f32: images per second on one core.
// Compare (a) and (b) x cores with the training throughput (img_per_s) and data_wait of a run (docs/data.md).
//   bench_data [cifar records, default 20000] [jpeg images, default 300]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/data/cifar.h"
#include "hadatrain/data/image_codec.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/data/transforms.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/factory.h"

namespace fs = std::filesystem;
using namespace ht;
using namespace ht::data;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A byte from a fixed hash of (a, b): reproducible "noise" without a generator.
uint8_t hash_byte(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> 56);
}

fs::path write_synthetic_cifar100(const fs::path& dir, int64_t n) {
  Tensor images = empty({n, 3, kCifarSide, kCifarSide}, {DType::u8});  // (N, 3, 32, 32)
  uint8_t* px = images.data<uint8_t>();
  for (int64_t i = 0; i < n * kCifarPixels; ++i) px[i] = hash_byte(static_cast<uint64_t>(i), 1);
  std::vector<int64_t> fine(static_cast<std::size_t>(n)), coarse(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    fine[static_cast<std::size_t>(i)] = (i * 37) % 100;
    coarse[static_cast<std::size_t>(i)] = fine[static_cast<std::size_t>(i)] % 20;
  }
  const fs::path file = dir / "train.bin";
  write_cifar_file(file, CifarVariant::cifar100, images, fine, coarse);
  return file;
}

struct LoaderResult {
  double images_per_s = 0;
  int64_t images = 0;
};

LoaderResult time_loader(const std::shared_ptr<const Dataset>& ds, int workers, bool pin, int epochs) {
  LoaderOptions o;
  o.batch_size = 256;
  o.num_workers = workers;
  o.prefetch = std::max(4, 2 * workers);
  o.seed = 1;
  o.normalize = Normalize::cifar100();
  o.pin_memory = pin;
  DataLoader loader(ds, o);
  for (int k = 0; k < 4; ++k) (void)loader.next();  // warm-up: workers started, queue filled
  LoaderResult r;
  const auto t0 = Clock::now();
  for (int e = 0; e < epochs; ++e)
    while (const auto b = loader.next()) r.images += b->size();
  r.images_per_s = static_cast<double>(r.images) / seconds_since(t0);
  return r;
}

// A photo-like RGB image: smooth two-dimensional gradients and a low-frequency wave per channel, plus noise
// of +-20 (so the encoder cannot collapse it, as with real photographs).
Image photo_like(int64_t height, int64_t width, uint64_t seed) {
  Image img = Image::zeros(height, width, 3, ImageLayout::hwc);
  const double phase = static_cast<double>(seed % 97) * 0.37;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const double g = 60.0 + 120.0 * (static_cast<double>(x) / width) * (c == 0 ? 1.0 : 0.5) +
                         80.0 * (static_cast<double>(y) / height) * (c == 2 ? 1.0 : 0.4) +
                         30.0 * std::sin(0.03 * x + 0.02 * y + phase + c);
        const double noise = static_cast<double>(hash_byte(seed, static_cast<uint64_t>((y * width + x) * 3 + c)) % 41) - 20;
        img.at(c, y, x) = static_cast<uint8_t>(std::clamp(std::lround(g + noise), 0L, 255L));
      }
  return img;
}

struct DecodeResult {
  double decode_per_s = 0, full_per_s = 0;
  double mean_kb = 0;
};

DecodeResult time_jpeg(int n) {
  std::vector<std::vector<uint8_t>> files;
  double bytes = 0;
  for (int i = 0; i < n; ++i) {
    files.push_back(encode_jpeg(photo_like(375, 500, static_cast<uint64_t>(i)), {.quality = 90}));
    bytes += static_cast<double>(files.back().size());
  }
  DecodeResult r;
  r.mean_kb = bytes / n / 1024.0;
  int64_t sink = 0;  // keeps the work observable
  // Decode only (one warm-up pass over the first images).
  for (int i = 0; i < std::min(n, 20); ++i) sink += decode_image(files[static_cast<std::size_t>(i)], "warm-up").width;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) sink += decode_image(files[static_cast<std::size_t>(i)], "bench").height;
  r.decode_per_s = n / seconds_since(t0);
  // The training sample path: decode, RandomResizedCrop(224) + flip, normalise to f32.
  const Transform train = imagenet_train_transform(224);
  const Normalize norm = Normalize::imagenet();
  std::vector<float> out(3 * 224 * 224);
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    SampleRng rng = SampleRng::for_sample(1, 0, i);
    const Image img = train(decode_image(files[static_cast<std::size_t>(i)], "bench"), rng);
    normalize_into(img, norm, out.data());
    sink += static_cast<int64_t>(out[static_cast<std::size_t>(i) % out.size()] > 0);
  }
  r.full_per_s = n / seconds_since(t0);
  if (sink == -1) std::puts("");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t records = argc > 1 ? std::stoll(argv[1]) : 20000;
    const int jpegs = argc > 2 ? std::stoi(argv[2]) : 300;
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    fmt::print("bench_data: {} hardware threads\n\n", cores);

    const fs::path dir = fs::temp_directory_path() / fmt::format("hadatrain_bench_data_{}", getpid());
    fs::create_directories(dir);
    const fs::path file = write_synthetic_cifar100(dir, records);
    auto cifar = std::make_shared<const CifarData>(
        read_cifar_file(file, {.variant = CifarVariant::cifar100, .label = CifarLabel::fine}));
    const auto ds = with_transform(std::make_shared<CifarDataset>(cifar), cifar_train_transform());
    const int epochs = 3;
    fmt::print("(a) CIFAR-100-shaped loader: {} records, cifar augmentation, batch 256, {} epochs\n", records, epochs);
    fmt::print("  {:>8} {:>11} {:>14} {:>18}\n", "workers", "memory", "images/s", "images/s/worker");
    for (int w : {1, 2, 4, 8}) {
      const LoaderResult r = time_loader(ds, w, false, epochs);
      fmt::print("  {:>8} {:>11} {:>14.0f} {:>18.0f}\n", w, "pageable", r.images_per_s, r.images_per_s / w);
    }
    const CudaHooks* hooks = cuda_hooks();
    if (hooks != nullptr && hooks->device_count() > 0) {
      const LoaderResult r = time_loader(ds, 4, true, epochs);
      fmt::print("  {:>8} {:>11} {:>14.0f} {:>18.0f}\n", 4, "pinned", r.images_per_s, r.images_per_s / 4);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);

    fmt::print("\n(b) JPEG, one thread: {} photo-like 500x375 RGB images, quality 90\n", jpegs);
    const DecodeResult d = time_jpeg(jpegs);
    fmt::print("  mean file size {:.1f} KiB\n", d.mean_kb);
    fmt::print("  {:<44} {:>14}\n", "step", "images/s/core");
    fmt::print("  {:<44} {:>14.0f}\n", "decode (full size)", d.decode_per_s);
    fmt::print("  {:<44} {:>14.0f}\n", "decode + RandomResizedCrop(224) + flip + norm", d.full_per_s);
    fmt::print("  x {} threads (ideal scaling): {:.0f} images/s\n", cores, d.full_per_s * cores);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
}
