// data.train_limit / test_limit read only the first records of an IDX file, but never hide a damaged file
// (docs/checkpoints.md): a truncated file (raw or gzip) is an error even when the records read are all there,
// and an images file and a labels file whose headers announce different counts are an error before any limit
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
    CHECK(err.find(gz.string() + ": the gzip trailer records ") != std::string::npos);
    CHECK(err.find("the file is truncated or damaged") != std::string::npos);
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
