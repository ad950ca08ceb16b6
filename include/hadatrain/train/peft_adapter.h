// A LoRA run's adapters alone, as a folder that peft loads (`peft.PeftModel.from_pretrained(base, dir)`), written by
// `hadatrain convert --adapter` (docs/language_models.md, LoRA adapters for peft):
//   adapter_config.json        peft's LoraConfig: peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha,
//                              lora_dropout, target_modules, modules_to_save, base_model_name_or_path, ...
//   adapter_model.safetensors  "base_model.model.<HF module>.lora_A.weight" (r, in) and ".lora_B.weight" (out, r),
//                              and the whole weights of the modules_to_save under "base_model.model.<module>.<param>"
//   hadatrain_provenance.json  the checkpoint it was written from (train/provenance.h)
// peft computes y = x Wᵀ + (lora_alpha / r) · B A x, as nn::LoraLinear does, so r and lora_alpha are the run's rank and
// alpha unchanged (use_rslora false).
// The same folders (ours, or peft's save_pretrained) are read back by read_peft_folder: `model.init_from`, `eval`,
// `generate`, `convert` (merged into their base) and `inspect-checkpoint` take them (docs/language_models.md, Starting
// from a PEFT adapter).
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/nn/module.h"
#include "hadatrain/tensor/tensor.h"
#include "hadatrain/train/lm_source.h"

namespace ht::train {

inline constexpr const char* kPeftConfigFile = "adapter_config.json";
inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";
// The prefix peft puts before a transformers module's name (its PeftModel wraps a LoraModel that wraps the model).
inline constexpr const char* kPeftKeyPrefix = "base_model.model.";

// What a PEFT folder of the checkpoint `src` holds, before it is written.
struct PeftAdapter {
  nlohmann::json config;                  // adapter_config.json
  std::map<std::string, Tensor> tensors;  // peft's keys, CPU, the checkpoint's dtypes
  int64_t lora_layers = 0;                // the LoRA layers whose A and B are among `tensors`
  std::vector<std::string> modules_to_save;  // whole modules the run trained beside the adapters (HF names)
  // Why base_model_name_or_path is null ("" when it is set): the run did not start from an HF folder.
  std::string base_model_note;
};

// Note [Trained weights beside the adapters]
// A LoRA run freezes everything but its adapters; train.freeze's "!" patterns may train more (the final norm, say).
// Those weights changed, so the adapters alone on the base model would not be the run's model. peft carries such
// weights as modules_to_save: a module named there is replaced by a trained copy whose every parameter is saved
// under "base_model.model.<module>.<param>". That is exact for a module that is not a LoRA layer and shares no weight:
// an RMSNorm, an untied lm_head, an untied embedding. It is not for the base weight of a LoRA layer (peft keeps the
// frozen base beside its adapters there; a trained copy of the whole layer is no LoRA layer) nor for a tied
// embedding (peft's copy of embed_tokens would leave lm_head with the old rows): those are refused, naming the
// weights that would be lost. What trained is read from the checkpoint's optimiser state (a trained parameter has
// state under "<name>.<slot>"); a checkpoint whose optimiser keeps no state (SGD without momentum) cannot tell, and
// peft_adapter_from_checkpoint says so in `unchecked`.

struct PeftAdapterOptions {
  DType dtype = DType::bf16;  // of every tensor written (f32 keeps the adapters bit for bit)
  // A tokenizer folder or file whose files (models::hf_tokenizer_files) are copied into the folder; empty: none.
  std::filesystem::path copy_tokenizer_from;
};

struct PeftFromCheckpoint {
  PeftAdapter adapter;
  // Non-empty when the checkpoint could not tell which weights trained (Note [Trained weights beside the
  // adapters]): why, for a warning.
  std::string unchecked;
};

// The PEFT adapter of one of our LoRA checkpoints (`src`, kind checkpoint). Errors name the checkpoint: one without
// LoRA adapters (model.lora), and trained weights that peft cannot carry (the Note).
PeftFromCheckpoint peft_adapter_from_checkpoint(const LlamaSource& src);

// adapter_config.json for `lora`, its modules_to_save and the base model's name or folder (null when empty).
nlohmann::json peft_lora_config(const nn::LoraConfig& lora, const std::vector<std::string>& modules_to_save,
                                const std::string& base_model_name_or_path);

// Writes kPeftWeightsFile (tensors in o.dtype) and kPeftConfigFile into `dir` (created), each atomically, copies the
// tokenizer's files, then writes `provenance` (when not empty) as models::kHfProvenanceFile; an earlier provenance
// file is removed before anything is written (Note [HF provenance file]).
void save_peft_adapter(const std::filesystem::path& dir, const PeftAdapter& a, const PeftAdapterOptions& o,
                       const std::string& provenance);

// A PEFT LoRA adapter folder as read back: adapter_config.json checked to be a LoRA config hadatrain computes as peft
// does (peft_type LORA, use_rslora / use_dora / fan_in_fan_out false, bias "none", no rank_pattern / alpha_pattern /
// layers_to_transform, target_modules a list of names).
struct PeftFolder {
  std::filesystem::path dir;
  nlohmann::json config;                     // adapter_config.json
  nn::LoraConfig lora;                       // r, lora_alpha, lora_dropout, target_modules
  std::vector<std::string> modules_to_save;  // HF module names
  std::string base_model_name_or_path;       // "" when null
};
// Whether `dir` is a folder holding kPeftConfigFile.
bool is_peft_folder(const std::filesystem::path& dir);

// Note [One model per output folder]
// `hadatrain convert` writes a model into a folder: an HF model (config.json and its weight files) or a PEFT adapter
// (adapter_config.json, adapter_model.safetensors). A folder written again with the same kind is fine: the writer
// replaces its earlier files (save_hf_checkpoint removes weight files its new layout does not use; both remove an
// earlier provenance file first). A folder that holds the other kind is refused before any work: the new model's
// files beside the old one's would make a folder that reads as both (hadatrain, and transformers with peft
// installed, take adapter_config.json first, so an HF model written beside an adapter would load as that adapter on
// its base), and removing the other model's files would delete what may still be wanted.
enum class ModelFolder { hf, peft };
// An error "<what>: DIR holds ..." naming the files of the other kind that `dir` holds (nothing when it does not
// exist). Checks nothing else: io::check_output_path does.
void check_model_folder_output(const std::filesystem::path& dir, ModelFolder writing, std::string_view what);
// Errors name adapter_config.json and the key: not JSON, another peft_type, an option hadatrain does not compute.
PeftFolder read_peft_folder(const std::filesystem::path& dir);
// An error unless `lora` (a config's model.lora, named `what`) has f's rank, alpha and target_modules (as a set); both
// values and the file are named. Dropout is the new run's own choice.
void check_peft_lora(const nn::LoraConfig& lora, const PeftFolder& f, const std::string& what);
// Copies f's adapters and modules_to_save weights (kPeftWeightsFile, kPeftKeyPrefix removed) into `model`, converted
// to each slot's dtype. Errors name the file and the tensor: a key without the prefix, one that is no adapter of a
// LoRA layer of the model nor a parameter of a module in modules_to_save, another shape, and an adapter of the model
// that the file lacks. Returns the number of LoRA layers loaded.
int64_t load_peft_tensors(nn::Module& model, const PeftFolder& f);

}  // namespace ht::train
