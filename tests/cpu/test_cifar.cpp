// CIFAR-10 / CIFAR-100 binary readers on small synthetic files written byte by byte by the test.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hadatrain/data/cifar.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using namespace ht::data;
namespace fs = std::filesystem;

using ht::test::TempDir;

namespace {

// Pixel (c, y, x) of record r of file f, as written below.
uint8_t pixel(int f, int r, int c, int y, int x) { return static_cast<uint8_t>((f * 101 + r * 7 + c * 50 + y * 3 + x) % 256); }

// Writes records by hand: [header bytes][R plane][G plane][B plane].
void write_records(const fs::path& file, int f, const std::vector<std::vector<uint8_t>>& headers) {
  std::ofstream out(file, std::ios::binary);
  for (std::size_t r = 0; r < headers.size(); ++r) {
    for (uint8_t h : headers[r]) out.put(static_cast<char>(h));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x) out.put(static_cast<char>(pixel(f, static_cast<int>(r), c, y, x)));
  }
}

void write_bytes(const fs::path& file, std::size_t n) {
  std::ofstream out(file, std::ios::binary);
  for (std::size_t i = 0; i < n; ++i) out.put(static_cast<char>(i % 10));
}

void check_pixels(const CifarData& d, int64_t i, int f, int r) {
  const uint8_t* px = d.images.data<uint8_t>() + i * 3072;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) REQUIRE(px[(c * 32 + y) * 32 + x] == pixel(f, r, c, y, x));
  const Image img = d.image(i);
  CHECK(img.layout == ImageLayout::chw);
  CHECK(img.at(2, 31, 5) == pixel(f, r, 2, 31, 5));
  CHECK(img.at(0, 0, 1) == pixel(f, r, 0, 0, 1));
}

}  // namespace

TEST_CASE("a CIFAR-10 file loads with exact pixels and labels", "[data][cifar]") {
  TempDir tmp("c10file");
  write_records(tmp.path / "x.bin", 0, {{3}, {9}, {0}});
  const CifarData d = read_cifar_file(tmp.path / "x.bin", {});
  REQUIRE(d.size() == 3);
  CHECK(d.images.shape() == Shape{3, 3, 32, 32});
  CHECK(d.images.dtype() == DType::u8);
  CHECK(d.labels == std::vector<int64_t>{3, 9, 0});
  for (int r = 0; r < 3; ++r) check_pixels(d, r, 0, r);
  CHECK(d.class_names.at(3) == "cat");
  CHECK(d.describe_record(2) == "record 2 of " + (tmp.path / "x.bin").string());
}

TEST_CASE("a CIFAR-10 split concatenates data_batch_1..5 in order", "[data][cifar]") {
  TempDir tmp("c10split");
  const fs::path dir = tmp.path / "cifar-10-batches-bin";  // load from the parent: the sub-directory is found
  fs::create_directories(dir);
  const std::vector<int> counts = {2, 1, 3, 1, 2};
  for (int f = 0; f < 5; ++f) {
    std::vector<std::vector<uint8_t>> h;
    for (int r = 0; r < counts[static_cast<std::size_t>(f)]; ++r) h.push_back({static_cast<uint8_t>((f + r) % 10)});
    write_records(dir / ("data_batch_" + std::to_string(f + 1) + ".bin"), f + 1, h);
  }
  write_records(dir / "test_batch.bin", 9, {{7}, {8}});
  const CifarData train = load_cifar(tmp.path, {CifarVariant::cifar10, CifarSplit::train});
  REQUIRE(train.size() == 9);
  int64_t i = 0;
  for (int f = 0; f < 5; ++f)
    for (int r = 0; r < counts[static_cast<std::size_t>(f)]; ++r, ++i) {
      CHECK(train.labels[static_cast<std::size_t>(i)] == (f + r) % 10);
      check_pixels(train, i, f + 1, r);
    }
  CHECK(train.sources.size() == 5);
  CHECK(train.describe_record(4) == "record 1 of " + (dir / "data_batch_3.bin").string());
  CHECK(train.class_names == cifar_standard_names(CifarVariant::cifar10, CifarLabel::fine));

  // batches.meta.txt overrides the names (blank trailing lines, CRLF tolerated).
  {
    std::ofstream meta(dir / "batches.meta.txt");
    for (int k = 0; k < 10; ++k) meta << "class" << k << "\r\n";
    meta << "\n\n";
  }
  const CifarData test = load_cifar(dir, {CifarVariant::cifar10, CifarSplit::test});
  REQUIRE(test.size() == 2);
  CHECK(test.labels == std::vector<int64_t>{7, 8});
  check_pixels(test, 1, 9, 1);
  CHECK(test.class_names.at(7) == "class7");

  // Through the Dataset interface.
  CifarDataset ds(dir, {CifarVariant::cifar10, CifarSplit::test});
  SampleRng rng(0, 0);
  const Sample s = ds.get(1, rng);
  CHECK(s.label == 8);
  CHECK(s.image.at(1, 4, 4) == pixel(9, 1, 1, 4, 4));
  CHECK(ds.describe_sample(0) == "record 0 of " + (dir / "test_batch.bin").string());

  // A missing batch file is named.
  fs::remove(dir / "data_batch_3.bin");
  CHECK_THROWS_WITH(load_cifar(dir, {CifarVariant::cifar10, CifarSplit::train}), HasSubstr("data_batch_3.bin is missing"));
  // Label names with the wrong count.
  {
    std::ofstream meta(dir / "batches.meta.txt");
    meta << "a\nb\n";
  }
  CHECK_THROWS_WITH(load_cifar(dir, {CifarVariant::cifar10, CifarSplit::test}), HasSubstr("holds 2 class names, expected 10"));
}

