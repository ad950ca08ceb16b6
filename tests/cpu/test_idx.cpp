// IDX files (MNIST layout), raw and gzipped: pixels and labels read back exactly; truncated files, bad magic
// numbers, trailing data and bad labels give errors naming the file and the record; MnistDataset feeds the
// DataLoader with normalised batches.
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/data/idx.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/data/mnist.h"

using namespace ht;
using namespace ht::data;
namespace fs = std::filesystem;

using ht::test::TempDir;
using ht::test::error_of;

namespace {

fs::path temp_dir() {
  static const TempDir dir;
  return dir.path;
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// An IDX file's bytes: magic, sizes, then `data` (which may be shorter or longer than the sizes say).
std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& sizes, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  put_u32(out, magic);
  for (uint32_t s : sizes) put_u32(out, s);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

enum class Compression { raw, gzip };

std::string write_file(const fs::path& path, const std::vector<uint8_t>& bytes, Compression c) {
  fs::create_directories(path.parent_path());
  if (c == Compression::raw) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                static_cast<std::streamsize>(bytes.size()));
  } else {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
    gzclose(f);
  }
  return path.string();
}

// Pixel (n, y, x) of the synthetic images: distinct, and covering 0..255.
uint8_t pixel(int n, int y, int x) { return static_cast<uint8_t>((n * 37 + y * 5 + x * 11) % 256); }

constexpr int kN = 7, kRows = 4, kCols = 3;

std::vector<uint8_t> image_data(int n) {
  std::vector<uint8_t> d;
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < kRows; ++y)
      for (int x = 0; x < kCols; ++x) d.push_back(pixel(i, y, x));
  return d;
}

std::vector<uint8_t> label_data(int n) {
  std::vector<uint8_t> d;
  for (int i = 0; i < n; ++i) d.push_back(static_cast<uint8_t>((i * 3) % 10));
  return d;
}

}  // namespace

TEST_CASE("IDX images and labels read back exactly, raw and gzipped", "[idx]") {
  for (Compression c : {Compression::raw, Compression::gzip}) {
    INFO((c == Compression::raw ? "raw" : "gzip"));
    const std::string suffix = c == Compression::raw ? "" : ".gz";
    const std::string images_path = write_file(temp_dir() / ("images" + suffix),
                                               idx_bytes(kIdxImagesMagic, {kN, kRows, kCols}, image_data(kN)), c);
    const std::string labels_path =
        write_file(temp_dir() / ("labels" + suffix), idx_bytes(kIdxLabelsMagic, {kN}, label_data(kN)), c);

    const Tensor images = read_idx_images(images_path);
    REQUIRE(images.shape() == Shape{kN, 1, kRows, kCols});
    REQUIRE(images.dtype() == DType::u8);
    const uint8_t* p = images.data<uint8_t>();
    int mismatches = 0;
    for (int i = 0; i < kN; ++i)
      for (int y = 0; y < kRows; ++y)
        for (int x = 0; x < kCols; ++x) mismatches += p[(i * kRows + y) * kCols + x] != pixel(i, y, x);
    CHECK(mismatches == 0);

    const Tensor labels = read_idx_labels(labels_path);
    REQUIRE(labels.shape() == Shape{kN});
    CHECK(std::vector<uint8_t>(labels.data<uint8_t>(), labels.data<uint8_t>() + kN) == label_data(kN));

    // limit reads a prefix.
    const Tensor first3 = read_idx_images(images_path, 3);
    CHECK(first3.shape() == Shape{3, 1, kRows, kCols});
    CHECK(first3.data<uint8_t>()[2 * kRows * kCols + kCols + 1] == pixel(2, 1, 1));
    CHECK(read_idx_labels(labels_path, 100).size(0) == kN);  // a limit beyond N reads all
  }
}

