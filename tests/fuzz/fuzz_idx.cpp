// Fuzz target: the IDX reader (data/idx.h, MNIST's format, raw or gzip) on one file, read whole and with a
// limit, as images and as labels. Input: the file's bytes.
#include <cstddef>
#include <cstdint>

#include "hadatrain/core/error.h"
#include "hadatrain/data/idx.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string path = ht::fuzz::write_input("input-idx", data, size).string();
  for (const int64_t limit : {0, 3}) {
    try {
      (void)ht::data::read_idx_images(path, limit);
    } catch (const ht::Error&) {
    }
    try {
      (void)ht::data::read_idx_labels(path, limit);
    } catch (const ht::Error&) {
    }
  }
  try {
    (void)ht::data::read_idx_count(path, true);
  } catch (const ht::Error&) {
  }
  return 0;
}
