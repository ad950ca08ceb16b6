// ImageNet-style image folders: class discovery, the torchvision file order (symbolic links followed, loops
// refused), the flat list-file layout, decoding with counters, and a decode-throughput measurement.
#include "hadatrain/data/image_folder.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "data/file_walk.h"
#include "hadatrain/core/error.h"

namespace ht::data {
namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The image files under class folder `dir`, as (folder relative to dir, file name) pairs in the order found.
// Symbolic links are followed as torchvision's ImageFolder follows them (os.walk with followlinks=True; a loop is an
// error naming the link: data/file_walk.h).
std::vector<std::pair<std::string, std::string>> walk_class_folder(const fs::path& root, const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const fs::path& path : files_under(dir, "image folder " + root.string()))
    if (has_image_extension(path))
      entries.emplace_back(path.parent_path().lexically_relative(dir).generic_string(), path.filename().string());
  return entries;
}

}  // namespace

bool has_image_extension(const fs::path& file) {
  const std::string ext = lower(file.extension().string());
  return ext == ".jpeg" || ext == ".jpg" || ext == ".png";
}

ImageFolder::ImageFolder(ImageFolderOptions opts) : opts_(std::move(opts)) {
  HT_CHECK(fs::is_directory(opts_.root), "image folder: {} is not a directory", opts_.root.string());
  if (opts_.list_file.empty()) scan_class_folders();
  else read_list_file();
  HT_CHECK(!files_.empty(), "image folder {}: no .jpeg/.jpg/.png files found", opts_.root.string());
}

void ImageFolder::scan_class_folders() {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(opts_.root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code st;
    const fs::file_status status = it->status(st);  // through links (Note [Symbolic links in folder walks] in file_walk.cpp)
    HT_CHECK(!st || status.type() == fs::file_type::not_found, "image folder {}: cannot read {}: {}",
             opts_.root.string(), it->path().string(), st.message());
    if (fs::is_directory(status)) found.push_back(it->path().filename().string());
  }
  HT_CHECK(!ec, "image folder {}: cannot list it: {}", opts_.root.string(), ec.message());
  std::sort(found.begin(), found.end());
  HT_CHECK(!found.empty(), "image folder {}: no class sub-folders (expected root/<class>/<image files>)",
           opts_.root.string());
  if (opts_.classes.empty()) {
    classes_ = found;
  } else {
    classes_ = opts_.classes;
    const std::set<std::string> known(classes_.begin(), classes_.end());
    for (const auto& f : found)
      HT_CHECK(known.count(f), "image folder {}: sub-folder {} is not one of the {} given classes",
               opts_.root.string(), f, classes_.size());
  }
  std::map<std::string, int64_t> index;
  for (std::size_t i = 0; i < classes_.size(); ++i) index[classes_[i]] = static_cast<int64_t>(i);

  for (const auto& cls : found) {
    // torchvision: sorted(os.walk(class_dir, followlinks=True)), then sorted file names per directory. Sorting
    // (directory relative to the class folder, file name) pairs gives the same order.
    const fs::path dir = opts_.root / cls;
    std::vector<std::pair<std::string, std::string>> entries = walk_class_folder(opts_.root, dir);
    HT_CHECK(!entries.empty(), "image folder {}: class folder {} holds no .jpeg/.jpg/.png file", opts_.root.string(),
             cls);
    for (auto& e : entries)
      if (e.first == ".") e.first.clear();
    std::sort(entries.begin(), entries.end());
    for (const auto& [sub, name] : entries) {
      files_.push_back(sub.empty() ? dir / name : dir / sub / name);
      labels_.push_back(index.at(cls));
    }
  }
}

