// Where a language model comes from for generation, conversion and fine-tuning: a Hugging Face folder, or a
// checkpoint of one of our language-model runs, whose model.safetensors records the model's config.json, the
// run's tokenizer and its LoRA config in its metadata (written by `hadatrain train`, docs/language_models.md).
//
//   LlamaSource src = find_llama_source("runs/sotu/checkpoints");   // latest checkpoint
//   std::shared_ptr<models::Llama> model = load_llama_source(src, Device::cuda(0));
#pragma once
#include <filesystem>
#include <memory>
#include <optional>

#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"

namespace ht::train {

// Metadata keys of an LM checkpoint's model.safetensors: the model's HF config.json, the tokenizer the run
// used (absolute path), and the LoRA config when adapters are present.
inline constexpr const char* kLlamaConfigKey = "hadatrain.llama_config";
inline constexpr const char* kTokenizerKey = "hadatrain.tokenizer";
inline constexpr const char* kLoraKey = "hadatrain.lora";

// A model described by one of our LM checkpoints or an HF folder, for generate, convert and init_from.
struct LlamaSource {
  enum class Kind { hf, checkpoint };
  Kind kind = Kind::hf;
  std::filesystem::path dir;        // the HF folder, or the step_<N> checkpoint folder
  models::LlamaConfig config;
  std::optional<nn::LoraConfig> lora;  // a checkpoint of a LoRA run: its adapters are in the weights
  std::filesystem::path tokenizer;  // the HF folder, or the tokenizer the run recorded ("" when unknown)
};
// `path`: an HF folder (config.json), a step_<N> checkpoint folder, or a checkpoint root (its `latest`).
// Errors name the path and say what was expected there.
LlamaSource find_llama_source(const std::filesystem::path& path);
// The model of `src` with its weights, in f32 on `device` (LoRA layers as recorded, unmerged).
std::shared_ptr<models::Llama> load_llama_source(const LlamaSource& src, Device device = Device::cpu());

}  // namespace ht::train
