// JSONL metrics records (see metrics.h).
#include "hadatrain/train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/io/atomic_file.h"

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

MetricsLog::MetricsLog(const std::string& path, MetricsMode mode) : path_(path) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == MetricsMode::append ? O_APPEND : O_TRUNC);
  fd_ = ::open(path.c_str(), flags, 0666);
  HT_CHECK(fd_ >= 0, "{}: cannot write the metrics file: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) == 0) size_ = static_cast<int64_t>(st.st_size);
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const MetricsRecord& record) {
  HT_CHECK(fd_ >= 0, "{}: the metrics file is closed after an earlier failed write", path_);
  const std::string line = record.json() + "\n";
  std::size_t done = 0;
  int err = 0;
  std::size_t allowed = line.size();
  const std::optional<io::WriteFault> fault = io::injected_write_fault(path_, line.size());
  if (fault) allowed = fault->bytes_written;
  while (done < allowed) {
    const ssize_t n = ::write(fd_, line.data() + done, allowed - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (err == 0 && fault) err = fault->error;
  if (err == 0) {
    size_ += static_cast<int64_t>(line.size());
    return;
  }
  // Keep the file whole-record JSONL: cut the partial line off again, and write nothing more.
  const bool cut = ::ftruncate(fd_, static_cast<off_t>(size_)) == 0;
  ::close(fd_);
  fd_ = -1;
  HT_FAIL("{}: writing a metrics record failed: {}{}", path_, std::strerror(err),
          cut ? " (the partial record was removed; the file holds the records before it)"
              : " (the partial record could not be removed; a resume removes it)");
}

}  // namespace ht::train
