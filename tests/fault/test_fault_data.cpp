// data.train_limit / test_limit read only the first records of an IDX file, but never hide a damaged file
// (docs/checkpoints.md, Note [Limited IDX reads] in src/data/idx.cpp): a truncated file (raw or gzip) and a gzip
// file with a flipped byte past the records read are errors even when the records read are all there, and an
// images file and a labels file whose headers announce different counts are an error before any limit
// applies. A whole gzip file is read with a limit as before.
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/data/idx.h"
#include "hadatrain/data/mnist.h"

using namespace ht;
using namespace ht::data;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// `file` gzip-compressed into `file`.gz (the original removed).
fs::path gzip_file(const fs::path& file) {
  const std::string raw = read_bytes(file);
  const fs::path gz = file.string() + ".gz";
  gzFile out = gzopen(gz.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, raw.data(), static_cast<unsigned>(raw.size())) == static_cast<int>(raw.size()));
  gzclose(out);
  fs::remove(file);
  return gz;
}

// A fresh 8x8 MNIST-layout folder of 64 train / 16 test samples.
fs::path fresh_dataset(const test::TempDir& tmp, const std::string& name) {
  const fs::path dir = tmp.path / name;
  test::write_idx_dataset(dir, 8, 64, 16);
  return dir;
}

}  // namespace

TEST_CASE("a limited read of a truncated IDX file is an error", "[fault][data]") {
  test::TempDir tmp("idx_trunc");
  {  // raw: the last 100 bytes of the images are missing; a limit of 8 reads only what is there
    const fs::path dir = fresh_dataset(tmp, "raw");
    const fs::path images = dir / "train-images-idx3-ubyte";
    const std::string bytes = read_bytes(images);
    write_bytes(images, bytes.substr(0, bytes.size() - 100));
    const std::string err = test::error_of([&] { load_mnist(dir, MnistSplit::train, 8); });
    INFO(err);
    CHECK(err.find(images.string() + ": the file holds " + std::to_string(bytes.size() - 100) +
                   " bytes, but its header announces 64 images (" + std::to_string(bytes.size()) +
                   " bytes with the header): the file is truncated") != std::string::npos);
    CHECK(err.find("train_limit") != std::string::npos);
  }
  {  // raw, longer than the header says
    const fs::path dir = fresh_dataset(tmp, "long");
    std::ofstream(dir / "train-labels-idx1-ubyte", std::ios::binary | std::ios::app) << "xx";
    CHECK(test::error_of([&] { read_idx_labels((dir / "train-labels-idx1-ubyte").string(), 8); })
              .find("longer than announced") != std::string::npos);
  }
  {  // gzip cut in half: the first records still decompress
    const fs::path dir = fresh_dataset(tmp, "gz");
    const fs::path gz = gzip_file(dir / "train-images-idx3-ubyte");
    gzip_file(dir / "train-labels-idx1-ubyte");
    REQUIRE(load_mnist(dir, MnistSplit::train, 8).size() == 8);  // whole gzip files with a limit read as before
    const std::string bytes = read_bytes(gz);
    write_bytes(gz, bytes.substr(0, bytes.size() / 2));
    const std::string err = test::error_of([&] { load_mnist(dir, MnistSplit::train, 8); });
    INFO(err);
    CHECK(err.find(gz.string() + ": truncated IDX file: the header announces 64 images but the data ends in image ") !=
          std::string::npos);
  }
}

TEST_CASE("a limited read of a damaged gzip IDX file is an error, wherever the damage is", "[fault][data]") {
  test::TempDir tmp("idx_gz_damage");
  // 1000 images of 28x28 (784 kB): more than zlib decompresses ahead of a read (gzread inflates up to twice its
  // 256 kB buffer at a time), so a limit of 8 stops far before the stream's last bytes.
  const fs::path dir = tmp.path / "big";
  test::write_idx_dataset(dir, 28, 1000, 16);
  const fs::path gz = gzip_file(dir / "train-images-idx3-ubyte");
  gzip_file(dir / "train-labels-idx1-ubyte");
  REQUIRE(load_mnist(dir, MnistSplit::train, 8).size() == 8);
  REQUIRE(load_mnist(dir, MnistSplit::train).size() == 1000);
  const std::string good = read_bytes(gz);
  const auto error_with = [&](const std::string& bytes, int64_t limit) {
    write_bytes(gz, bytes);
    return test::error_of([&] { load_mnist(dir, MnistSplit::train, limit); });
  };
  for (const int64_t limit : {int64_t{8}, int64_t{0}}) {
    INFO("limit " << limit);
    // A byte flipped in the deflate data 20 bytes before the trailer: the stream decodes to other bytes or
    // fails to decode; either way the images past the limit are not those that were compressed.
    std::string flipped = good;
    flipped[flipped.size() - 28] = static_cast<char>(flipped[flipped.size() - 28] ^ 0x10);
    std::string err = error_with(flipped, limit);
    INFO(err);
    CHECK(err.find(gz.string() + ": the gzip data is damaged (zlib: ") != std::string::npos);
    CHECK(err.find("), found while decompressing images ") != std::string::npos);
    // A byte flipped in the trailer's CRC-32: the data decodes, the checksum does not match it.
    std::string crc = good;
    crc[crc.size() - 6] = static_cast<char>(crc[crc.size() - 6] ^ 0x01);
    err = error_with(crc, limit);
    CHECK(err.find(gz.string() + ": the gzip data is damaged (zlib: incorrect data check: the CRC-32 in the gzip "
                                 "trailer does not match the data), found while decompressing images ") !=
          std::string::npos);
    // The last 3 bytes missing: every image decodes, but the trailer is incomplete.
    err = error_with(good.substr(0, good.size() - 3), limit);
    CHECK(err.find(gz.string() + ": the gzip stream ends before its trailer (CRC-32 and length) after the 1000 "
                                 "images: the file is truncated") == 0);
    // Cut in the last tenth of the stream: the data ends inside an image.
    err = error_with(good.substr(0, good.size() * 9 / 10), limit);
    CHECK(err.find(gz.string() + ": truncated IDX file: the header announces 1000 images but the data ends in image ") !=
          std::string::npos);
  }
}

TEST_CASE("images and labels whose headers announce different counts are an error before a limit applies",
          "[fault][data]") {
  test::TempDir tmp("idx_count");
  const fs::path dir = fresh_dataset(tmp, "counts");
  // A labels file of 63 records (a whole file: header and size agree) beside 64 images.
  const fs::path labels = dir / "train-labels-idx1-ubyte";
  std::string bytes = read_bytes(labels);
  bytes[7] = 63;
  write_bytes(labels, bytes.substr(0, bytes.size() - 1));
  const std::string limited = test::error_of([&] { load_mnist(dir, MnistSplit::train, 16); });
  INFO(limited);
  CHECK(limited.find((dir / "train-images-idx3-ubyte").string() + " holds 64 images but " + labels.string() +
                     " holds 63 labels") != std::string::npos);
  CHECK_FALSE(test::error_of([&] { load_mnist(dir, MnistSplit::train); }).empty());
}
