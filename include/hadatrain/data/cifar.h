// CIFAR-10 and CIFAR-100 binary versions (docs/data.md, reference/data-formats.md §1-2).
//   CIFAR-10 record  (3073 B): label (0-9), 3072 pixel bytes.
//   CIFAR-100 record (3074 B): coarse label (0-19), fine label (0-99), 3072 pixel bytes.
// Pixels are planar: 1024 R, 1024 G, 1024 B, each 32x32 row-major; loaded as (N, 3, 32, 32) u8.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/data/dataset.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::data {

enum class CifarVariant : uint8_t { cifar10, cifar100 };
enum class CifarSplit : uint8_t { train, test };
enum class CifarLabel : uint8_t { fine, coarse };  // CIFAR-100 only; CIFAR-10 has one label
enum class SizeCheck : uint8_t {
  records,  // the file size must be a positive multiple of the record size
  exact,    // strict: the size of the official file (e.g. 30,730,000 B for a CIFAR-10 batch)
};

inline constexpr int64_t kCifarSide = 32;
inline constexpr int64_t kCifarPixels = 3 * 32 * 32;  // 3072

// Bytes per record: 3073 (CIFAR-10) or 3074 (CIFAR-100).
int64_t cifar_record_size(CifarVariant v);
// Number of classes for the label choice: 10, or 100 fine / 20 coarse.
int64_t cifar_num_classes(CifarVariant v, CifarLabel label);
// "CIFAR-10" / "CIFAR-100".
const char* cifar_name(CifarVariant v);
// The standard file names of a split: data_batch_1.bin ... data_batch_5.bin / test_batch.bin (CIFAR-10),
// train.bin / test.bin (CIFAR-100).
std::vector<std::string> cifar_file_names(CifarVariant v, CifarSplit split);
// The official size of one of those files, for SizeCheck::exact.
int64_t cifar_expected_file_size(CifarVariant v, CifarSplit split);

struct CifarOptions {
  CifarVariant variant = CifarVariant::cifar10;
  CifarSplit split = CifarSplit::train;
  CifarLabel label = CifarLabel::fine;
  SizeCheck size_check = SizeCheck::records;
};

// Which file a run of records came from (for error messages).
struct CifarSource {
  std::filesystem::path file;
  int64_t first = 0;  // index of its first record in CifarData
  int64_t count = 0;
};

struct CifarData {
  CifarVariant variant = CifarVariant::cifar10;
  Tensor images;                         // (N, 3, 32, 32) u8, as stored
  std::vector<int64_t> labels;           // (N) the chosen label
  std::vector<std::string> class_names;  // from the label-names file, or the standard names
  std::vector<CifarSource> sources;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t num_classes() const { return static_cast<int64_t>(class_names.size()); }
  // Record i as a (3, 32, 32) CHW image (a copy).
  Image image(int64_t i) const;
  // "record 17 of /data/cifar-10-batches-bin/data_batch_2.bin"
  std::string describe_record(int64_t i) const;
};

// Loads a split from `dir`: the directory holding the files (cifar-10-batches-bin/, cifar-100-binary/) or
// its parent. Class names come from batches.meta.txt (CIFAR-10) or fine_label_names.txt /
// coarse_label_names.txt (CIFAR-100) when present, else the standard names.
CifarData load_cifar(const std::filesystem::path& dir, const CifarOptions& opts);

// Reads the records of one file (any name), checking its size and label ranges. `expected_size` is used
// with SizeCheck::exact (pass cifar_expected_file_size, or the size your file should have).
struct CifarFileOptions {
  CifarVariant variant = CifarVariant::cifar10;
  CifarLabel label = CifarLabel::fine;
  SizeCheck size_check = SizeCheck::records;
  int64_t expected_size = 0;
};
CifarData read_cifar_file(const std::filesystem::path& file, const CifarFileOptions& opts);

// Writes records in the binary format: images (N, 3, 32, 32) u8; `labels` are the CIFAR-10 labels or the
// CIFAR-100 fine labels; `coarse` the CIFAR-100 coarse labels (ignored for CIFAR-10). For tests and for
// converting other data (e.g. MNIST padded to 32x32) into the CIFAR path.
void write_cifar_file(const std::filesystem::path& file, CifarVariant v, const Tensor& images,
                      const std::vector<int64_t>& labels, const std::vector<int64_t>& coarse = {});

// The standard class names (index order).
const std::vector<std::string>& cifar_standard_names(CifarVariant v, CifarLabel label);

// A Dataset over loaded records: get(i) returns record i as a CHW image and its label (no randomness;
// wrap with with_transform for augmentation).
class CifarDataset final : public Dataset {
 public:
  explicit CifarDataset(std::shared_ptr<const CifarData> data);
  CifarDataset(const std::filesystem::path& dir, const CifarOptions& opts);
  int64_t size() const override { return data_->size(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe_sample(int64_t index) const override { return data_->describe_record(index); }
  const CifarData& data() const { return *data_; }

 private:
  std::shared_ptr<const CifarData> data_;
};

}  // namespace ht::data
