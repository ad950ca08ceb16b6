// A LoRA run's adapters as a peft folder (train/peft_adapter.h): the adapters and the modules the run trained beside
// them under peft's keys, adapter_config.json as peft's LoraConfig writes it, and our provenance record; and such a
// folder (ours or peft's) read back onto a model.
#include "hadatrain/train/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/core/name_list.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/train/provenance.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string module_of(const std::string& param) { return param.substr(0, param.rfind('.')); }

}  // namespace

json peft_lora_config(const nn::LoraConfig& lora, const std::vector<std::string>& modules_to_save,
                      const std::string& base_model_name_or_path) {
  // lora_alpha as an integer when it is one (peft's LoraConfig types it int; the scaling is the same either way).
  const json alpha = lora.alpha == std::floor(lora.alpha) && std::fabs(lora.alpha) < 1e15
                         ? json(static_cast<int64_t>(lora.alpha))
                         : json(lora.alpha);
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"r", lora.rank},
          {"lora_alpha", alpha},
          {"lora_dropout", lora.dropout},
          // Our patterns select a layer whose name equals one or ends with "." + it, as peft's list does.
          {"target_modules", lora.target_modules},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"use_rslora", false},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", json::object()},
          {"alpha_pattern", json::object()},
          {"modules_to_save", modules_to_save.empty() ? json(nullptr) : json(modules_to_save)},
          {"base_model_name_or_path", base_model_name_or_path.empty() ? json(nullptr) : json(base_model_name_or_path)},
          {"revision", nullptr},
          {"inference_mode", true}};
}

PeftFromCheckpoint peft_adapter_from_checkpoint(const LlamaSource& src) {
  const std::string model_file = (src.dir / "model.safetensors").string();
  HT_CHECK(src.kind == LlamaSource::Kind::checkpoint,
           "--adapter: {} is an HF folder; a PEFT adapter is written from the checkpoint of a LoRA run", src.dir.string());
  HT_CHECK(src.lora.has_value(),
           "--adapter: the checkpoint {} holds no LoRA adapters ({} records no {}): there is no adapter to write; "
           "convert it without --adapter to write the whole model as an HF folder",
           src.dir.string(), model_file, kLoraKey);
  io::Checkpoint ck = io::load_checkpoint_dir(src.dir);
  dist::consolidate_checkpoint(ck);  // a sharded checkpoint's parameters and optimiser state, whole
  const std::map<std::string, Tensor>& model = ck.model.tensors;

  PeftFromCheckpoint out;
  PeftAdapter& a = out.adapter;
  std::set<std::string> lora_layers;
  for (const auto& [name, t] : model)
    if (nn::is_lora_adapter_name(name)) {
      a.tensors[kPeftKeyPrefix + name] = t;
      lora_layers.insert(module_of(module_of(name)));  // "<layer>.lora_A.weight" -> "<layer>"
    }
  a.lora_layers = static_cast<int64_t>(lora_layers.size());
  HT_CHECK(a.lora_layers > 0, "--adapter: {} records {} but holds no <layer>.lora_A.weight / lora_B.weight tensors",
           model_file, kLoraKey);

  // Note [Trained weights beside the adapters]: what trained, from the optimiser's state "<param>.<slot>".
  std::set<std::string> trained;
  if (ck.optimizer)
    for (const auto& [key, t] : ck.optimizer->tensors)
      if (const auto dot = key.rfind('.'); dot != std::string::npos && model.count(key.substr(0, dot)))
        trained.insert(key.substr(0, dot));
  const int64_t steps = ck.state.is_object() && ck.state.value("optimizer_steps", json()).is_number_integer()
                            ? ck.state["optimizer_steps"].get<int64_t>()
                            : -1;
  if (!ck.optimizer) out.unchecked = fmt::format("{} has no optimizer.safetensors", src.dir.string());
  else if (ck.optimizer->tensors.empty() && steps != 0)
    out.unchecked = fmt::format("the optimiser of {} keeps no state", src.dir.string());
  std::vector<std::string> lost;
  std::set<std::string> to_save;
  for (const std::string& name : trained) {
    if (nn::is_lora_adapter_name(name)) continue;
    const std::string module = module_of(name);
    if (lora_layers.count(module)) lost.push_back(name + " (the base weight of a LoRA layer)");
    else if (module == "model.embed_tokens" && src.config.tie_word_embeddings)
      lost.push_back(name + " (the embedding, tied to lm_head)");
    else to_save.insert(module);
  }
  HT_CHECK(lost.empty(),
           "--adapter: the checkpoint {} trained {} weight(s) beside its LoRA adapters that a PEFT adapter cannot "
           "carry: {}; peft's modules_to_save replaces a whole module by a trained copy, which a LoRA layer and a "
           "tied embedding cannot be, so the adapter folder would lose what they learned. Convert without --adapter "
           "to write the whole model with its adapters merged",
           src.dir.string(), lost.size(), first_names(lost, 3, "'"));
  a.modules_to_save.assign(to_save.begin(), to_save.end());
  for (const std::string& module : a.modules_to_save)
    for (const auto& [name, t] : model)
      if (name.starts_with(module + ".")) a.tensors[kPeftKeyPrefix + name] = t;

  const std::string base = init_from_hf_folder(src.metadata, a.base_model_note);
  a.config = peft_lora_config(*src.lora, a.modules_to_save, base);
  return out;
}

