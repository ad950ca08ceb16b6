// MNIST and Fashion-MNIST: the four IDX files of an MNIST-layout directory (idx.h), loaded into memory,
// and a Dataset over them for the DataLoader (which shuffles per epoch from the seed and normalises).
//   train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]   (60,000 samples)
//   t10k-images-idx3-ubyte[.gz]   t10k-labels-idx1-ubyte[.gz]    (10,000 samples)
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/data/dataset.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::data {

enum class MnistSplit : uint8_t { train, test };

inline constexpr int64_t kMnistClasses = 10;

struct MnistData {
  Tensor images;                // (N, 1, H, W) u8 (28x28 for MNIST and Fashion-MNIST)
  std::vector<int64_t> labels;  // (N) class ids in [0, 10)
  std::filesystem::path images_file, labels_file;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  // Sample i as a (1, H, W) CHW image (a copy).
  Image image(int64_t i) const;
  // "image 17 of /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
  std::string describe_record(int64_t i) const;
};

// Loads a split from `dir`, preferring the .gz files. `limit` > 0 keeps the first `limit` samples (only those
// are read). Checks that the two files agree in count and that labels are in [0, 10).
MnistData load_mnist(const std::filesystem::path& dir, MnistSplit split, int64_t limit = 0);

// A Dataset over loaded samples (no randomness; wrap with with_transform for augmentation).
class MnistDataset final : public Dataset {
 public:
  explicit MnistDataset(std::shared_ptr<const MnistData> data);
  int64_t size() const override { return data_->size(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe_sample(int64_t index) const override { return data_->describe_record(index); }
  const MnistData& data() const { return *data_; }

 private:
  std::shared_ptr<const MnistData> data_;
};

}  // namespace ht::data
