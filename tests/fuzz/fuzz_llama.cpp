// Fuzz target: the readers of LLaMA model descriptions from outside. Input: the first byte picks the reader
// (even: the rest is an HF config.json, parsed and read by models::LlamaConfig::from_json, whose parameter count
// is then taken; odd: the rest is a llama2.c checkpoint, read by models::read_llama2c, which checks the file's size
// against its header before it reads a weight).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hadatrain/core/error.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/models/llama.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  try {
    if (data[0] % 2 == 0) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(data + 1, data + size);
      } catch (const nlohmann::json::exception&) {
        return 0;  // not JSON: LlamaConfig::load reports that before from_json
      }
      const ht::models::LlamaConfig c = ht::models::LlamaConfig::from_json(j, "config.json");
      (void)c.num_parameters();
      (void)c.to_json();
    } else {
      const auto path = ht::fuzz::write_input("model.bin", data + 1, size - 1);
      (void)ht::models::read_llama2c(path);
    }
  } catch (const ht::Error&) {
  }
  return 0;
}