void save_peft_adapter(const fs::path& dir, const PeftAdapter& a, const PeftAdapterOptions& o,
                       const std::string& provenance) {
  HT_CHECK(is_floating(o.dtype), "save_peft_adapter: dtype must be floating (bf16 or f32), got {}",
           dtype_name(o.dtype));
  const std::vector<models::HfTokenizerFile> tokenizer_files =
      o.copy_tokenizer_from.empty() ? std::vector<models::HfTokenizerFile>{}
                                    : models::hf_tokenizer_files(o.copy_tokenizer_from);
  io::create_output_directory(dir, "--output");
  // Note [HF provenance file]: an earlier write's record goes before any of its files are replaced.
  std::error_code ec;
  fs::remove(dir / models::kHfProvenanceFile, ec);
  HT_CHECK(!ec, "save_peft_adapter: cannot remove the earlier {}: {}", (dir / models::kHfProvenanceFile).string(),
           ec.message());
  io::TensorList list;
  {
    NoGradGuard ng;
    for (const auto& [name, t] : a.tensors) list.emplace_back(name, to_dtype(t.detach(), o.dtype));
  }
  io::save_safetensors(dir / kPeftWeightsFile, list, {{"format", "pt"}});
  io::write_file_atomic(dir / kPeftConfigFile, a.config.dump(2) + "\n");
  models::copy_tokenizer_files(dir, tokenizer_files);
  if (!provenance.empty()) io::write_file_atomic(dir / models::kHfProvenanceFile, provenance);
}

bool is_peft_folder(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kPeftConfigFile, ec);
}

void check_model_folder_output(const fs::path& dir, ModelFolder writing, std::string_view what) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  // Note [One model per output folder]
  std::vector<std::string> other;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    const bool hf = n == "config.json" || n == "model.safetensors.index.json" ||
                    (n.starts_with("model") && entry.path().extension() == ".safetensors");
    const bool peft = n == kPeftConfigFile || n == kPeftWeightsFile;
    if (writing == ModelFolder::hf ? peft : hf) other.push_back(n);
  }
  HT_CHECK(!ec, "{}: cannot list {}: {}", what, dir.string(), ec.message());
  std::sort(other.begin(), other.end());
  HT_CHECK(other.empty(), "{}: {} holds {} ({}); the {} written there would sit beside it and the folder would read as "
           "both. Write to another folder, or remove those files first", what, dir.string(),
           writing == ModelFolder::hf ? "a PEFT LoRA adapter" : "an HF model", first_names(other, 4),
           writing == ModelFolder::hf ? "HF model" : "PEFT adapter");
}

