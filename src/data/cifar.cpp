// CIFAR-10 / CIFAR-100 binary readers and writer (record layouts in cifar.h and docs/data.md).
#include "hadatrain/data/cifar.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "hadatrain/core/error.h"

namespace ht::data {
namespace fs = std::filesystem;

namespace {

const char* split_name(CifarSplit s) { return s == CifarSplit::train ? "train" : "test"; }

// The label byte of a record for the label choice, and its offset.
int64_t label_offset(CifarVariant v, CifarLabel label) {
  if (v == CifarVariant::cifar10) return 0;
  return label == CifarLabel::coarse ? 0 : 1;
}

int64_t header_bytes(CifarVariant v) { return v == CifarVariant::cifar10 ? 1 : 2; }

std::vector<std::string> read_name_lines(const fs::path& file) {
  std::ifstream in(file);
  HT_CHECK(in.good(), "cannot open CIFAR label-names file {}: {}", file.string(), std::strerror(errno));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;  // the official files end with blank lines
    const auto e = line.find_last_not_of(" \t\r");
    names.push_back(line.substr(b, e - b + 1));
  }
  return names;
}

// The directory holding the files: `dir` itself, or its standard sub-directory.
fs::path resolve_dir(const fs::path& dir, CifarVariant v, CifarSplit split) {
  const auto names = cifar_file_names(v, split);
  if (fs::exists(dir / names.front())) return dir;
  const fs::path sub = dir / (v == CifarVariant::cifar10 ? "cifar-10-batches-bin" : "cifar-100-binary");
  if (fs::exists(sub / names.front())) return sub;
  return dir;
}

std::string file_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

int64_t cifar_record_size(CifarVariant v) { return header_bytes(v) + kCifarPixels; }

int64_t cifar_num_classes(CifarVariant v, CifarLabel label) {
  if (v == CifarVariant::cifar10) return 10;
  return label == CifarLabel::coarse ? 20 : 100;
}

const char* cifar_name(CifarVariant v) { return v == CifarVariant::cifar10 ? "CIFAR-10" : "CIFAR-100"; }

std::vector<std::string> cifar_file_names(CifarVariant v, CifarSplit split) {
  if (v == CifarVariant::cifar100) return {split == CifarSplit::train ? "train.bin" : "test.bin"};
  if (split == CifarSplit::test) return {"test_batch.bin"};
  return {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"};
}

int64_t cifar_expected_file_size(CifarVariant v, CifarSplit split) {
  const int64_t records = (v == CifarVariant::cifar100 && split == CifarSplit::train) ? 50000 : 10000;
  return records * cifar_record_size(v);
}

Image CifarData::image(int64_t i) const {
  HT_CHECK(i >= 0 && i < size(), "CIFAR: record {} is out of range [0, {})", i, size());
  Image img = Image::zeros(kCifarSide, kCifarSide, 3, ImageLayout::chw);
  const uint8_t* src = images.data<uint8_t>() + i * kCifarPixels;
  std::copy(src, src + kCifarPixels, img.pixels.begin());
  return img;
}

std::string CifarData::describe_record(int64_t i) const {
  for (const auto& s : sources)
    if (i >= s.first && i < s.first + s.count) return fmt::format("record {} of {}", i - s.first, s.file.string());
  return fmt::format("CIFAR record {}", i);
}

namespace {

// The number of records in `file`, after the size checks.
int64_t checked_record_count(const fs::path& file, const CifarFileOptions& opts) {
  const char* what = cifar_name(opts.variant);
  const int64_t rec = cifar_record_size(opts.variant);
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(file, ec));
  HT_CHECK(!ec, "cannot read {} file {}: {}", what, file.string(), ec.message());
  if (opts.size_check == SizeCheck::exact) {
    HT_CHECK(size == opts.expected_size,
             "{} file {} has {} bytes, expected exactly {} ({} records of {} bytes); is it the official file, "
             "fully downloaded?",
             what, file.string(), size, opts.expected_size, opts.expected_size / rec, rec);
  }
  HT_CHECK(size > 0 && size % rec == 0,
           "{} file {} has {} bytes, which is not a positive multiple of the record size {} ({} label byte{} + "
           "{} pixel bytes); is this a {} binary file (not the python version), and the right variant?",
           what, file.string(), size, rec, header_bytes(opts.variant), opts.variant == CifarVariant::cifar10 ? "" : "s",
           kCifarPixels, what);
  return size / rec;
}

// Reads the n records of `file` into px (n x 3072 bytes) and labels (n), checking label ranges.
void read_records(const fs::path& file, const CifarFileOptions& opts, int64_t n, uint8_t* px, int64_t* labels) {
  const char* what = cifar_name(opts.variant);
  const int64_t rec = cifar_record_size(opts.variant);
  const int64_t num_classes = cifar_num_classes(opts.variant, opts.label);
  const int64_t loff = label_offset(opts.variant, opts.label);
  std::ifstream in(file, std::ios::binary);
  HT_CHECK(in.good(), "cannot open {} file {}: {}", what, file.string(), std::strerror(errno));
  constexpr int64_t kChunk = 1024;  // records per read
  std::vector<char> buf(static_cast<std::size_t>(std::min(kChunk, n) * rec));
  for (int64_t first = 0; first < n; first += kChunk) {
    const int64_t count = std::min(kChunk, n - first);
    in.read(buf.data(), count * rec);
    HT_CHECK(in.gcount() == count * rec, "{} file {}: short read at record {} (the file changed while reading?)", what,
             file.string(), first);
    for (int64_t r = 0; r < count; ++r) {
      const auto* record = reinterpret_cast<const uint8_t*>(buf.data()) + r * rec;
      const int64_t label = record[loff];
      HT_CHECK(label < num_classes, "{} file {}, record {}: {} label {} is outside [0, {}); wrong variant?", what,
               file.string(), first + r,
               opts.variant == CifarVariant::cifar10 ? "the" : (opts.label == CifarLabel::coarse ? "coarse" : "fine"),
               label, num_classes);
      labels[first + r] = label;
      std::copy(record + header_bytes(opts.variant), record + rec, px + (first + r) * kCifarPixels);
    }
  }
}

// Reads `files` (checked first, all of them) into one CifarData.
CifarData read_files(const std::vector<fs::path>& files, const CifarFileOptions& opts) {
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const auto& f : files) {
    counts.push_back(checked_record_count(f, opts));
    total += counts.back();
  }
  CifarData d;
  d.variant = opts.variant;
  d.images = empty({total, 3, kCifarSide, kCifarSide}, {DType::u8});  // (N, 3, 32, 32)
  d.labels.resize(static_cast<std::size_t>(total));
  int64_t first = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    read_records(files[i], opts, counts[i], d.images.data<uint8_t>() + first * kCifarPixels, d.labels.data() + first);
    d.sources.push_back({files[i], first, counts[i]});
    first += counts[i];
  }
  d.class_names = cifar_standard_names(opts.variant, opts.label);
  return d;
}

}  // namespace

