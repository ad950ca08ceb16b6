// What a checkpoint converted from a Hugging Face folder records of it (train/lm_source.h, hf_source_record): the
// folder, config.json's essentials, the weights' stored dtypes, and each file read with its size and CRC-32.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/train/lm_source.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Reads the whole file in blocks (a shard may be several GB).
FileDigest digest_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "{}: cannot open it to record its CRC-32: {}", path.string(), std::strerror(errno));
  FileDigest d;
  std::vector<char> block(std::size_t{1} << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    d.crc = crc32_update(d.crc, block.data(), n);
    d.bytes += n;
  }
  HT_CHECK(!in.bad(), "{}: read error while recording its CRC-32", path.string());
  return d;
}

// config.json's keys that say what the model is and where it came from, those the file gives.
json config_essentials(const fs::path& config_path) {
  std::ifstream in(config_path, std::ios::binary);
  json out = json::object();
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    HT_FAIL("{}: invalid JSON: {}", config_path.string(), e.what());
  }
  for (const char* key : {"architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path"})
    if (config.contains(key)) out[key] = config[key];
  return out;
}

}  // namespace

json hf_source_record(const fs::path& dir, const models::HfWeights& w) {
  json r;
  r["format"] = "hf";
  fs::path folder = fs::absolute(dir).lexically_normal();
  if (!folder.has_filename()) folder = folder.parent_path();  // "hf/" -> "hf"
  r["folder"] = folder.string();
  r["converted_by"] = fmt::format("hadatrain {}", HADATRAIN_VERSION);
  r["config"] = config_essentials(dir / "config.json");
  std::set<std::string> dtypes;
  for (const auto& [name, t] : w.tensors) dtypes.insert(std::string(dtype_name(t.dtype())));
  r["dtypes"] = json(std::vector<std::string>(dtypes.begin(), dtypes.end()));
  json files = json::array();
  for (const std::string& name : w.files) {
    const FileDigest d = digest_file(dir / name);
    files.push_back({{"name", name}, {"bytes", d.bytes}, {"crc32", fmt::format("{:08x}", d.crc)}});
  }
  r["files"] = files;
  return r;
}

}  // namespace ht::train