PeftFolder read_peft_folder(const fs::path& dir) {
  PeftFolder f;
  f.dir = dir;
  const std::string file = (dir / kPeftConfigFile).string();
  f.config = models::read_json_file(dir / kPeftConfigFile, "the PEFT adapter config");
  const json& c = f.config;
  HT_CHECK(c.is_object(), "{} is not a JSON object", file);
  const auto has = [&](const char* key) { return c.contains(key) && !c[key].is_null(); };
  const std::string type = c.value("peft_type", json()).is_string() ? c["peft_type"].get<std::string>() : "";
  HT_CHECK(type == "LORA", "{}: peft_type is {}, expected \"LORA\" (hadatrain reads LoRA adapters only)", file,
           has("peft_type") ? c["peft_type"].dump() : "missing");
  HT_CHECK(c.contains("r") && c["r"].is_number_integer() && c["r"].get<int64_t>() > 0,
           "{}: r is {}, expected a positive integer (the adapters' rank)", file, c.contains("r") ? c["r"].dump() : "missing");
  HT_CHECK(c.contains("lora_alpha") && c["lora_alpha"].is_number(), "{}: lora_alpha is {}, expected a number", file,
           c.contains("lora_alpha") ? c["lora_alpha"].dump() : "missing");
  f.lora.rank = c["r"].get<int64_t>();
  f.lora.alpha = c["lora_alpha"].get<double>();
  f.lora.dropout = has("lora_dropout") && c["lora_dropout"].is_number() ? c["lora_dropout"].get<double>() : 0.0;
  HT_CHECK(c.contains("target_modules") && c["target_modules"].is_array() && !c["target_modules"].empty(),
           "{}: target_modules is {}, expected a list of module names (a regular expression, peft's other form, is not "
           "read)",
           file, c.contains("target_modules") ? c["target_modules"].dump() : "missing");
  f.lora.target_modules.clear();
  for (const json& t : c["target_modules"]) {
    HT_CHECK(t.is_string(), "{}: target_modules holds {}, expected module names", file, t.dump());
    f.lora.target_modules.push_back(t.get<std::string>());
  }
  // Options that change what peft computes: hadatrain computes x Wᵀ + (lora_alpha / r) · B A x only.
  for (const char* key : {"use_rslora", "use_dora", "fan_in_fan_out"})
    HT_CHECK(!has(key) || c[key] == false, "{}: {} is {}; hadatrain computes plain LoRA (x Wᵀ + lora_alpha / r · B A x) "
             "and cannot load this adapter", file, key, c[key].dump());
  HT_CHECK(!has("bias") || c["bias"] == "none", "{}: bias is {}; hadatrain's LoRA layers train no bias, expected \"none\"",
           file, has("bias") ? c["bias"].dump() : "");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    HT_CHECK(!has(key) || (c[key].is_object() && c[key].empty()),
             "{}: {} is {}; hadatrain gives every LoRA layer the one r and lora_alpha, expected {{}}", file, key,
             c[key].dump());
  HT_CHECK(!has("layers_to_transform"), "{}: layers_to_transform is {}; hadatrain's target_modules select by name in "
           "every layer, expected null", file, has("layers_to_transform") ? c["layers_to_transform"].dump() : "");
  if (has("modules_to_save")) {
    HT_CHECK(c["modules_to_save"].is_array(), "{}: modules_to_save is {}, expected a list of module names or null",
             file, c["modules_to_save"].dump());
    for (const json& m : c["modules_to_save"]) {
      HT_CHECK(m.is_string(), "{}: modules_to_save holds {}, expected module names", file, m.dump());
      f.modules_to_save.push_back(m.get<std::string>());
    }
  }
  if (has("base_model_name_or_path")) {
    HT_CHECK(c["base_model_name_or_path"].is_string(), "{}: base_model_name_or_path is {}, expected a string or null",
             file, c["base_model_name_or_path"].dump());
    f.base_model_name_or_path = c["base_model_name_or_path"].get<std::string>();
  }
  return f;
}

