// Sharded checkpoints made whole (dist/fsdp.h): the shard-<rank>-of-<N>.safetensors files of a folder checked to be
// one save's (Note [One save's shards]) and their chunks joined into whole tensors, in one process.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "hadatrain/core/error.h"
#include "hadatrain/core/name_list.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/io/json_metadata.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/ops/ops.h"

namespace ht::dist {

namespace {

// `name` as shard-<rank>-of-<N>.safetensors, the whole name: {rank, N}; nullopt for any other name.
std::optional<std::pair<int, int>> shard_file_rank(const std::string& name) {
  int r = 0, n = 0, used = 0;
  if (std::sscanf(name.c_str(), "shard-%d-of-%d.safetensors%n", &r, &n, &used) != 2 ||
      used != static_cast<int>(name.size()))
    return std::nullopt;
  return std::pair{r, n};
}

// "shard-0-of-2.safetensors, shard-1-of-2.safetensors": four names whole, more as three and how many more.
std::string some_names(const std::vector<std::string>& names) { return first_names(names, names.size() <= 4 ? 4 : 3); }

std::string step_text(const std::optional<int64_t>& step) {
  return step ? fmt::format("step {}", *step) : std::string("no step");
}

}  // namespace

// Note [One save's shards]
// A sharded checkpoint's folder must hold the shards of one save: shard-<r>-of-<N> for r = 0 .. N-1 of one N,
// every one written at the same step, with the same tensors. Files of another save do not join into a model
// (another world size cuts every tensor elsewhere; another step holds other values), so the folder's shards
// are checked against each other before any is joined, and a folder that mixes saves (a leftover
// shard-0-of-4 beside shard-*-of-2, a shard copied in from another step) is an error naming the files and what
// differs, never a model joined from pieces of several. model.safetensors (the unsharded rest) must be of the
// shards' step too (consolidate_checkpoint).
ConsolidatedState consolidate_sharded(const std::filesystem::path& dir) {
  std::map<int, std::map<int, std::string>> saves;  // N -> rank -> file name
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto rn = shard_file_rank(name);
    if (!rn) continue;
    HT_CHECK(rn->second > 0 && rn->first >= 0 && rn->first < rn->second,
             "fsdp: the sharded checkpoint {} holds {}, which names rank {} of {}: no save writes it; remove it",
             dir.string(), name, rn->first, rn->second);
    saves[rn->second][rn->first] = name;
  }
  HT_CHECK(!ec && !saves.empty(), "fsdp: {} holds no shard-<rank>-of-<N>.safetensors files{}", dir.string(),
           ec ? ": " + ec.message() : "");
  if (saves.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [n, files] : saves) {
      std::vector<std::string> names;
      for (const auto& [r, name] : files) names.push_back(name);
      parts.push_back(fmt::format("{} of {} ranks", some_names(names), n));
    }
    HT_FAIL("fsdp: the sharded checkpoint {} holds the shards of {} world sizes: {}; one save writes the shards of "
            "one world size, so these are files of different saves: keep those of the save the folder is (its "
            "model.safetensors and state.json) and remove the others",
            dir.string(), saves.size(), fmt::join(parts, "; "));
  }
  const int world = saves.begin()->first;
  std::vector<io::SafetensorsContents> files;
  std::vector<std::optional<int64_t>> steps;
  std::vector<nlohmann::json> shapes;
  for (int r = 0; r < world; ++r) {
    const auto path = dir / fmt::format("shard-{}-of-{}.safetensors", r, world);
    HT_CHECK(std::filesystem::exists(path), "fsdp: the sharded checkpoint {} lacks {} (it was written by {} ranks)",
             dir.string(), path.filename().string(), world);
    files.push_back(io::load_safetensors(path));
    const auto it = files.back().metadata.find("hadatrain_fsdp");
    HT_CHECK(it != files.back().metadata.end(), "fsdp: {} has no hadatrain_fsdp metadata", path.string());
    const auto [meta_rank, meta_world] =
        io::read_json_metadata(files.back().metadata, "hadatrain_fsdp", path, [&](const nlohmann::json& meta) {
          shapes.push_back(meta.at("shapes"));
          steps.push_back(meta.contains("step") ? std::optional(meta.at("step").get<int64_t>()) : std::nullopt);
          return std::pair{meta.at("rank").get<int>(), meta.at("world_size").get<int>()};
        });
    HT_CHECK(meta_world == world && meta_rank == r, "fsdp: {} says rank {} of {}", path.string(), meta_rank,
             meta_world);
  }
  // Note [One save's shards]: the same step and the same tensors in every shard.
  if (std::any_of(steps.begin(), steps.end(), [&](const auto& s) { return s != steps[0]; })) {
    std::vector<std::string> each;
    for (int r = 0; r < world; ++r)
      each.push_back(fmt::format("shard-{}-of-{}.safetensors at {}", r, world, step_text(steps[r])));
    HT_FAIL("fsdp: the shards of the sharded checkpoint {} were written at different steps ({}): they are files of "
            "different saves, not one checkpoint; copy the folder of one save whole",
            dir.string(), some_names(each));
  }
  for (int r = 1; r < world; ++r) {
    if (shapes[r] == shapes[0]) continue;
    std::string key;  // the first tensor whose shape differs or that one of the two lacks
    for (const auto& [k, v] : shapes[0].items())
      if (key.empty() && (!shapes[r].contains(k) || shapes[r].at(k) != v)) key = k;
    for (const auto& [k, v] : shapes[r].items())
      if (key.empty() && !shapes[0].contains(k)) key = k;
    const auto shape_of = [&](const nlohmann::json& s) { return s.contains(key) ? s.at(key).dump() : "absent"; };
    HT_FAIL("fsdp: the shards of the sharded checkpoint {} hold different tensors: '{}' is {} in "
            "shard-0-of-{}.safetensors but {} in shard-{}-of-{}.safetensors; they are files of different runs, not "
            "one checkpoint",
            dir.string(), key, shape_of(shapes[0]), world, shape_of(shapes[r]), r, world);
  }
  ConsolidatedState out;
  out.world_size = world;
  out.step = steps[0].value_or(-1);
  for (const auto& [key, shape_json] : shapes[0].items()) {
    const Shape shape(shape_json.get<std::vector<int64_t>>());
    std::vector<Tensor> chunks;
    for (int r = 0; r < world; ++r) chunks.push_back(files[r].at(key));
    Tensor joined = cat(chunks, 0);
    const int64_t numel = numel_of(shape);
    HT_CHECK(joined.numel() >= numel, "fsdp: the shards of '{}' hold {} elements, fewer than its shape {}", key,
             joined.numel(), to_string(shape));
    Tensor whole = joined.narrow(0, 0, numel).contiguous().view(shape);
    if (key.rfind("model/", 0) == 0) out.model.emplace(key.substr(6), whole);
    else out.optimizer.emplace(key.substr(6), whole);
  }
  return out;
}