TEST_CASE("a truncated IDX file names the file and the record where the data ran out", "[idx]") {
  // The header announces 7 images but only 4.5 follow: the data ends in image 4.
  std::vector<uint8_t> short_data = image_data(kN);
  short_data.resize(4 * kRows * kCols + 6);
  for (Compression c : {Compression::raw, Compression::gzip}) {
    const std::string path = write_file(temp_dir() / (c == Compression::raw ? "short_images" : "short_images.gz"),
                                        idx_bytes(kIdxImagesMagic, {kN, kRows, kCols}, short_data), c);
    const std::string msg = error_of([&] { read_idx_images(path); });
    CHECK_THAT(msg, HasSubstr(path + ": truncated IDX file: the header announces 7 images but the data ends in "
                                    "image 4 (0-based), after 54 of 84 data bytes"));
    // A limit that reads only the complete prefix does not hide the damage: a raw file's size is checked against
    // the header, a gzip file is read to its end.
    if (c == Compression::raw)
      CHECK_THAT(error_of([&] { read_idx_images(path, 4); }),
                 HasSubstr(path + ": the file holds 70 bytes, but its header announces 7 images (100 bytes with the "
                                  "header): the file is truncated"));
    else
      CHECK_THAT(error_of([&] { read_idx_images(path, 4); }),
                 HasSubstr(path + ": truncated IDX file: the header announces 7 images but the data ends in image 4"));
  }
  const std::string labels = write_file(temp_dir() / "short_labels", idx_bytes(kIdxLabelsMagic, {10}, label_data(6)),
                                        Compression::raw);
  CHECK_THAT(error_of([&] { read_idx_labels(labels); }),
             HasSubstr(labels + ": truncated IDX file: the header announces 10 labels but the data ends in label 6"));
  const std::string header_only =
      write_file(temp_dir() / "header_only", {0x00, 0x00, 0x08, 0x03, 0x00, 0x00}, Compression::raw);
  CHECK_THAT(error_of([&] { read_idx_images(header_only); }),
             HasSubstr(header_only + ": truncated IDX file: the header ends before size 1 of 3"));
}

TEST_CASE("bad magic numbers and trailing data are rejected", "[idx]") {
  const std::string labels =
      write_file(temp_dir() / "magic_labels.gz", idx_bytes(kIdxLabelsMagic, {kN}, label_data(kN)), Compression::gzip);
  CHECK_THAT(error_of([&] { read_idx_images(labels); }),
             HasSubstr(labels + ": bad magic number 0x00000801 (this is an IDX labels file): expected 0x00000803 for "
                               "IDX images (u8 data, 3 dimensions)"));
  const std::string junk = write_file(temp_dir() / "junk", idx_bytes(0x12345678, {1}, {0}), Compression::raw);
  CHECK_THAT(error_of([&] { read_idx_labels(junk); }),
             HasSubstr(junk + ": bad magic number 0x12345678: expected 0x00000801 for IDX labels (u8 data, 1 dimension)"));
  std::vector<uint8_t> long_data = label_data(kN);
  long_data.push_back(1);
  const std::string extra =
      write_file(temp_dir() / "extra_labels", idx_bytes(kIdxLabelsMagic, {kN}, long_data), Compression::raw);
  CHECK_THAT(error_of([&] { read_idx_labels(extra); }),
             HasSubstr(extra + ": unexpected data after the 7 labels announced by the header"));
  CHECK_THAT(error_of([] { read_idx_images((temp_dir() / "missing.gz").string()); }),
             HasSubstr("missing.gz: cannot open IDX file"));
}