void ImageFolder::read_list_file() {
  std::ifstream in(opts_.list_file);
  HT_CHECK(in.good(), "image folder: cannot open list file {}: {}", opts_.list_file.string(), std::strerror(errno));
  std::vector<std::pair<std::string, std::string>> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream ss(line);
    std::string file, label, extra;
    if (!(ss >> file)) continue;  // blank line
    HT_CHECK(static_cast<bool>(ss >> label) && !(ss >> extra),
             "image list {}:{}: expected \"<file> <class name or index>\", got \"{}\"", opts_.list_file.string(),
             line_no, line);
    rows.emplace_back(file, label);
  }
  HT_CHECK(!rows.empty(), "image list {} holds no entries", opts_.list_file.string());
  const bool numeric = all_digits(rows.front().second);
  classes_ = opts_.classes;
  if (classes_.empty() && !numeric) {
    std::set<std::string> names;
    for (const auto& r : rows) names.insert(r.second);
    classes_.assign(names.begin(), names.end());
  }
  std::map<std::string, int64_t> index;
  for (std::size_t i = 0; i < classes_.size(); ++i) index[classes_[i]] = static_cast<int64_t>(i);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& [file, label] = rows[i];
    HT_CHECK(all_digits(label) == numeric, "image list {}: entry {} ({}) mixes class indices and class names",
             opts_.list_file.string(), i + 1, file);
    int64_t y;
    if (numeric) {
      y = std::stoll(label);
      HT_CHECK(classes_.empty() || y < static_cast<int64_t>(classes_.size()),
               "image list {}: entry {} ({}) has class index {}, but there are {} classes", opts_.list_file.string(),
               i + 1, file, y, classes_.size());
    } else {
      const auto it = index.find(label);
      HT_CHECK(it != index.end(), "image list {}: entry {} ({}) names class {}, which is not among the {} classes",
               opts_.list_file.string(), i + 1, file, label, classes_.size());
      y = it->second;
    }
    files_.push_back(opts_.root / file);
    labels_.push_back(y);
  }
  if (classes_.empty()) {  // numeric labels and no names: name the classes by their index
    const int64_t n = *std::max_element(labels_.begin(), labels_.end()) + 1;
    for (int64_t i = 0; i < n; ++i) classes_.push_back(std::to_string(i));
  }
}

const fs::path& ImageFolder::file(int64_t index) const {
  HT_CHECK(index >= 0 && index < size(), "image folder: index {} is out of range [0, {})", index, size());
  return files_[static_cast<std::size_t>(index)];
}

int64_t ImageFolder::label(int64_t index) const {
  HT_CHECK(index >= 0 && index < size(), "image folder: index {} is out of range [0, {})", index, size());
  return labels_[static_cast<std::size_t>(index)];
}

std::string ImageFolder::describe_sample(int64_t index) const { return file(index).string(); }

Sample ImageFolder::get(int64_t index, SampleRng&) const {
  const fs::path& f = file(index);
  const int64_t t0 = now_ns();
  const auto bytes = read_file_bytes(f);
  Sample s{decode_image(bytes, f.string(), opts_.decode), label(index)};
  n_nanos_ += now_ns() - t0;
  n_images_ += 1;
  n_bytes_ += static_cast<int64_t>(bytes.size());
  n_pixels_ += s.image.height * s.image.width;
  return s;
}

DecodeStats ImageFolder::decode_stats() const {
  return {n_images_.load(), n_bytes_.load(), n_pixels_.load(), static_cast<double>(n_nanos_.load()) * 1e-9};
}

void ImageFolder::reset_decode_stats() { n_images_ = n_bytes_ = n_pixels_ = n_nanos_ = 0; }

std::string DecodeStats::summary() const {
  return fmt::format("{} images, {:.1f} MB, {:.1f} Mpx in {:.2f} s: {:.0f} img/s, {:.1f} MB/s, {:.1f} Mpx/s", images,
                     bytes * 1e-6, pixels * 1e-6, seconds, images_per_second(), megabytes_per_second(),
                     megapixels_per_second());
}

DecodeStats measure_decode(const std::vector<fs::path>& files, const DecodeOptions& opts, int threads) {
  HT_CHECK(threads >= 1, "measure_decode: threads must be >= 1, got {}", threads);
  std::atomic<int64_t> next{0}, bytes{0}, pixels{0}, images{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (int64_t i = next++; i < static_cast<int64_t>(files.size()); i = next++) {
        const auto& f = files[static_cast<std::size_t>(i)];
        const auto b = read_file_bytes(f);
        const Image img = decode_image(b, f.string(), opts);
        bytes += static_cast<int64_t>(b.size());
        pixels += img.height * img.width;
        images += 1;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = static_cast<int64_t>(files.size());
    }
  };
  const int64_t t0 = now_ns();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  const double seconds = static_cast<double>(now_ns() - t0) * 1e-9;
  if (error) std::rethrow_exception(error);
  return {images.load(), bytes.load(), pixels.load(), seconds};
}

}  // namespace ht::data
