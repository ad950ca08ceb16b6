// Safetensors metadata values that hadatrain writes as JSON (the Llama and LoRA configs of an LM checkpoint, FSDP's
// shard layout), read back by one rule: a value that is not what hadatrain writes (the file edited, or made by
// another program) is an error naming the file and the key, not the JSON library's message alone.
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "hadatrain/core/error.h"
#include "hadatrain/io/safetensors.h"

namespace ht::io {

// read(the parsed JSON of md[key]) of a file's metadata; `key` must be present (a caller whose missing key has a
// message of its own checks first). Any JSON error, in the parse or in `read`'s accesses, names `file` and `key`.
template <class F>
auto read_json_metadata(const Metadata& md, const std::string& key, const std::filesystem::path& file, F&& read) {
  try {
    return read(nlohmann::json::parse(md.at(key)));
  } catch (const nlohmann::json::exception& e) {
    HT_FAIL("{}: the metadata \"{}\" is not what hadatrain writes ({})", file.string(), key, e.what());
  }
}

}  // namespace ht::io