TEST_CASE("load_mnist reads a split directory and checks labels against images", "[idx][mnist]") {
  const fs::path dir = temp_dir() / "mnist";
  write_file(dir / "train-images-idx3-ubyte.gz", idx_bytes(kIdxImagesMagic, {kN, kRows, kCols}, image_data(kN)),
             Compression::gzip);
  write_file(dir / "train-labels-idx1-ubyte", idx_bytes(kIdxLabelsMagic, {kN}, label_data(kN)), Compression::raw);
  const MnistData d = load_mnist(dir, MnistSplit::train);
  CHECK(d.size() == kN);
  CHECK(d.labels[3] == 9);
  CHECK(d.images_file == dir / "train-images-idx3-ubyte.gz");
  const Image img = d.image(5);
  CHECK(img.channels == 1);
  CHECK(img.at(0, 2, 1) == pixel(5, 2, 1));
  CHECK(d.describe_record(5) == "image 5 of " + (dir / "train-images-idx3-ubyte.gz").string());
  CHECK(load_mnist(dir, MnistSplit::train, 2).size() == 2);

  CHECK_THAT(error_of([&] { load_mnist(dir, MnistSplit::test); }),
             HasSubstr(dir.string() + ": found neither t10k-images-idx3-ubyte.gz nor t10k-images-idx3-ubyte"));
  write_file(dir / "t10k-images-idx3-ubyte", idx_bytes(kIdxImagesMagic, {2, kRows, kCols}, image_data(2)),
             Compression::raw);
  write_file(dir / "t10k-labels-idx1-ubyte", idx_bytes(kIdxLabelsMagic, {3}, label_data(3)), Compression::raw);
  CHECK_THAT(error_of([&] { load_mnist(dir, MnistSplit::test); }), HasSubstr("holds 2 images but"));
  write_file(dir / "t10k-labels-idx1-ubyte", idx_bytes(kIdxLabelsMagic, {2}, {4, 10}), Compression::raw);
  CHECK_THAT(error_of([&] { load_mnist(dir, MnistSplit::test); }),
             HasSubstr("t10k-labels-idx1-ubyte: label 10 of record 1 is out of range: expected 0..9"));
}

TEST_CASE("MnistDataset feeds the DataLoader normalised, deterministically shuffled batches", "[idx][mnist]") {
  const fs::path dir = temp_dir() / "mnist_loader";
  write_file(dir / "train-images-idx3-ubyte", idx_bytes(kIdxImagesMagic, {kN, kRows, kCols}, image_data(kN)),
             Compression::raw);
  write_file(dir / "train-labels-idx1-ubyte", idx_bytes(kIdxLabelsMagic, {kN}, label_data(kN)), Compression::raw);
  auto data = std::make_shared<const MnistData>(load_mnist(dir, MnistSplit::train));
  auto dataset = std::make_shared<const MnistDataset>(data);
  const float mean = 0.25f, std = 0.5f;
  LoaderOptions opts{.batch_size = 3, .num_workers = 0, .seed = 11, .normalize = {{mean}, {std}}};

  auto epoch_indices = [&](uint64_t seed) {
    LoaderOptions o = opts;
    o.seed = seed;
    DataLoader loader(dataset, o);
    std::vector<int64_t> seen;
    while (const auto batch = loader.next()) {
      REQUIRE(batch->at("image").shape()[1] == 1);
      const std::vector<float> x = batch->at("image").to_vector<float>();  // (B, 1, H, W)
      const std::vector<int64_t> y = batch->at("label").to_vector<int64_t>();
      for (int64_t k = 0; k < batch->size(); ++k) {
        const int64_t idx = batch->indices[static_cast<std::size_t>(k)];
        CHECK(y[static_cast<std::size_t>(k)] == data->labels[static_cast<std::size_t>(idx)]);
        const float expected = (pixel(static_cast<int>(idx), 3, 2) / 255.0f - mean) / std;
        CHECK(x[static_cast<std::size_t>(k * kRows * kCols + 3 * kCols + 2)] == Approx(expected).margin(1e-6));
        seen.push_back(idx);
      }
    }
    return seen;
  };
  const std::vector<int64_t> a = epoch_indices(11), b = epoch_indices(11), c = epoch_indices(12);
  CHECK(a == b);  // same seed, same order
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});  // a permutation
  CHECK(a != std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(a != c);
}