void check_peft_lora(const nn::LoraConfig& lora, const PeftFolder& f, const std::string& what) {
  const std::string file = (f.dir / kPeftConfigFile).string();
  HT_CHECK(lora.rank == f.lora.rank, "{}: model.lora.rank is {} but the adapters in {} have r {}; set model.lora.rank "
           "to {}", what, lora.rank, file, f.lora.rank, f.lora.rank);
  HT_CHECK(lora.alpha == f.lora.alpha, "{}: model.lora.alpha is {:g} but {} has lora_alpha {:g}; set model.lora.alpha "
           "to {:g}", what, lora.alpha, file, f.lora.alpha, f.lora.alpha);
  std::vector<std::string> ours = lora.target_modules, theirs = f.lora.target_modules;
  std::sort(ours.begin(), ours.end());
  std::sort(theirs.begin(), theirs.end());
  ours.erase(std::unique(ours.begin(), ours.end()), ours.end());
  theirs.erase(std::unique(theirs.begin(), theirs.end()), theirs.end());
  HT_CHECK(ours == theirs, "{}: model.lora.target_modules is {} but {} has target_modules {}; set model.lora."
           "target_modules to that list", what, json(lora.target_modules).dump(), file,
           json(f.lora.target_modules).dump());
}

int64_t load_peft_tensors(nn::Module& model, const PeftFolder& f) {
  const std::string file = (f.dir / kPeftWeightsFile).string();
  std::error_code ec;
  HT_CHECK(fs::is_regular_file(f.dir / kPeftWeightsFile, ec), "{} does not exist: the PEFT folder {} holds no adapter "
           "weights (adapter_model.bin, peft's older pickle format, is not read; save with safe_serialization)",
           file, f.dir.string());
  std::map<std::string, Tensor*> params;
  for (auto& [name, t] : model.named_parameters()) params[name] = t;
  const auto in_saved_module = [&](const std::string& name) {
    return std::any_of(f.modules_to_save.begin(), f.modules_to_save.end(), [&](const std::string& m) {
      return name.starts_with(m + ".") || name.find("." + m + ".") != std::string::npos;
    });
  };
  std::map<std::string, Tensor> state;
  const std::string prefix = kPeftKeyPrefix;
  for (auto& [key, t] : io::load_safetensors(f.dir / kPeftWeightsFile).tensors) {
    HT_CHECK(key.starts_with(prefix), "{}: the tensor '{}' does not start with '{}', so it is no PEFT adapter key "
             "(expected base_model.model.<module>.lora_A.weight)", file, key, prefix);
    const std::string name = key.substr(prefix.size());
    const auto it = params.find(name);
    const bool adapter = nn::is_lora_adapter_name(name);
    HT_CHECK(it != params.end() && (adapter || in_saved_module(name)),
             "{}: the tensor '{}' is {} of the model (model.init_from's architecture with model.lora's "
             "target_modules)", file, key,
             adapter ? "no adapter of a LoRA layer"
                     : it == params.end() ? "no parameter" : "neither an adapter nor in modules_to_save, so no weight");
    HT_CHECK(t.shape() == it->second->shape(), "{}: the tensor '{}' has shape {} in the file and {} in the model", file,
             key, to_string(t.shape()), to_string(it->second->shape()));
    state[name] = t;
  }
  std::set<std::string> layers;
  for (const auto& [name, t] : params) {
    if (!nn::is_lora_adapter_name(name)) continue;
    HT_CHECK(state.count(name), "{}: the model's adapter '{}' is missing (expected the tensor '{}{}')", file, name,
             prefix, name);
    layers.insert(module_of(module_of(name)));
  }
  model.load_state_dict(state, nn::StrictLoad::no);
  return static_cast<int64_t>(layers.size());
}

}  // namespace ht::train