bool has_shards(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::any_of(std::filesystem::directory_iterator(dir, ec), std::filesystem::directory_iterator(),
                     [](const std::filesystem::directory_entry& e) {
                       return e.path().filename().string().rfind("shard-", 0) == 0 && e.path().extension() == ".safetensors";
                     });
}

void consolidate_checkpoint(io::Checkpoint& ck) {
  if (!has_shards(ck.dir)) return;
  ConsolidatedState whole = consolidate_sharded(ck.dir);
  // Note [One save's shards]: model.safetensors holds the rest of the shards' save.
  const auto it = ck.model.metadata.find("step");
  HT_CHECK(it == ck.model.metadata.end() || whole.step < 0 || it->second == std::to_string(whole.step),
           "fsdp: the sharded checkpoint {} mixes saves: its model.safetensors is of step {} but its shards "
           "(shard-*-of-{}.safetensors) were written at step {}; copy the folder of one save whole",
           ck.dir.string(), it == ck.model.metadata.end() ? "" : it->second, whole.world_size, whole.step);
  for (auto& [name, t] : whole.model) ck.model.tensors[name] = std::move(t);
  io::SafetensorsContents optimizer;
  optimizer.tensors = std::move(whole.optimizer);
  ck.optimizer = std::move(optimizer);
}

}  // namespace ht::dist
