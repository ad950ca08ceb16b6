// Test helpers: random tensors and comparisons.
#include "testing.h"

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <limits>
#include <vector>

namespace ht::test {

namespace {
// Calls `on_message` with each message's text, then writes the formatted line to `out`.
class HookSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  HookSink(std::ostream& out, std::function<void(const std::string&)> on_message)
      : out_(out), on_message_(std::move(on_message)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    on_message_(std::string(msg.payload.data(), msg.payload.size()));
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    out_.write(formatted.data(), static_cast<std::streamsize>(formatted.size()));
  }
  void flush_() override { out_.flush(); }

 private:
  std::ostream& out_;
  std::function<void(const std::string&)> on_message_;
};
}  // namespace

LogCapture::LogCapture(int level, std::function<void(const std::string&)> on_message)
    : previous_(spdlog::default_logger()), previous_level_(spdlog::get_level()) {
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (on_message)
    sink = std::make_shared<HookSink>(log_, std::move(on_message));
  else
    sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", std::move(sink)));
  spdlog::set_level(static_cast<spdlog::level::level_enum>(level));
}

LogCapture::~LogCapture() {
  spdlog::set_default_logger(std::static_pointer_cast<spdlog::logger>(previous_));
  spdlog::set_level(static_cast<spdlog::level::level_enum>(previous_level_));
}

TempDir::TempDir(const std::string& tag) {
  std::string pattern = (std::filesystem::temp_directory_path() / ("ht_" + tag + "_XXXXXX")).string();
  HT_CHECK(::mkdtemp(pattern.data()) != nullptr, "TempDir: mkdtemp({}) failed", pattern);
  path = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

const std::filesystem::path& scratch_dir() {
  static const TempDir dir("scratch");
  return dir.path;
}

const std::filesystem::path& idx8_dataset() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = scratch_dir() / "idx8";
    write_idx_dataset(d, 8, kIdx8Train, kIdx8Test);
    return d;
  }();
  return dir;
}

namespace {

void put_u32(std::ofstream& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.put(static_cast<char>((v >> shift) & 0xFF));
}

// Pixel (y, x) of image i of a split: the class lights a row and a column; the hash adds noise.
uint8_t idx_pixel(int side, int split, int i, int y, int x) {
  const int label = i % 10;
  const uint32_t h =
      static_cast<uint32_t>((split * 7919 + i) * 2654435761u + static_cast<uint32_t>(y * side + x) * 40503u);
  const int noise = static_cast<int>((h >> 13) % 160);
  const bool lit = y == label % side || x == (label * 3 + label / side) % side;  // distinct per class
  return static_cast<uint8_t>((lit ? 90 : 0) + noise);
}

void write_idx_split(const std::filesystem::path& dir, const std::string& prefix, int side, int split, int n) {
  std::ofstream images(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary);
  put_u32(images, 0x00000803);
  put_u32(images, static_cast<uint32_t>(n));
  put_u32(images, static_cast<uint32_t>(side));
  put_u32(images, static_cast<uint32_t>(side));
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < side; ++y)
      for (int x = 0; x < side; ++x) images.put(static_cast<char>(idx_pixel(side, split, i, y, x)));
  std::ofstream labels(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
  put_u32(labels, 0x00000801);
  put_u32(labels, static_cast<uint32_t>(n));
  for (int i = 0; i < n; ++i) labels.put(static_cast<char>(i % 10));
  HT_CHECK(images.good() && labels.good(), "write_idx_dataset: writing {} failed", dir.string());
}

}  // namespace

void write_idx_dataset(const std::filesystem::path& dir, int side, int n_train, int n_test) {
  std::filesystem::create_directories(dir);
  write_idx_split(dir, "train", side, 0, n_train);
  write_idx_split(dir, "t10k", side, 1, n_test);
}

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  Generator gen(seed);
  return uniform(shape, lo, hi, gen, {dtype});
}

std::string compare(const Tensor& actual, const std::vector<double>& expected, double rtol, double atol) {
  const auto a = actual.to_vector<double>();
  if (a.size() != expected.size())
    return fmt::format("size mismatch: actual {} has {} elements, expected {}", actual.describe(), a.size(),
                       expected.size());
  std::string msg;
  int shown = 0;
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], e = expected[i];
    const bool both_nan = std::isnan(x) && std::isnan(e);
    const bool same_inf = std::isinf(x) && std::isinf(e) && (x > 0) == (e > 0);
    if (both_nan || same_inf) continue;
    const double err = std::abs(x - e);
    if (!(err <= atol + rtol * std::abs(e))) {
      ++bad;
      worst = std::max(worst, err);
      if (shown++ < 5) msg += fmt::format("  [{}] actual {:.10g} expected {:.10g}\n", i, x, e);
    }
  }
  if (bad == 0) return {};
  return fmt::format("{} of {} elements differ (worst abs error {:.3g}; rtol {}, atol {}):\n{}", bad, a.size(), worst,
                     rtol, atol, msg);
}

std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (!(actual.shape() == expected.shape()))
    return fmt::format("shape mismatch: actual {} vs expected {}", actual.describe(), expected.describe());
  return compare(actual, expected.to_vector<double>(), rtol, atol);
}

double rel_error(const Tensor& actual, const Tensor& reference) {
  const std::vector<double> a = actual.to(Device::cpu()).to_vector<double>();
  const std::vector<double> r = reference.to(Device::cpu()).to_vector<double>();
  if (a.size() != r.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - r[i]) * (a[i] - r[i]);
    den += r[i] * r[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

std::map<int64_t, double> train_losses(const std::filesystem::path& out_dir) {
  const std::filesystem::path file = out_dir / "metrics.jsonl";
  std::ifstream in(file);
  HT_CHECK(in.good(), "cannot read {}", file.string());
  std::map<int64_t, double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") != "train") continue;
    const int64_t step = j.at("step").get<int64_t>();
    HT_CHECK(out.count(step) == 0, "step {} is logged twice in {}", step, file.string());
    out[step] = j.at("loss").get<double>();
  }
  return out;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace ht::test
