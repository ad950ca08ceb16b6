// `hadatrain inspect-checkpoint --checkpoint DIR`: what a checkpoint holds and records, without loading its tensors:
// its files and sizes, the model tensors' count and dtypes, where its weights came from (the line of descent its
// records tell, train/provenance.h), the metadata of model.safetensors (an LM checkpoint's config.json, tokenizer and
// LoRA config; a converted one's source, a fine-tuned one's init_from) and state.json. DIR is a step_<N> folder, a
// checkpoint root (its latest checkpoint) or a root's `latest` or `best` file.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/train/provenance.h"

namespace ht::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct InspectCheckpointArgs {
  std::string checkpoint, log_level = "warn";
};

// The step_<N> folder `path` names (Note [Checkpoint directory protocol] in io/checkpoint_files.h).
fs::path checkpoint_folder(const fs::path& path) {
  const fs::path dir = io::resolve_checkpoint_pointer(path);
  std::error_code ec;
  HT_CHECK(fs::is_directory(dir, ec), "--checkpoint: {} is not a checkpoint folder (a step_<N> folder, a checkpoint "
                                      "root, or its latest or best file)",
           path.string());
  if (fs::exists(dir / "model.safetensors", ec)) return dir;
  const std::optional<int64_t> step = io::latest_checkpoint_step(dir);
  HT_CHECK(step.has_value(), "--checkpoint: {} holds neither model.safetensors nor step_<N> checkpoints", dir.string());
  return io::checkpoint_dir(dir, *step);
}

// `text` indented by `pad`, line by line.
std::string indented(const std::string& text, const std::string& pad) {
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    out += pad + text.substr(start, end == std::string::npos ? std::string::npos : end - start) + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// A metadata value: JSON objects and lists (what hadatrain writes as JSON) pretty-printed below the key, anything
// else on the key's line.
std::string metadata_entry(const std::string& key, const std::string& value) {
  const json j = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() || j.is_array()) return fmt::format("  {}:\n{}", key, indented(j.dump(2), "    "));
  return fmt::format("  {}: {}\n", key, value);
}

int run_inspect_checkpoint(const InspectCheckpointArgs& a) {
  ht::logging::set_level(a.log_level);
  const fs::path dir = checkpoint_folder(a.checkpoint);
  const io::SafetensorsHeader model = io::read_safetensors_header(dir / "model.safetensors");
  std::string step = "?";
  if (const auto it = model.metadata.find("step"); it != model.metadata.end()) step = it->second;
  fmt::print("checkpoint {} (step {})\n", dir.string(), step);

  std::map<std::string, uintmax_t> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files[e.path().filename().string()] = e.file_size();
  fmt::print("files:\n");
  for (const auto& [name, bytes] : files) fmt::print("  {} ({} bytes)\n", name, bytes);

  std::map<std::string, int64_t> dtypes;
  int64_t elements = 0;
  for (const io::TensorInfo& t : model.tensors) {
    ++dtypes[std::string(dtype_name(t.dtype))];
    elements += numel_of(t.shape);
  }
  std::string by_dtype;
  for (const auto& [name, n] : dtypes) by_dtype += fmt::format("{}{} {}", by_dtype.empty() ? "" : ", ", n, name);
  fmt::print("model.safetensors: {} tensors{}, {} elements\n", model.tensors.size(),
             by_dtype.empty() ? "" : " (" + by_dtype + ")", elements);

  const std::vector<std::string> descent = train::provenance_lines(model.metadata);
  if (!descent.empty()) {
    fmt::print("made from (newest first):\n");
    for (const std::string& line : descent) fmt::print("  {}\n", line);
  }

  fmt::print("metadata of model.safetensors:\n");
  for (const auto& [key, value] : model.metadata)
    if (key != "format" && key != "step") fmt::print("{}", metadata_entry(key, value));

  std::ifstream state(dir / "state.json", std::ios::binary);
  if (!state) return 0;  // model weights only (a converted checkpoint has a state.json; a hand-made folder may not)
  const json st = json::parse(state, nullptr, /*allow_exceptions=*/false);
  if (st.is_discarded())
    fmt::print("state.json: not valid JSON\n");
  else
    fmt::print("state.json:\n{}", indented(st.dump(2), "  "));
  return 0;
}

}  // namespace

Command add_inspect_checkpoint_command(CLI::App& app) {
  auto a = std::make_shared<InspectCheckpointArgs>();
  Command c;
  c.app = app.add_subcommand("inspect-checkpoint",
                             "Show what a checkpoint holds and records (files, tensors, where its weights came from, "
                             "metadata, state.json) without loading it");
  c.app->add_option("--checkpoint", a->checkpoint, "A step_<N> checkpoint folder, a checkpoint root, or its latest or "
                                                   "best file")
      ->required();
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] { return run_inspect_checkpoint(*a); };
  return c;
}

}  // namespace ht::cli
