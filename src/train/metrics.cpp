// JSONL metrics records (see metrics.h).
#include "hadatrain/train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "hadatrain/core/error.h"

namespace ht::train {

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(c));
        else out += c;
    }
  }
  return out + "\"";
}

MetricsRecord::MetricsRecord(std::string_view type) : body_("{\"type\": " + json_quote(type)) {}

void MetricsRecord::key(std::string_view k) { body_ += ", " + json_quote(k) + ": "; }

MetricsRecord& MetricsRecord::add(std::string_view k, double value) {
  key(k);
  body_ += std::isfinite(value) ? fmt::format("{}", value) : "null";
  return *this;
}

MetricsRecord& MetricsRecord::add(std::string_view k, int64_t value) {
  key(k);
  body_ += fmt::format("{}", value);
  return *this;
}

MetricsRecord& MetricsRecord::add(std::string_view k, std::string_view value) {
  key(k);
  body_ += json_quote(value);
  return *this;
}

MetricsLog::MetricsLog(const std::string& path, MetricsMode mode)
    : path_(path), out_(path, mode == MetricsMode::append ? std::ios::app : std::ios::trunc) {
  HT_CHECK(out_.good(), "{}: cannot write the metrics file: {}", path, std::strerror(errno));
}

void MetricsLog::write(const MetricsRecord& record) {
  out_ << record.json() << '\n';
  out_.flush();
  HT_CHECK(out_.good(), "{}: writing a metrics record failed (disk full?)", path_);
}

}  // namespace ht::train
