// MNIST-layout directories (MNIST, Fashion-MNIST): file lookup, label checks and the Dataset adapter.
#include "hadatrain/data/mnist.h"

#include <algorithm>

#include "hadatrain/core/error.h"
#include "hadatrain/data/idx.h"

namespace ht::data {
namespace fs = std::filesystem;

namespace {

// <dir>/<stem>.gz, else <dir>/<stem>.
fs::path find_idx_file(const fs::path& dir, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem + ".gz", stem})
    if (fs::is_regular_file(dir / name, ec)) return dir / name;
  HT_FAIL("{}: found neither {}.gz nor {} (expected an MNIST-layout directory)", dir.string(), stem, stem);
}

}  // namespace

Image MnistData::image(int64_t i) const {
  HT_CHECK(i >= 0 && i < size(), "MNIST: sample {} is out of range [0, {})", i, size());
  const int64_t h = images.size(2), w = images.size(3);
  Image img = Image::zeros(h, w, 1, ImageLayout::chw);
  const uint8_t* src = images.data<uint8_t>() + i * h * w;
  std::copy(src, src + h * w, img.pixels.begin());
  return img;
}

std::string MnistData::describe_record(int64_t i) const {
  return fmt::format("image {} of {}", i, images_file.string());
}

MnistData load_mnist(const fs::path& dir, MnistSplit split, int64_t limit) {
  const std::string prefix = split == MnistSplit::train ? "train" : "t10k";
  MnistData d;
  d.images_file = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  d.labels_file = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  // The counts of the whole files agree before a limit applies (a limit would hide 60,000 images against
  // 59,000 labels).
  const int64_t n_images = read_idx_count(d.images_file.string(), true);
  const int64_t n_labels = read_idx_count(d.labels_file.string(), false);
  HT_CHECK(n_images == n_labels, "{} holds {} images but {} holds {} labels: the files do not belong together or one "
           "is damaged", d.images_file.string(), n_images, d.labels_file.string(), n_labels);
  d.images = read_idx_images(d.images_file.string(), limit);
  const Tensor labels = read_idx_labels(d.labels_file.string(), limit);  // (N) u8
  HT_CHECK(d.images.size(0) == labels.size(0), "{} holds {} images but {} holds {} labels", d.images_file.string(),
           d.images.size(0), d.labels_file.string(), labels.size(0));
  const uint8_t* y = labels.data<uint8_t>();
  d.labels.resize(static_cast<std::size_t>(labels.size(0)));
  for (int64_t i = 0; i < labels.size(0); ++i) {
    HT_CHECK(y[i] < kMnistClasses, "{}: label {} of record {} is out of range: expected 0..{}",
             d.labels_file.string(), static_cast<int>(y[i]), i, kMnistClasses - 1);
    d.labels[static_cast<std::size_t>(i)] = y[i];
  }
  return d;
}

MnistDataset::MnistDataset(std::shared_ptr<const MnistData> data) : data_(std::move(data)) {
  HT_CHECK(data_ != nullptr && data_->size() > 0, "MnistDataset: no samples");
}

Sample MnistDataset::get(int64_t index, SampleRng&) const {
  return {data_->image(index), data_->labels[static_cast<std::size_t>(index)]};
}

}  // namespace ht::data
