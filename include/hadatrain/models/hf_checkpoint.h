// Hugging Face LLaMA checkpoints (reference/data-formats.md §6) and llama2.c .bin imports (§7).
// A HF folder holds config.json and model.safetensors, or shards model-0000i-of-0000K.safetensors with
// model.safetensors.index.json, plus tokenizer files. Reading checks every tensor against config.json
// (names, shapes) and names the file and tensor when something is wrong; writing produces a folder that
// transformers' LlamaForCausalLM.from_pretrained loads unchanged.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/models/llama.h"

namespace ht::models {

// The tensor names and shapes a Llama of `config` has in HF's layout, sorted by name (lm_head.weight only
// when untied).
std::map<std::string, Shape> hf_llama_shapes(const LlamaConfig& config);

// config.json of an HF folder (errors name the file and the key).
LlamaConfig read_hf_config(const std::filesystem::path& dir);

// What an HF folder's weights are made of, from config.json, the index and the safetensors headers alone.
struct HfLayout {
  LlamaConfig config;
  // The files read, relative to the folder: config.json, then model.safetensors or the index and its shards (sorted).
  std::vector<std::string> files;
  // Each tensor of the Llama (HF names; rotary_emb.inv_freq left out): the file that holds it and its dtype there.
  struct Stored {
    std::string file;
    DType dtype = DType::f32;
  };
  std::map<std::string, Stored> stored;
};
// Reads config.json and the safetensors headers (no tensor data) and checks them against each other: missing and
// unexpected tensors are listed, a shape that disagrees with config.json names the tensor, its file and both
// shapes, truncated shards and index entries naming missing files name the file.
HfLayout read_hf_layout(const std::filesystem::path& dir);

struct HfWeights : HfLayout {
  std::map<std::string, Tensor> tensors;  // HF names, CPU, the file's dtype
};
// read_hf_layout, then the tensors.
HfWeights read_hf_weights(const std::filesystem::path& dir);
// The tensors of `dir`, whose layout `layout` was read by read_hf_layout.
HfWeights read_hf_weights(const std::filesystem::path& dir, HfLayout layout);
// A JSON file of an HF folder; errors name `what`, the file, and the parser's message.
nlohmann::json read_json_file(const std::filesystem::path& path, const char* what);

// A Llama built from an HF folder: weights converted to build.master_dtype on `device`. build.init is
// ignored (every weight is loaded). LoRA-wrapped layers (build.make_linear) keep their fresh adapters.
std::shared_ptr<Llama> load_hf_llama(const std::filesystem::path& dir, LlamaBuild build,
                                             Device device = Device::cpu());
// Copies `weights` (HF names) into an existing model; missing or unexpected tensors and shape mismatches
// are errors naming `source`. Parameters that are not part of the HF layout (LoRA adapters) are left alone.
void load_hf_tensors(Llama& model, const std::map<std::string, Tensor>& weights, const std::string& source);

// The model's tensors under HF's names (shared storage, detached). An error when a LoRA layer is not
// merged (nn::merge_lora first): its base weight alone is not what the model computes.
std::map<std::string, Tensor> hf_state_dict(Llama& model);

struct HfWriteOptions {
  DType dtype = DType::bf16;  // bf16 or f32 (f64 and f16 are accepted too)
  // Shard the weights into model-0000i-of-0000K.safetensors plus the index once they exceed this many bytes.
  uint64_t max_shard_bytes = 5ull << 30;
  // A tokenizer folder or file whose files (hf_tokenizer_files) are copied into the folder; empty: none.
  std::filesystem::path copy_tokenizer_from;
  // The text of kHfProvenanceFile (what the weights were made from, JSON), asked for once the weights, config.json
  // and the tokenizer files are written, so that a caller may compute it beside the write; unset: the folder gets
  // none.
  std::function<std::string()> provenance;
};

// The file of an HF folder written by `hadatrain convert` that says what its weights were made from (Note [HF
// provenance file] in hf_checkpoint.cpp). transformers reads only the files it knows and leaves it alone.
inline constexpr const char* kHfProvenanceFile = "hadatrain_provenance.json";

// A file of a tokenizer and the name it has in an HF folder.
struct HfTokenizerFile {
  std::filesystem::path source;
  std::string name;  // "tokenizer.model", "tokenizer.json", "tokenizer_config.json", ...
};
// The files that stand for the tokenizer at `path` in an HF folder, told apart as data::load_tokenizer does:
//   a folder: those of tokenizer.json, tokenizer.model, tokenizer_config.json, special_tokens_map.json and
//     generation_config.json it holds (it must hold tokenizer.json or tokenizer.model);
//   a .json file: the file as tokenizer.json, and the tokenizer_config.json beside it when there is one (the
//     loader reads its BOS and EOS tokens from there);
//   any other file: a SentencePiece model, as tokenizer.model.
// Throws ht::Error naming the path when it does not exist or is a folder without a tokenizer. The contents are
// not read: data::load_tokenizer checks those.
std::vector<HfTokenizerFile> hf_tokenizer_files(const std::filesystem::path& path);
// Copies `files` into the folder `dir` under their names (a file that is already there, the same file, is left).
void copy_tokenizer_files(const std::filesystem::path& dir, const std::vector<HfTokenizerFile>& files);

// Writes config.json (torch_dtype and dtype set to the written dtype) and the weights, every file atomically,
// removes weight files of an earlier write to `dir` that the new layout does not use, copies the tokenizer files
// along and writes o.provenance's text last (an earlier provenance file is removed first). `tensors` (any device and
// dtype) must be exactly hf_llama_shapes(config). Bad tensors and a copy_tokenizer_from that hf_tokenizer_files
// refuses are errors before anything is written.
void save_hf_checkpoint(const std::filesystem::path& dir, const LlamaConfig& config,
                        const std::map<std::string, Tensor>& tensors, const HfWriteOptions& o = {});
void save_hf_checkpoint(const std::filesystem::path& dir, Llama& model, const HfWriteOptions& o = {});

// --- llama2.c (.bin) ---

// Reorders the rows of a q_proj / k_proj weight ((heads * head_dim, in)) from the interleaved RoPE pairing of
// Meta and llama2.c to HF's rotate-half pairing: HF row h*hd + c*(hd/2) + j = Meta row h*hd + 2j + c. Pass
// num_key_value_heads for k_proj. rotate_half_to_interleaved is its inverse.
Tensor interleaved_to_rotate_half(const Tensor& w, int64_t heads);
Tensor rotate_half_to_interleaved(const Tensor& w, int64_t heads);

struct Llama2cModel {
  LlamaConfig config;             // θ 10000, eps 1e-5, max_position_embeddings = seq_len
  std::map<std::string, Tensor> tensors;  // HF names and rotate-half layout, f32 on the CPU
  int version = 0;                        // 0 (legacy header) or 1 (ak42)
};
// Reads a llama2.c checkpoint, v0 (7-int header; negative vocab_size: separate classifier) or v1 (magic
// "ak42", 256-byte header). The file size must equal what the header implies (an error gives both).
Llama2cModel read_llama2c(const std::filesystem::path& path);

}  // namespace ht::models
