// `hadatrain inspect-checkpoint --checkpoint DIR`: what a checkpoint holds and records, without loading its tensors:
// its files and sizes, the model tensors' count and dtypes, where its weights came from (the line of descent its
// records tell, train/provenance.h), the metadata of model.safetensors (an LM checkpoint's config.json, tokenizer and
// LoRA config; a converted one's source, a fine-tuned one's init_from) and state.json. DIR is a step_<N> folder, a
// checkpoint root (its latest checkpoint) or a root's `latest` or `best` file, or an HF model folder (config.json
// beside the weights): then its architecture from config.json, its tensors' count, parameters and dtypes from the
// safetensors headers, and what `hadatrain convert` wrote it from (hadatrain_provenance.json), when it says; or a PEFT
// LoRA adapter folder (adapter_config.json): its LoRA settings, base model, adapters and provenance.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/train/peft_adapter.h"
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

// The regular files of `dir` and their sizes, one line each.
void print_files(const fs::path& dir) {
  std::map<std::string, uintmax_t> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files[e.path().filename().string()] = e.file_size();
  fmt::print("files:\n");
  for (const auto& [name, bytes] : files) fmt::print("  {} ({} bytes)\n", name, bytes);
}

// "N tensors (A bf16, B f32), M elements" of safetensors headers.
struct TensorCount {
  std::size_t tensors = 0;
  int64_t elements = 0;
  std::map<std::string, int64_t> dtypes;
  void add(const io::SafetensorsHeader& h) {
    for (const io::TensorInfo& t : h.tensors) {
      ++dtypes[std::string(dtype_name(t.dtype))];
      elements += numel_of(t.shape);
    }
    tensors += h.tensors.size();
  }
  std::string describe(const char* unit) const {
    std::string by_dtype;
    for (const auto& [name, n] : dtypes) by_dtype += fmt::format("{}{} {}", by_dtype.empty() ? "" : ", ", n, name);
    return fmt::format("{} tensors{}, {} {}", tensors, by_dtype.empty() ? "" : " (" + by_dtype + ")", elements, unit);
  }
};

// The weight files of an HF folder: the index's shards (sorted), else model.safetensors, else every *.safetensors.
// Errors name an index that is not one.
std::vector<std::string> hf_weight_files(const fs::path& dir) {
  std::error_code ec;
  const fs::path index = dir / "model.safetensors.index.json";
  std::set<std::string> names;
  if (fs::exists(index, ec)) {
    const json j = models::read_json_file(index, "--checkpoint: the index");
    HT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "--checkpoint: {} has no \"weight_map\" object, so it is not a safetensors index", index.string());
    for (const auto& [name, file] : j["weight_map"].items()) {
      HT_CHECK(file.is_string(), "--checkpoint: {}: \"weight_map\" maps '{}' to {}, expected a file name",
               index.string(), name, file.dump());
      names.insert(file.get<std::string>());
    }
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    names.insert("model.safetensors");
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") names.insert(e.path().filename().string());
  }
  return {names.begin(), names.end()};
}

// The end of an HF or PEFT folder's report: the line of descent its hadatrain_provenance.json tells (when it has one),
// then its config file (`config_name`, when it is a JSON object) and the provenance file in full.
void print_provenance_and_config(const fs::path& dir, const json& config, const std::string& config_name) {
  std::ifstream prov_in(dir / models::kHfProvenanceFile, std::ios::binary);
  const std::string prov_text = prov_in ? std::string(std::istreambuf_iterator<char>(prov_in), {}) : "";
  if (prov_in) {
    fmt::print("made from (newest first):\n");
    for (const std::string& line : train::hf_provenance_lines(prov_text)) fmt::print("  {}\n", line);
  }
  if (config.is_object()) fmt::print("{}:\n{}", config_name, indented(config.dump(2), "  "));
  if (prov_in) {
    const json p = json::parse(prov_text, nullptr, /*allow_exceptions=*/false);
    if (p.is_discarded())
      fmt::print("{}: not valid JSON\n", models::kHfProvenanceFile);
    else
      fmt::print("{}:\n{}", models::kHfProvenanceFile, indented(p.dump(2), "  "));
  }
}

// An HF model folder: its architecture (config.json), its weights' tensors (the safetensors headers) and what it was
// made from (models::kHfProvenanceFile), then config.json and the provenance record in full. A config.json or
// provenance file that is not JSON is said to be so; a weight file that is no safetensors file is an error naming it.
int inspect_hf_folder(const fs::path& dir) {
  fmt::print("HF folder {}\n", dir.string());
  print_files(dir);

  std::ifstream config_in(dir / "config.json", std::ios::binary);
  const json config = json::parse(config_in, nullptr, /*allow_exceptions=*/false);
  if (config.is_object()) {
    std::string arch = "?";
    if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty()) {
      arch.clear();
      for (const json& a : config["architectures"])
        arch += (arch.empty() ? "" : ", ") + (a.is_string() ? a.get<std::string>() : a.dump());
    }
    std::string details;
    for (const char* key : {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
                            "torch_dtype", "_name_or_path"})
      if (config.contains(key))
        details += fmt::format("{}{} {}", details.empty() ? "" : ", ", key,
                               config[key].is_string() ? config[key].get<std::string>() : config[key].dump());
    fmt::print("architecture: {}{}\n", arch, details.empty() ? "" : " (" + details + ")");
  } else {
    fmt::print("config.json: not a JSON object\n");
  }

  const std::vector<std::string> weight_files = hf_weight_files(dir);
  TensorCount count;
  for (const std::string& name : weight_files) count.add(io::read_safetensors_header(dir / name));
  if (weight_files.empty())
    fmt::print("weights: no safetensors file\n");
  else
    fmt::print("weights: {} in {} file(s)\n", count.describe("parameters"), weight_files.size());

  print_provenance_and_config(dir, config, "config.json");
  return 0;
}

