// Writes the tiny synthetic datasets the config smoke tests train on (tests/cli/CMakeLists.txt):
//   <out>/cifar-100-binary/{train,test}.bin   CIFAR-100 binary records (8 train, 4 test; fine + coarse labels)
//   <out>/imagenet/{train,val}/<class>/*.JPEG  an ImageNet-style folder: 2 classes x 2 JPEGs per split, of
//                                               different sizes (so resize and crops are exercised)
// Usage: ht_make_smoke_data <out dir>. The contents depend only on the index of each record (no clock, no
// random device), so reruns write the same bytes.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/data/cifar.h"
#include "hadatrain/data/image_codec.h"
#include "hadatrain/tensor/factory.h"

namespace fs = std::filesystem;
using namespace ht;

namespace {

uint8_t pattern(int64_t record, int64_t k) {
  return static_cast<uint8_t>((record * 131 + k * 7 + (k >> 5) * 3) & 0xFF);
}

void write_cifar100(const fs::path& dir, const std::string& file, int64_t n) {
  Tensor images = zeros({n, 3, 32, 32}, TensorOptions{}.with_dtype(DType::u8));  // (N, 3, 32, 32)
  uint8_t* px = images.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < data::kCifarPixels; ++k) px[i * data::kCifarPixels + k] = pattern(i, k);
  std::vector<int64_t> fine, coarse;
  for (int64_t i = 0; i < n; ++i) {
    fine.push_back((i * 37) % 100);
    coarse.push_back(fine.back() % 20);
  }
  data::write_cifar_file(dir / file, data::CifarVariant::cifar100, images, fine, coarse);
}

void write_jpeg(const fs::path& file, int64_t height, int64_t width, int64_t seed) {
  data::Image img = data::Image::zeros(height, width, 3, data::ImageLayout::hwc);
  for (std::size_t k = 0; k < img.pixels.size(); ++k) img.pixels[k] = pattern(seed, static_cast<int64_t>(k));
  const std::vector<uint8_t> bytes = data::encode_jpeg(img, {.quality = 90, .color = data::JpegColor::rgb});
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

void write_image_folder(const fs::path& root) {
  const char* const classes[] = {"n01440764", "n01443537"};
  int64_t seed = 0;
  for (const char* split : {"train", "val"})
    for (const char* cls : classes)
      for (int i = 0; i < 2; ++i, ++seed)
        write_jpeg(root / split / cls / fmt::format("{}_{}.JPEG", cls, i), 40 + 8 * i, 56 - 8 * i, seed);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out dir>\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out = argv[1];
    const fs::path cifar = out / "cifar-100-binary";
    fs::create_directories(cifar);
    write_cifar100(cifar, "train.bin", 8);
    write_cifar100(cifar, "test.bin", 4);
    fs::remove_all(out / "imagenet");
    write_image_folder(out / "imagenet");
    fmt::print("wrote {} and {}\n", cifar.string(), (out / "imagenet").string());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
