// Output-path checks (io/output_path.h): what exists is inspected with std::filesystem and access(2), nothing is
// created, and every failure names the caller's flag or key and the path.
#include "hadatrain/io/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "hadatrain/core/error.h"

namespace ht::io {
namespace fs = std::filesystem;

namespace {

bool writable_dir(const fs::path& dir) { return ::access(dir.c_str(), W_OK | X_OK) == 0; }

// The nearest ancestor of `p` (an absolute path) that exists, or p itself.
fs::path nearest_existing(const fs::path& p) {
  std::error_code ec;
  fs::path a = p;
  while (!fs::exists(a, ec) && a.has_relative_path()) a = a.parent_path();
  return a;
}

}  // namespace

void check_output_path(const fs::path& path, OutputKind kind, std::string_view what) {
  HT_CHECK(!path.empty(), "{}: the path is empty", what);
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec).lexically_normal();
  HT_CHECK(!ec, "{}: {}: {}", what, path.string(), ec.message());
  const fs::file_status st = fs::status(abs, ec);
  const fs::file_status link = fs::symlink_status(abs, ec);
  const bool is_dir = fs::is_directory(st);
  if (fs::exists(st)) {
    if (kind == OutputKind::directory) {
      HT_CHECK(is_dir, "{}: {} exists and is not a directory (expected a folder to write into)", what, path.string());
      HT_CHECK(writable_dir(abs), "{}: the folder {} is not writable: {}", what, path.string(), std::strerror(errno));
    } else {
      HT_CHECK(!is_dir, "{}: {} is a directory (expected a file name)", what, path.string());
      // An output file is replaced whole (written beside it, then renamed over it): over a terminal, a pipe or a
      // device such as /dev/stdout that would put a regular file in its place, and no byte would reach it.
      HT_CHECK(fs::is_regular_file(st), "{}: {} is not a regular file (a terminal, pipe or device): hadatrain "
               "replaces an output file whole, so give a file's name", what, path.string());
      const fs::path parent = abs.parent_path();
      HT_CHECK(writable_dir(parent), "{}: cannot replace {}: its folder {} is not writable: {}", what, path.string(),
               parent.string(), std::strerror(errno));
    }
    return;
  }
  HT_CHECK(!fs::is_symlink(link), "{}: {} is a symbolic link to {}, which does not exist", what, path.string(),
           fs::read_symlink(abs, ec).string());
  // Missing: the path (or its folder, for a file) is created below the nearest ancestor that exists.
  const fs::path ancestor = nearest_existing(abs.parent_path());
  HT_CHECK(fs::is_directory(ancestor, ec), "{}: cannot create {}: {} is not a directory", what, path.string(),
           ancestor.string());
  HT_CHECK(writable_dir(ancestor), "{}: cannot create {}: the folder {} is not writable: {}", what, path.string(),
           ancestor.string(), std::strerror(errno));
}

void create_output_directory(const fs::path& path, std::string_view what) {
  std::error_code ec;
  fs::create_directories(path, ec);
  HT_CHECK(!ec, "{}: cannot create {}: {}", what, path.string(), ec.message());
  HT_CHECK(fs::is_directory(path, ec), "{}: {} exists and is not a directory", what, path.string());
}

}  // namespace ht::io
