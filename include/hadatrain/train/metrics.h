// Structured metrics: one JSON object per line (JSONL) in the run directory, written with one write(2) per
// record so a running or crashed job can be inspected. A record whose write fails (a full disk) is cut off
// again: the file keeps only whole records (a kill in the middle of a write can still leave a cut-off last
// line, which a resume removes: train/run_log.h). Records are built field by field:
//
//   metrics.write(MetricsRecord("train").add("step", step).add("loss", loss));
//   -> {"type": "train", "step": 100, "loss": 0.4123}
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace ht::train {

class MetricsRecord {
 public:
  explicit MetricsRecord(std::string_view type);
  MetricsRecord& add(std::string_view key, double value);  // non-finite values are written as null
  MetricsRecord& add(std::string_view key, int64_t value);
  MetricsRecord& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  MetricsRecord& add(std::string_view key, std::string_view value);
  // The JSON object, without a newline.
  std::string json() const { return body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_;
};

enum class MetricsMode { truncate, append };  // append: a resumed run continues its metrics file

class MetricsLog {
 public:
  // Creates (truncates) or appends to `path`; throws ht::Error when it cannot be written.
  explicit MetricsLog(const std::string& path, MetricsMode mode = MetricsMode::truncate);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Appends the record and a newline. On a failed write, truncates the file back to its last whole record
  // and throws ht::Error naming the file and the reason.
  void write(const MetricsRecord& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;  // bytes of whole records in the file
};

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

}  // namespace ht::train
