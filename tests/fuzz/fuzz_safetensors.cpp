// Fuzz target: the safetensors reader (io/safetensors.h) on one file, and the sharded loader on an index JSON.
// Input: the first byte picks the reader (even: a safetensors file, header and data; odd: the rest is
// model.safetensors.index.json beside a valid shard "a.safetensors" holding tensors "x" and "y").
#include <cstddef>
#include <cstdint>

#include "hadatrain/core/error.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/tensor/factory.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  try {
    if (data[0] % 2 == 0) {
      const auto path = ht::fuzz::write_input("input.safetensors", data + 1, size - 1);
      (void)ht::io::read_safetensors_header(path);
      (void)ht::io::load_safetensors(path);
    } else {
      static const bool shard = [] {
        ht::io::save_safetensors(ht::fuzz::scratch() / "a.safetensors",
                                 {{"x", ht::zeros({2, 3})}, {"y", ht::ones({4}, {ht::DType::i64})}}, {{"k", "v"}});
        return true;
      }();
      (void)shard;
      const auto index = ht::fuzz::write_input("model.safetensors.index.json", data + 1, size - 1);
      (void)ht::io::load_sharded_safetensors(index);
    }
  } catch (const ht::Error&) {
  }
  return 0;
}