// A PEFT LoRA adapter folder (train/peft_adapter.h): adapter_config.json's LoRA settings, the adapters' shapes and
// dtypes (one line per kind of tensor and shape), the modules_to_save tensors, what it was made from, then the files
// in full. Read as stored: a config that read_peft_folder would refuse is shown, not an error.
int inspect_peft_folder(const fs::path& dir) {
  fmt::print("PEFT LoRA adapter folder {}\n", dir.string());
  print_files(dir);
  std::ifstream config_in(dir / train::kPeftConfigFile, std::ios::binary);
  const json config = json::parse(config_in, nullptr, /*allow_exceptions=*/false);
  const auto value = [&](const char* key) {
    if (!config.contains(key)) return std::string("(missing)");
    return config[key].is_string() ? config[key].get<std::string>() : config[key].dump();
  };
  if (config.is_object()) {
    fmt::print("peft_type {}, task_type {}\n", value("peft_type"), value("task_type"));
    fmt::print("r {}, lora_alpha {}, lora_dropout {}\n", value("r"), value("lora_alpha"), value("lora_dropout"));
    fmt::print("target_modules: {}\n", value("target_modules"));
    fmt::print("modules_to_save: {}\n", value("modules_to_save"));
    fmt::print("base_model_name_or_path: {}\n", value("base_model_name_or_path"));
  } else {
    fmt::print("{}: not a JSON object\n", train::kPeftConfigFile);
  }
  std::error_code ec;
  if (fs::exists(dir / train::kPeftWeightsFile, ec)) {
    const io::SafetensorsHeader h = io::read_safetensors_header(dir / train::kPeftWeightsFile);
    TensorCount count;
    count.add(h);
    // "lora_A.weight (16, 64) f32" -> how many; other tensors (modules_to_save) one line each.
    std::map<std::string, int64_t> kinds;
    std::vector<std::string> others;
    std::set<std::string> layers;
    for (const io::TensorInfo& t : h.tensors) {
      const std::string shape = fmt::format("{} {}", to_string(t.shape), dtype_name(t.dtype));
      bool adapter = false;
      for (const char* suffix : {".lora_A.weight", ".lora_B.weight"})
        if (t.name.ends_with(suffix)) {
          ++kinds[fmt::format("{} {}", suffix + 1, shape)];
          layers.insert(t.name.substr(0, t.name.size() - std::string(suffix).size()));
          adapter = true;
        }
      if (!adapter) others.push_back(fmt::format("{} {}", t.name, shape));
    }
    fmt::print("{}: {}; {} LoRA layer(s)\n", train::kPeftWeightsFile, count.describe("elements"), layers.size());
    for (const auto& [kind, n] : kinds) fmt::print("  {} x {}\n", kind, n);
    if (!others.empty()) {
      fmt::print("  other tensors (modules_to_save):\n");
      for (const std::string& o : others) fmt::print("    {}\n", o);
    }
  } else {
    fmt::print("{}: missing\n", train::kPeftWeightsFile);
  }
  print_provenance_and_config(dir, config, train::kPeftConfigFile);
  return 0;
}

int run_inspect_checkpoint(const InspectCheckpointArgs& a) {
  ht::logging::set_level(a.log_level);
  std::error_code ec;
  if (train::is_peft_folder(a.checkpoint)) return inspect_peft_folder(a.checkpoint);
  if (fs::is_directory(a.checkpoint, ec) && fs::exists(fs::path(a.checkpoint) / "config.json", ec))
    return inspect_hf_folder(a.checkpoint);
  const fs::path dir = checkpoint_folder(a.checkpoint);
  const io::SafetensorsHeader model = io::read_safetensors_header(dir / "model.safetensors");
  std::string step = "?";
  if (const auto it = model.metadata.find("step"); it != model.metadata.end()) step = it->second;
  fmt::print("checkpoint {} (step {})\n", dir.string(), step);

  print_files(dir);

  TensorCount count;
  count.add(model);
  fmt::print("model.safetensors: {}\n", count.describe("elements"));

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
                             "Show what a checkpoint, HF model folder or PEFT adapter folder holds and records (files, tensors, where its "
                             "weights came from, metadata, state.json) without loading it");
  c.app->add_option("--checkpoint", a->checkpoint, "A step_<N> checkpoint folder, a checkpoint root, its latest or "
                                                   "best file, an HF model folder (config.json) or a PEFT adapter folder (adapter_config.json)")
      ->required();
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] { return run_inspect_checkpoint(*a); };
  return c;
}

}  // namespace ht::cli
