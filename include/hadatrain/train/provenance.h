// Where a model's weights came from (docs/language_models.md, Provenance). hadatrain records it beside
// every set of weights it makes from others, and each record nests the record of what it was made from, so a line
// of descent (HF folder -> converted checkpoint -> fine-tuned -> fine-tuned again -> HF folder) stays traceable:
//   a checkpoint `hadatrain convert` made from an HF folder   kSourceKey: hf_source_record (+ the tokenizer's record)
//   a checkpoint of a run started from model.init_from        kInitFromKey: init_from_record (LLaMA, ResNet, ViT, MLP)
//   an HF folder `hadatrain convert` wrote                    models::kHfProvenanceFile: hf_provenance_record
// Files are identified by size and SHA-256, the digest the Hugging Face hub lists for each LFS file.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/core/digest.h"
#include "hadatrain/data/tokenizer.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/train/init_from.h"
#include "hadatrain/train/lm_source.h"

namespace ht::train {

// Each file's size and SHA-256, several files at once (up to one thread per core, the largest first: an 8B model's
// shards are ~5 GB each). Errors name the file that cannot be read.
std::vector<FileSha256> sha256_files(const std::vector<std::filesystem::path>& files);

// A tokenizer as a record names it: {"path": absolute, "fingerprint", "vocab_size", "files": [{"path", "bytes",
// "sha256"}]}, its files those models::hf_tokenizer_files names (the model file, tokenizer_config.json, ...).
nlohmann::json tokenizer_record(const std::filesystem::path& path, const data::Tokenizer& tok);

// What a checkpoint converted from the HF folder `dir` records of it (kSourceKey), from its layout (read_hf_layout
// or read_hf_weights):
//   {"format": "hf", "folder": absolute path, "converted_by": "hadatrain <version>",
//    "config": config.json's architectures, model_type, torch_dtype, dtype, transformers_version and _name_or_path
//              (those it gives),
//    "dtypes": the weights' dtypes as stored ("bf16", ...),
//    "files": [{"name": "config.json", "bytes": N, "sha256": "64 hex digits"}, ...] for every file read,
//    "provenance": the folder's models::kHfProvenanceFile, when it has one (then among "files" too)}.
// The SHA-256 can be compared with the hub's listing and with sha256sum. Errors name the file that cannot be read,
// and a provenance file that is not a JSON object.
nlohmann::json hf_source_record(const std::filesystem::path& dir, const models::HfLayout& layout);

// The checkpoint `hadatrain convert` makes of the HF folder `dir`: its weights in f32 as step 0, the model's
// config.json, and where it came from (kSourceKey: hf_source_record, with "tokenizer": tokenizer_record when a
// tokenizer is given). `tokenizer` (null: none) is the tokenizer loaded from `tokenizer_path`, already checked
// against the model; the checkpoint records its path, fingerprint and number of ids as a run's checkpoint does.
io::CheckpointData checkpoint_from_hf(const std::filesystem::path& dir, const std::filesystem::path& tokenizer_path,
                                      const data::Tokenizer* tokenizer);

// What a run started from model.init_from (`src`, resolved once: resolve_init_from) records in each of its
// checkpoints (kInitFromKey; Note [Provenance of a fine-tuned run] in provenance.cpp), for every model:
//   {"model.init_from": the config's value, "kind", and by kind:
//    "peft" (a PEFT LoRA adapter folder on its base): "folder", "config" (adapter_config.json's peft_type, task_type,
//                 r, lora_alpha, lora_dropout, target_modules, modules_to_save, base_model_name_or_path, those it
//                 gives), "files" (its two files, each with "name", "bytes", "sha256"), "provenance" (its own
//                 models::kHfProvenanceFile, when it has one) and "base" (this record of its base, nested);
//    "checkpoint" (one of our checkpoints): "folder" (its step_<N> folder, absolute), "step", and its own records,
//                 nested: "source" (its kSourceKey) and "init_from" (its kInitFromKey);
//    "hf" (an HF LLaMA folder): "folder", "source": hf_source_record of it (every weight file read once more);
//    "file" (a .safetensors file, e.g. timm's or torchvision's weights): "file" (absolute), "bytes", "sha256";
//    "folder" (a folder holding model.safetensors or an index and its shards, not a checkpoint of ours): "folder",
//                 "files": [{"name", "bytes", "sha256"}] (the index, then its shards, sorted)}.
// A folder is one of our checkpoints when it holds state.json beside model.safetensors. Errors name the checkpoint
// whose record is not JSON, and an index that is not one.
nlohmann::json init_from_record(const InitFromSource& src);
// Whether init_from_record(src) reads every weight file of `src` for its SHA-256 (all kinds but "checkpoint", which
// reads its header only).
bool init_from_record_digests(const InitFromSource& src);

// What an HF folder `hadatrain convert` writes from `src` records (models::kHfProvenanceFile), from our checkpoint:
//   {"format": "hadatrain", "checkpoint": the step_<N> folder (absolute), "step", "written_by": "hadatrain <version>",
//    "dtype": the weights' written dtype, "lora_merged": the LoRA layers merged into them (when any),
//    "source" / "init_from": the checkpoint's own records, nested (when it has them)};
// from a PEFT adapter folder (src.peft) merged into its base: {"format": "peft", "written_by", "dtype", "lora_merged",
// and the folder's record as init_from_record's kind "peft" has it: "folder", "config", "files", "provenance",
// "base"}.
// The caller adds "tokenizer" (tokenizer_record) when it carries one.
nlohmann::json hf_provenance_record(const LlamaSource& src, DType dtype, int64_t lora_merged);
// The same for an HF folder written from the llama2.c file `file` (`digest`: its sha256_file): {"format": "llama2c",
// "file": absolute, "version", "bytes", "sha256", "written_by"}.
nlohmann::json llama2c_provenance_record(const std::filesystem::path& file, int version, const FileSha256& digest);

// The line of descent that a checkpoint's records (its model.safetensors metadata) tell, newest first, one line
// per step: "trained from the checkpoint DIR (step N)", "converted from the HF folder DIR (...)", "which hadatrain
// convert wrote from the checkpoint DIR (step N)", ... Empty when the checkpoint records none. A record that is not
// what hadatrain writes is said to be so in its line, never an error: inspecting a damaged checkpoint must work.
std::vector<std::string> provenance_lines(const io::Metadata& md);
// The same for an HF folder from the text of its models::kHfProvenanceFile: "written by hadatrain convert from the
// checkpoint DIR (step N)" (or "... from the llama2.c file FILE", "... from the PEFT LoRA adapter DIR"), then what that checkpoint was made from. A text
// that is not what hadatrain writes is said to be so in its line.
std::vector<std::string> hf_provenance_lines(const std::string& text);

// The HF folder a checkpoint's base weights are, from its init_from record (kInitFromKey): the folder of a run started
// from an HF folder, or from one of our checkpoints that is a conversion of one (a source record, trained no further),
// or the base of a PEFT folder the run started from when that base is one of those. Otherwise "", and why in `note`.
std::string init_from_hf_folder(const io::Metadata& md, std::string& note);

}  // namespace ht::train