CifarData read_cifar_file(const fs::path& file, const CifarFileOptions& opts) { return read_files({file}, opts); }

CifarData load_cifar(const fs::path& dir_in, const CifarOptions& opts) {
  const char* what = cifar_name(opts.variant);
  const fs::path dir = resolve_dir(dir_in, opts.variant, opts.split);
  const auto names = cifar_file_names(opts.variant, opts.split);
  std::vector<fs::path> files;
  for (const auto& name : names) {
    HT_CHECK(fs::exists(dir / name),
             "{} {} split: {} is missing (expected {} in {}, as unpacked from {})", what, split_name(opts.split),
             (dir / name).string(), file_list(names), dir.string(),
             opts.variant == CifarVariant::cifar10 ? "cifar-10-binary.tar.gz" : "cifar-100-binary.tar.gz");
    files.push_back(dir / name);
  }
  CifarData d = read_files(files, {opts.variant, opts.label, opts.size_check,
                                   cifar_expected_file_size(opts.variant, opts.split)});

  // Class names.
  const char* names_file = opts.variant == CifarVariant::cifar10
                               ? "batches.meta.txt"
                               : (opts.label == CifarLabel::coarse ? "coarse_label_names.txt" : "fine_label_names.txt");
  const int64_t num_classes = cifar_num_classes(opts.variant, opts.label);
  if (fs::exists(dir / names_file)) {
    auto lines = read_name_lines(dir / names_file);
    HT_CHECK(static_cast<int64_t>(lines.size()) == num_classes, "{}: {} holds {} class names, expected {}", what,
             (dir / names_file).string(), lines.size(), num_classes);
    d.class_names = std::move(lines);
  }
  return d;
}

