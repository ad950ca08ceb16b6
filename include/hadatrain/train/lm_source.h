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
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "hadatrain/data/tokenizer.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"

namespace ht::train {

// Metadata keys of an LM checkpoint's model.safetensors: the model's HF config.json, the tokenizer the run
// used (absolute path, its data::Tokenizer::fingerprint() and its number of ids), and the LoRA config when
// adapters are present.
inline constexpr const char* kLlamaConfigKey = "hadatrain.llama_config";
inline constexpr const char* kTokenizerKey = "hadatrain.tokenizer";
inline constexpr const char* kTokenizerFingerprintKey = "hadatrain.tokenizer_fingerprint";
inline constexpr const char* kTokenizerVocabSizeKey = "hadatrain.tokenizer_vocab_size";
inline constexpr const char* kLoraKey = "hadatrain.lora";
// A run on chat data: the chat template its rows were made with ("llama3" | "llama2"), which `generate --chat` uses.
inline constexpr const char* kChatFormatKey = "hadatrain.chat_format";
// The three tokenizer keys above, into `md`: the path made absolute.
void record_tokenizer(io::Metadata& md, const std::filesystem::path& path, const std::string& fingerprint,
                      int64_t vocab_size);
// Where the weights came from (train/provenance.h, JSON): a checkpoint that `hadatrain convert` made from an HF
// folder records that folder (hf_source_record); a checkpoint of a run started from model.init_from records what it
// started from (init_from_record).
inline constexpr const char* kSourceKey = "hadatrain.source";
inline constexpr const char* kInitFromKey = "hadatrain.init_from";

// A model described by one of our LM checkpoints or an HF folder, for generate, convert and init_from.
struct LlamaSource {
  enum class Kind { hf, checkpoint };
  Kind kind = Kind::hf;
  std::filesystem::path dir;        // the HF folder, or the step_<N> checkpoint folder
  models::LlamaConfig config;
  std::optional<nn::LoraConfig> lora;  // a checkpoint of a LoRA run: its adapters are in the weights
  std::filesystem::path tokenizer;  // the HF folder, or the tokenizer the run recorded ("" when unknown)
  // What the checkpoint records of that tokenizer ("" and 0 for an HF folder and a checkpoint that records none).
  std::string tokenizer_fingerprint;
  int64_t tokenizer_vocab_size = 0;
  io::Metadata metadata;  // a checkpoint's model.safetensors metadata (empty for an HF folder)
  std::string chat_format;  // a checkpoint of a run on chat data: its template (kChatFormatKey); "" otherwise
  // A PEFT LoRA adapter folder (train/peft_adapter.h) whose adapters go onto this base model; `lora` is then its
  // adapter_config's and every other field the base's (base_model_name_or_path resolved). "" otherwise.
  std::filesystem::path peft;
};
// `path`: an HF folder (config.json), a step_<N> checkpoint folder, a checkpoint root (its `latest`), or a PEFT LoRA
// adapter folder (adapter_config.json) whose base_model_name_or_path is a local HF folder or checkpoint of ours
// without LoRA. Errors name the path and say what was expected there.
LlamaSource find_llama_source(const std::filesystem::path& path);
// The model of `src` with its weights, in f32 on `device` (LoRA layers as recorded, unmerged).
std::shared_ptr<models::Llama> load_llama_source(const LlamaSource& src, Device device = Device::cpu());

// The tokenizer `src` names, and how errors name it: an HF folder's tokenizer files (when it holds tokenizer.json or
// tokenizer.model), the one our checkpoint records; for a PEFT folder, its base's. An empty path when it names none.
struct RecordedTokenizer {
  std::filesystem::path path;
  std::string what;  // "the tokenizer of DIR", "the tokenizer DIR/model.safetensors records"
};
RecordedTokenizer recorded_tokenizer(const LlamaSource& src);

// Note [Tokenizer and model vocabularies]
// A tokenizer goes with a model when every id it produces has a row in the model's embedding: a tokenizer with
// more ids than the model's vocab_size is refused (it is another model's tokenizer). One with fewer ids is
// accepted: Hugging Face models often pad the embedding past the tokenizer's vocabulary (to a multiple of 64 or
// 128, for tensor-core shapes and sharding; e.g. 32011 tokens and 32064 rows), and the padded rows belong to no
// token. Generation then draws only ids the tokenizer has (models::SamplingOptions::vocab_limit), so the text it
// streams always decodes. The two sizes are not compared further: a padded model and a model paired with the
// wrong smaller tokenizer look alike, so generate says how many rows it leaves out.

// Where a tokenizer path came from, for errors: `what` is the flag or the record that named it ("--tokenizer",
// "the tokenizer recorded in .../model.safetensors"); `model` names the model it is for (its folder).
struct TokenizerOrigin {
  std::string_view what;
  std::string_view model;
};
// Loads the tokenizer at `path` for a model of `model_vocab` ids. Errors start with origin.what and name the
// path: a path that does not exist, a file or folder that is no tokenizer load_tokenizer reads, and a tokenizer
// with more ids than the model (both sizes and the model's folder named).
std::unique_ptr<data::Tokenizer> load_tokenizer_for(const std::filesystem::path& path, int64_t model_vocab,
                                                    const TokenizerOrigin& origin);

}  // namespace ht::train
