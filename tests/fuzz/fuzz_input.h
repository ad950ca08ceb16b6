// Shared by the fuzz targets (tests/fuzz/fuzz_*.cpp): the readers take paths, so an input is written to a
// file of this process first; ht::Error (a rejected input, with a message) is the expected outcome of a bad
// one, anything else (a crash, a sanitizer report, another exception type escaping) is a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ht::fuzz {

// A scratch folder of this process (TMPDIR or /tmp), made on first use and removed at exit. The path lives
// on the heap for the whole process, so the exit handler never reads a destroyed object.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* d = new std::filesystem::path(std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                                        ("hadatrain_fuzz_" + std::to_string(::getpid())));
    std::filesystem::create_directories(*d);
    return d;
  }();
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return true;
  }();
  (void)cleanup;
  return *dir;
}

// Writes `size` bytes to scratch()/name and returns the path.
inline std::filesystem::path write_input(const std::string& name, const uint8_t* data, std::size_t size) {
  const std::filesystem::path p = scratch() / name;
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return p;
}

}  // namespace ht::fuzz