void write_cifar_file(const fs::path& file, CifarVariant v, const Tensor& images, const std::vector<int64_t>& labels,
                      const std::vector<int64_t>& coarse) {
  HT_CHECK(images.dtype() == DType::u8 && images.dim() == 4 && images.size(1) == 3 && images.size(2) == kCifarSide &&
               images.size(3) == kCifarSide,
           "write_cifar_file: images must be u8 (N, 3, 32, 32), got {}", images.describe());
  const int64_t n = images.size(0);
  HT_CHECK(static_cast<int64_t>(labels.size()) == n, "write_cifar_file: {} images but {} labels", n, labels.size());
  if (v == CifarVariant::cifar100)
    HT_CHECK(static_cast<int64_t>(coarse.size()) == n, "write_cifar_file: CIFAR-100 needs {} coarse labels, got {}",
             n, coarse.size());
  const Tensor img = images.contiguous();
  const uint8_t* px = img.data<uint8_t>();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  HT_CHECK(out.good(), "write_cifar_file: cannot create {}: {}", file.string(), std::strerror(errno));
  const int64_t fine_max = v == CifarVariant::cifar10 ? 10 : 100;
  for (int64_t i = 0; i < n; ++i) {
    const auto idx = static_cast<std::size_t>(i);
    HT_CHECK(labels[idx] >= 0 && labels[idx] < fine_max, "write_cifar_file: label {} of record {} is outside [0, {})",
             labels[idx], i, fine_max);
    if (v == CifarVariant::cifar100) {
      HT_CHECK(coarse[idx] >= 0 && coarse[idx] < 20, "write_cifar_file: coarse label {} of record {} is outside [0, 20)",
               coarse[idx], i);
      out.put(static_cast<char>(coarse[idx]));
    }
    out.put(static_cast<char>(labels[idx]));
    out.write(reinterpret_cast<const char*>(px + i * kCifarPixels), kCifarPixels);
  }
  out.close();
  HT_CHECK(out.good(), "write_cifar_file: writing {} failed: {}", file.string(), std::strerror(errno));
}

const std::vector<std::string>& cifar_standard_names(CifarVariant v, CifarLabel label) {
  static const std::vector<std::string> c10 = {"airplane", "automobile", "bird",  "cat",  "deer",
                                               "dog",      "frog",       "horse", "ship", "truck"};
  static const std::vector<std::string> fine = {
      "apple",       "aquarium_fish", "baby",         "bear",       "beaver",     "bed",        "bee",
      "beetle",      "bicycle",       "bottle",       "bowl",       "boy",        "bridge",     "bus",
      "butterfly",   "camel",         "can",          "castle",     "caterpillar", "cattle",    "chair",
      "chimpanzee",  "clock",         "cloud",        "cockroach",  "couch",      "crab",       "crocodile",
      "cup",         "dinosaur",      "dolphin",      "elephant",   "flatfish",   "forest",     "fox",
      "girl",        "hamster",       "house",        "kangaroo",   "keyboard",   "lamp",       "lawn_mower",
      "leopard",     "lion",          "lizard",       "lobster",    "man",        "maple_tree", "motorcycle",
      "mountain",    "mouse",         "mushroom",     "oak_tree",   "orange",     "orchid",     "otter",
      "palm_tree",   "pear",          "pickup_truck", "pine_tree",  "plain",      "plate",      "poppy",
      "porcupine",   "possum",        "rabbit",       "raccoon",    "ray",        "road",       "rocket",
      "rose",        "sea",           "seal",         "shark",      "shrew",      "skunk",      "skyscraper",
      "snail",       "snake",         "spider",       "squirrel",   "streetcar",  "sunflower",  "sweet_pepper",
      "table",       "tank",          "telephone",    "television", "tiger",      "tractor",    "train",
      "trout",       "tulip",         "turtle",       "wardrobe",   "whale",      "willow_tree", "wolf",
      "woman",       "worm"};
  static const std::vector<std::string> coarse = {"aquatic_mammals",
                                                  "fish",
                                                  "flowers",
                                                  "food_containers",
                                                  "fruit_and_vegetables",
                                                  "household_electrical_devices",
                                                  "household_furniture",
                                                  "insects",
                                                  "large_carnivores",
                                                  "large_man-made_outdoor_things",
                                                  "large_natural_outdoor_scenes",
                                                  "large_omnivores_and_herbivores",
                                                  "medium_mammals",
                                                  "non-insect_invertebrates",
                                                  "people",
                                                  "reptiles",
                                                  "small_mammals",
                                                  "trees",
                                                  "vehicles_1",
                                                  "vehicles_2"};
  if (v == CifarVariant::cifar10) return c10;
  return label == CifarLabel::coarse ? coarse : fine;
}

CifarDataset::CifarDataset(std::shared_ptr<const CifarData> data) : data_(std::move(data)) {
  HT_CHECK(data_ != nullptr && data_->size() > 0, "CifarDataset: no records");
}

CifarDataset::CifarDataset(const fs::path& dir, const CifarOptions& opts)
    : CifarDataset(std::make_shared<const CifarData>(load_cifar(dir, opts))) {}

Sample CifarDataset::get(int64_t index, SampleRng&) const {
  return {data_->image(index), data_->labels[static_cast<std::size_t>(index)]};
}

}  // namespace ht::data
