// HF sharded safetensors checkpoints: model.safetensors.index.json maps each tensor name to a shard file;
// every shard is loaded once and checked to hold the tensors the index promises.
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hadatrain/io/safetensors.h"

namespace ht::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

json read_index(const fs::path& index) {
  std::ifstream in(index, std::ios::binary);
  HT_CHECK(in.good(), "safetensors index '{}': cannot open it", index.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    HT_FAIL("safetensors index '{}': invalid JSON: {}", index.string(), e.what());
  }
}

// A shard name from the index must be a relative path that stays inside the index's directory.
void check_shard_name(const fs::path& index, const std::string& shard) {
  const fs::path p(shard);
  HT_CHECK(!shard.empty() && p.is_relative(), "safetensors index '{}': shard '{}' must be a file name relative to "
           "the index's directory", index.string(), shard);
  for (const auto& part : p)
    HT_CHECK(part != "..", "safetensors index '{}': shard '{}' leaves the index's directory", index.string(), shard);
}

}  // namespace

SafetensorsContents load_sharded_safetensors(const fs::path& dir_or_index_path) {
  fs::path index = dir_or_index_path;
  if (fs::is_directory(dir_or_index_path)) {
    index = dir_or_index_path / kIndexName;
    if (!fs::exists(index)) {
      const fs::path single = dir_or_index_path / kSingleName;
      HT_CHECK(fs::exists(single), "'{}' holds neither {} nor {}", dir_or_index_path.string(), kIndexName,
               kSingleName);
      return load_safetensors(single);
    }
  }
  HT_CHECK(fs::is_regular_file(index), "safetensors index '{}' does not exist", index.string());
  const fs::path dir = index.parent_path();

  const json root = read_index(index);
  HT_CHECK(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(),
           "safetensors index '{}': expected an object with a \"weight_map\" object", index.string());
  const json& weight_map = root["weight_map"];
  HT_CHECK(!weight_map.empty(), "safetensors index '{}': weight_map is empty", index.string());

  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : weight_map.items()) {
    HT_CHECK(shard.is_string(), "safetensors index '{}': weight_map entry '{}' must name a shard file, found {}",
             index.string(), name, shard.dump());
    check_shard_name(index, shard.get<std::string>());
    names_by_shard[shard.get<std::string>()].push_back(name);
  }

  SafetensorsContents out;
  if (root.contains("metadata")) {
    const json& meta = root["metadata"];
    HT_CHECK(meta.is_object() || meta.is_null(), "safetensors index '{}': \"metadata\" must be an object, found {}",
             index.string(), meta.dump());
    if (meta.is_object())
      for (const auto& [k, v] : meta.items()) out.metadata.emplace(k, v.is_string() ? v.get<std::string>() : v.dump());
  }
  for (auto& [shard, names] : names_by_shard) {
    const fs::path file = dir / shard;
    HT_CHECK(fs::is_regular_file(file), "safetensors index '{}': shard '{}' (holding {} tensors, e.g. '{}') is missing "
             "from '{}'", index.string(), shard, names.size(), names.front(), dir.string());
    SafetensorsContents part = load_safetensors(file);
    for (const std::string& name : names) {
      auto it = part.tensors.find(name);
      HT_CHECK(it != part.tensors.end(), "safetensors index '{}': tensor '{}' is mapped to shard '{}', but that "
               "shard lacks it", index.string(), name, shard);
      out.tensors.emplace(name, std::move(it->second));
    }
  }
  return out;
}

}  // namespace ht::io
