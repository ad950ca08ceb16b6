// Atomic file replacement (Note [Atomic file replacement]): temp file, fsync, rename, fsync the directory.
#include "hadatrain/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <streambuf>

#include "hadatrain/core/error.h"

namespace ht::io {
namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

fs::path parent_or_dot(const fs::path& p) {
  fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// An ostream buffer that forwards to a FILE* (which does its own buffering).
class StdioStreamBuf final : public std::streambuf {
 public:
  explicit StdioStreamBuf(std::FILE* f) : f_(f) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    return std::fputc(c, f_) == EOF ? traits_type::eof() : c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    return static_cast<std::streamsize>(std::fwrite(s, 1, static_cast<std::size_t>(n), f_));
  }

 private:
  std::FILE* f_;
};

std::mutex& hook_mutex() {
  static std::mutex m;
  return m;
}
WriteFaultHook& hook_slot() {
  static WriteFaultHook hook;
  return hook;
}

}  // namespace

void set_write_fault_hook(WriteFaultHook hook) {
  std::lock_guard<std::mutex> lock(hook_mutex());
  hook_slot() = std::move(hook);
}

std::optional<WriteFault> injected_write_fault(const fs::path& target, std::size_t nbytes) {
  std::lock_guard<std::mutex> lock(hook_mutex());
  if (!hook_slot()) return std::nullopt;
  std::optional<WriteFault> f = hook_slot()(target, nbytes);
  if (f) f->bytes_written = std::min(f->bytes_written, nbytes);
  return f;
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  HT_CHECK(!path_.empty(), "atomic file write: empty path");
  HT_CHECK(path_.has_filename(), "atomic file write: '{}' names a directory, not a file", path_.string());
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path_, ec))) {  // written through (Note [Atomic file replacement])
    fs::path target = fs::weakly_canonical(path_, ec);
    if (!ec) path_ = std::move(target);
  }
  temp_ = path_;
  temp_ += ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int err = errno;
    HT_FAIL("cannot write '{}': creating the temporary file '{}' failed: {}", path_.string(), temp_.string(),
            errno_text(err));
  }
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp_.c_str());
    HT_FAIL("cannot write '{}': fdopen of the temporary file failed: {}", path_.string(), errno_text(err));
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t nbytes) {
  HT_CHECK(file_ != nullptr, "cannot write '{}': the file was already committed or discarded", path_.string());
  if (nbytes == 0) return;
  if (const std::optional<WriteFault> fault = injected_write_fault(path_, nbytes)) {
    std::fwrite(data, 1, fault->bytes_written, file_);
    discard();
    HT_FAIL("cannot write '{}': writing {} bytes to the temporary file failed: {} (temporary file removed; the "
            "previous file is unchanged)",
            path_.string(), nbytes, errno_text(fault->error));
  }
  if (std::fwrite(data, 1, nbytes, file_) != nbytes) {
    const int err = errno;
    discard();
    HT_FAIL("cannot write '{}': writing {} bytes to the temporary file failed: {} (temporary file removed; the "
            "previous file is unchanged)",
            path_.string(), nbytes, errno_text(err));
  }
}

void AtomicFile::commit() {
  HT_CHECK(file_ != nullptr && !committed_, "cannot commit '{}' twice", path_.string());
  auto fail = [&](const char* step) {
    const int err = errno;
    discard();
    HT_FAIL("cannot write '{}': {} failed: {} (temporary file removed; the previous file is unchanged)",
            path_.string(), step, errno_text(err));
  };
  if (std::ferror(file_)) {
    errno = EIO;
    fail("an earlier write to the temporary file");
  }
  if (std::fflush(file_) != 0) fail("flushing the temporary file");
  if (::fsync(::fileno(file_)) != 0) fail("fsync of the temporary file");
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) fail("closing the temporary file");
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming the temporary file over the target");
  committed_ = true;
  fsync_directory(parent_or_dot(path_));
}

void write_file_atomic_stdio(const fs::path& path, const std::function<void(std::FILE*)>& write) {
  AtomicFile f(path);
  write(f.file());  // an exception here destroys f, which removes the temporary file
  f.commit();
}

void write_file_atomic_stream(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  AtomicFile f(path);
  StdioStreamBuf buf(f.file());
  std::ostream os(&buf);
  write(os);
  os.flush();
  if (!os) {
    const int err = errno;
    const std::string why = std::ferror(f.file()) ? errno_text(err) : "failbit/badbit set while writing";
    HT_FAIL("cannot write '{}': the output stream failed: {} (temporary file removed; the previous file is "
            "unchanged)",
            path.string(), why);
  }
  f.commit();
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    HT_FAIL("cannot open directory '{}' to fsync it: {}", dir.string(), errno_text(err));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS)
    HT_FAIL("fsync of directory '{}' failed: {}", dir.string(), errno_text(err));
}

}  // namespace ht::io
