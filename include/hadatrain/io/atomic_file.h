// Atomic file replacement: write `<path>.tmp.<pid>` in the same directory, fsync it, rename it over `path`,
// fsync the directory. Readers see either the previous file or the complete new one, never a torn write,
// even if the process or the machine dies midway. See Note [Atomic file replacement].
#pragma once
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <span>
#include <string_view>

namespace ht::io {

// Note [Atomic file replacement]
// 1. The content goes to `<path>.tmp.<pid>` (same directory, hence same file system, so rename is atomic).
// 2. The temporary file is flushed and fsync'ed, then renamed over `path` (POSIX rename replaces atomically).
// 3. The directory is fsync'ed so the rename itself survives a power loss.
// A `path` that is a symbolic link is written through: steps 1-3 run beside the file it names, which is replaced,
// and the link stays (a rename over the link itself would turn it into a file and leave its target as it was).
// On any failure before the rename (including an exception thrown by the caller's writer) the temporary file
// is removed and `path` is untouched. I/O failures throw ht::Error naming the path and strerror(errno);
// exceptions thrown by the caller's writer propagate unchanged after the clean-up.
// Two writers of the same path in one process at the same time are not supported (they share the pid).

// An open temporary file that becomes `path` on commit(); destroying it uncommitted removes it.
// For callers that stream large outputs piece by piece (safetensors writes tensors one at a time).
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  std::FILE* file() const { return file_; }
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  // Writes bytes; throws ht::Error naming the path when the write fails (disk full, ...).
  void write(const void* data, std::size_t nbytes);
  // Flush, fsync, close, rename over path(), fsync the directory.
  void commit();

 private:
  void discard() noexcept;
  std::filesystem::path path_;
  std::filesystem::path temp_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// Replaces `path` with whatever `write` puts into the FILE* (checked with ferror afterwards).
void write_file_atomic_stdio(const std::filesystem::path& path, const std::function<void(std::FILE*)>& write);
// Replaces `path` with whatever `write` puts into the stream (checked for badbit/failbit afterwards).
void write_file_atomic_stream(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);
// Replaces `path` with the given bytes / text.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// Test hook for the fault tests (tests/fault): a disk that fills up. The hook is asked before every
// AtomicFile::write and MetricsLog record write with the target path and the bytes about to be written;
// returning a WriteFault makes that write store `bytes_written` of them (at most nbytes) and then fail with
// errno `error` (e.g. ENOSPC), as a full disk does. An empty hook (the default) injects nothing. Not for use
// outside tests: the hook is process-wide and is called from whichever thread writes.
struct WriteFault {
  std::size_t bytes_written = 0;
  int error = 0;
};
using WriteFaultHook = std::function<std::optional<WriteFault>(const std::filesystem::path& target, std::size_t nbytes)>;
void set_write_fault_hook(WriteFaultHook hook);
// The fault the hook injects into a write of `nbytes` to `target` (nullopt: none, or no hook).
std::optional<WriteFault> injected_write_fault(const std::filesystem::path& target, std::size_t nbytes);

// fsync a directory so that entries created, renamed or removed in it are durable. Throws ht::Error naming
// the directory; file systems that cannot fsync directories (EINVAL) are accepted silently.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace ht::io