TEST_CASE("CIFAR-100 records: coarse byte then fine byte, label choice", "[data][cifar]") {
  TempDir tmp("c100");
  write_records(tmp.path / "train.bin", 4, {{19, 99}, {0, 42}, {7, 3}, {11, 0}});
  write_records(tmp.path / "test.bin", 5, {{1, 2}});
  const CifarData fine = load_cifar(tmp.path, {CifarVariant::cifar100, CifarSplit::train, CifarLabel::fine});
  REQUIRE(fine.size() == 4);
  CHECK(fine.labels == std::vector<int64_t>{99, 42, 3, 0});
  for (int r = 0; r < 4; ++r) check_pixels(fine, r, 4, r);
  CHECK(fine.num_classes() == 100);
  CHECK(fine.class_names.front() == "apple");
  CHECK(fine.class_names.back() == "worm");
  const CifarData coarse = load_cifar(tmp.path, {CifarVariant::cifar100, CifarSplit::train, CifarLabel::coarse});
  CHECK(coarse.labels == std::vector<int64_t>{19, 0, 7, 11});
  CHECK(coarse.num_classes() == 20);
  CHECK(coarse.class_names.back() == "vehicles_2");
  const CifarData test = load_cifar(tmp.path, {CifarVariant::cifar100, CifarSplit::test});
  CHECK(test.labels == std::vector<int64_t>{2});
  check_pixels(test, 0, 5, 0);
  {
    std::ofstream names(tmp.path / "coarse_label_names.txt");
    for (int k = 0; k < 20; ++k) names << "group_" << k << "\n";
  }
  CHECK(load_cifar(tmp.path, {CifarVariant::cifar100, CifarSplit::test, CifarLabel::coarse}).class_names[1] == "group_1");

  // Writer round trip.
  write_cifar_file(tmp.path / "copy.bin", CifarVariant::cifar100, fine.images, fine.labels, coarse.labels);
  const CifarData back = read_cifar_file(tmp.path / "copy.bin", {CifarVariant::cifar100, CifarLabel::coarse});
  CHECK(back.labels == coarse.labels);
  CHECK(back.images.to_vector<int64_t>() == fine.images.to_vector<int64_t>());
  CHECK(fs::file_size(tmp.path / "copy.bin") == 4 * 3074);
}

TEST_CASE("CIFAR size and label checks name the file", "[data][cifar]") {
  TempDir tmp("sizes");
  const fs::path odd = tmp.path / "odd.bin";
  write_bytes(odd, 2 * 3073 + 5);
  CHECK_THROWS_WITH(read_cifar_file(odd, {}), HasSubstr(odd.string()) && HasSubstr("6151 bytes") &&
                                                  HasSubstr("record size 3073"));
  // CIFAR-100 records read as CIFAR-10: 3 * 3074 = 9222 is not a multiple of 3073.
  const fs::path c100 = tmp.path / "c100.bin";
  write_records(c100, 0, {{1, 2}, {3, 4}, {5, 6}});
  CHECK_THROWS_WITH(read_cifar_file(c100, {CifarVariant::cifar10}), HasSubstr("9222 bytes"));
  CHECK_NOTHROW(read_cifar_file(c100, {CifarVariant::cifar100}));
  // Empty file.
  write_bytes(tmp.path / "empty.bin", 0);
  CHECK_THROWS_WITH(read_cifar_file(tmp.path / "empty.bin", {}), HasSubstr("0 bytes"));
  // Strict mode wants the official size.
  const fs::path small = tmp.path / "small.bin";
  write_records(small, 0, {{1}});
  CifarFileOptions strict{CifarVariant::cifar10, CifarLabel::fine, SizeCheck::exact,
                          cifar_expected_file_size(CifarVariant::cifar10, CifarSplit::train)};
  CHECK_THROWS_WITH(read_cifar_file(small, strict), HasSubstr("3073 bytes, expected exactly 30730000"));
  CHECK(cifar_expected_file_size(CifarVariant::cifar100, CifarSplit::train) == 153700000);
  CHECK(cifar_expected_file_size(CifarVariant::cifar100, CifarSplit::test) == 30740000);
  // Labels out of range.
  const fs::path bad = tmp.path / "bad.bin";
  write_records(bad, 0, {{1}, {12}});
  CHECK_THROWS_WITH(read_cifar_file(bad, {}), HasSubstr("record 1") && HasSubstr("label 12"));
  write_records(bad, 0, {{20, 5}});
  CHECK_THROWS_WITH(read_cifar_file(bad, {CifarVariant::cifar100, CifarLabel::coarse}), HasSubstr("coarse label 20"));
  CHECK_THROWS_WITH(read_cifar_file(tmp.path / "nope.bin", {}), HasSubstr("nope.bin"));
  CHECK_THROWS_WITH(load_cifar(tmp.path, {CifarVariant::cifar100, CifarSplit::train}), HasSubstr("train.bin is missing"));
}
