// ImageNet-style folders of images (torchvision ImageFolder layout, reference/data-formats.md §4):
//   root/<class>/**/<file>.{jpeg,jpg,png}   (extensions case-insensitive)
// Class index = position of the class folder's name in sorted (byte) order, which is what pretrained
// ImageNet weights expect. Files are listed as torchvision does: the directories of a class walked in
// sorted path order, the files of each directory in sorted name order, symbolic links followed (a link loop
// is an error naming the link). Also a flat directory plus a list file of "<file> <class name | class index>"
// lines (ImageNet val as distributed).
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hadatrain/data/dataset.h"
#include "hadatrain/data/image_codec.h"

namespace ht::data {

struct ImageFolderOptions {
  std::filesystem::path root;
  // Empty: the class-folder layout. Otherwise a text file of "<file> <label>" lines, file relative to root,
  // label a class name (looked up in `classes`, or in the sorted set of names in the list when `classes` is
  // empty) or a class index.
  std::filesystem::path list_file;
  // Class names in index order; empty: derived (sorted sub-folder names, or sorted names in the list).
  // Pass the training folder's classes() when opening a validation folder with missing classes.
  std::vector<std::string> classes;
  DecodeOptions decode;
};

// Decode counters: totals since construction (or reset), from every thread.
struct DecodeStats {
  int64_t images = 0;
  int64_t bytes = 0;   // compressed bytes read
  int64_t pixels = 0;  // decoded pixels (height * width)
  double seconds = 0;  // summed over threads (CPU-seconds of read + decode)
  double images_per_second() const { return seconds > 0 ? images / seconds : 0; }
  double megapixels_per_second() const { return seconds > 0 ? pixels / seconds * 1e-6 : 0; }
  double megabytes_per_second() const { return seconds > 0 ? bytes / seconds * 1e-6 : 0; }
  std::string summary() const;  // "1000 images, 110.2 MB, 181.3 Mpx in 4.20 s (238 img/s per thread, ...)"
};

class ImageFolder final : public Dataset {
 public:
  explicit ImageFolder(ImageFolderOptions opts);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  // Decodes file `index` to an RGB HWC image (no randomness).
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe_sample(int64_t index) const override;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::filesystem::path& file(int64_t index) const;
  int64_t label(int64_t index) const;
  const std::vector<int64_t>& labels() const { return labels_; }

  DecodeStats decode_stats() const;
  void reset_decode_stats();

 private:
  void scan_class_folders();
  void read_list_file();

  ImageFolderOptions opts_;
  std::vector<std::string> classes_;
  std::vector<std::filesystem::path> files_;
  std::vector<int64_t> labels_;
  mutable std::atomic<int64_t> n_images_{0}, n_bytes_{0}, n_pixels_{0}, n_nanos_{0};
};

// True for .jpeg / .jpg / .png in any case.
bool has_image_extension(const std::filesystem::path& file);

// Decode throughput of `files` (each read and decoded once) on `threads` threads. For benchmarks and the
// CLI; `seconds` is wall-clock time here.
DecodeStats measure_decode(const std::vector<std::filesystem::path>& files, const DecodeOptions& opts, int threads);

}  // namespace ht::data
