// Hugging Face LLaMA folders (models/hf_checkpoint.h): config.json plus model.safetensors or an index and shards.
// Reading checks the safetensors headers against config.json before any tensor data is read, so a wrong
// checkpoint fails fast, naming the file and the tensor; writing lays tensors out in model order (embedding,
// layers, norm, head), one file or shards of at most max_shard_bytes each.
#include "hadatrain/models/hf_checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/name_list.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/ops/copy.h"

namespace ht::models {
namespace fs = std::filesystem;
using io::load_safetensors, io::read_safetensors_header, io::save_safetensors, io::write_file_atomic;
using io::Metadata, io::SafetensorsContents, io::SafetensorsHeader, io::TensorInfo, io::TensorList;
using nlohmann::json;

namespace {

constexpr const char* kConfig = "config.json";
constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";

bool ignored_tensor(const std::string& name) {
  const std::string suffix = "rotary_emb.inv_freq";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF names in model order (embedding, layer 0 ... L-1, final norm, head).
std::vector<std::string> ordered_names(const LlamaConfig& c) {
  std::vector<std::string> out{"model.embed_tokens.weight"};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* s : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      out.push_back(p + s);
  }
  out.push_back("model.norm.weight");
  if (!c.tie_word_embeddings) out.push_back("lm_head.weight");
  return out;
}

}  // namespace

json read_json_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "{} '{}' cannot be opened", what, path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    HT_FAIL("{} '{}': invalid JSON: {}", what, path.string(), e.what());
  }
}

namespace {

std::string list(const std::vector<std::string>& names) { return first_names(names, 12); }

// Note [HF provenance file]
// What `hadatrain convert` made an HF folder from goes into a file of its own, kHfProvenanceFile, beside
// config.json, not into config.json or the safetensors metadata. transformers' from_pretrained reads the files it
// knows (config.json, the weights and their index, the tokenizer's and generation_config.json) and leaves other files
// alone, so the folder loads unchanged. In config.json the record would become an attribute of the loaded config
// that save_pretrained writes again, so a model fine-tuned elsewhere would still claim to be our checkpoint's
// weights; in the safetensors metadata it would be one copy per shard, which tools that rewrite shards drop. The
// file is also what the hub shows and sha256sum can check like any other file.
// The file describes the weights beside it: save_hf_checkpoint removes an earlier one before it writes any weight
// and writes the new one last, so a write that fails midway leaves a folder with no record rather than one whose
// record describes other weights.

}  // namespace

std::map<std::string, Shape> hf_llama_shapes(const LlamaConfig& c) {
  const int64_t H = c.hidden_size, hd = c.resolved_head_dim(), I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  std::map<std::string, Shape> out{{"model.embed_tokens.weight", {c.vocab_size, H}}, {"model.norm.weight", {H}}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out[p + "input_layernorm.weight"] = {H};
    out[p + "post_attention_layernorm.weight"] = {H};
    out[p + "self_attn.q_proj.weight"] = {q, H};
    out[p + "self_attn.k_proj.weight"] = {kv, H};
    out[p + "self_attn.v_proj.weight"] = {kv, H};
    out[p + "self_attn.o_proj.weight"] = {H, q};
    out[p + "mlp.gate_proj.weight"] = {I, H};
    out[p + "mlp.up_proj.weight"] = {I, H};
    out[p + "mlp.down_proj.weight"] = {H, I};
  }
  if (!c.tie_word_embeddings) out["lm_head.weight"] = {c.vocab_size, H};
  return out;
}

LlamaConfig read_hf_config(const fs::path& dir) {
  const fs::path path = dir / kConfig;
  HT_CHECK(fs::is_regular_file(path), "'{}' is not a Hugging Face checkpoint folder: it has no {}", dir.string(),
           kConfig);
  return LlamaConfig::from_json(read_json_file(path, "config"), path.string());
}

HfLayout read_hf_layout(const fs::path& dir) {
  HfLayout out;
  out.config = read_hf_config(dir);
  const std::string config_path = (dir / kConfig).string();

  // Which file holds each tensor, from the index or the single file.
  std::map<std::string, std::vector<std::string>> names_by_file;
  const fs::path index = dir / kIndex;
  if (fs::is_regular_file(index)) {
    const json root = read_json_file(index, "safetensors index");
    HT_CHECK(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(),
             "safetensors index '{}': expected an object with a \"weight_map\" object", index.string());
    for (const auto& [name, file] : root["weight_map"].items()) {
      HT_CHECK(file.is_string(), "safetensors index '{}': tensor '{}' maps to {}, expected a file name",
               index.string(), name, file.dump());
      const fs::path rel(file.get<std::string>());
      HT_CHECK(rel.is_relative() && rel.has_filename() && std::find(rel.begin(), rel.end(), "..") == rel.end(),
               "safetensors index '{}': tensor '{}' maps to '{}', which is not a file in the index's folder",
               index.string(), name, rel.string());
      names_by_file[file.get<std::string>()].push_back(name);
    }
    for (const auto& [file, names] : names_by_file)
      HT_CHECK(fs::is_regular_file(dir / file), "safetensors index '{}' names shard '{}' (for '{}' and {} more), "
               "which does not exist in '{}'", index.string(), file, names.front(), names.size() - 1, dir.string());
  } else {
    HT_CHECK(fs::is_regular_file(dir / kSingle), "'{}' holds neither {} nor {}", dir.string(), kSingle, kIndex);
    names_by_file[kSingle] = {};
  }

  // Headers first: every tensor's file, dtype and shape, checked against config.json.
  const std::map<std::string, Shape> expected = hf_llama_shapes(out.config);
  std::map<std::string, HfLayout::Stored> file_of;
  for (auto& [file, names] : names_by_file) {
    const fs::path path = dir / file;
    const SafetensorsHeader header = read_safetensors_header(path);  // truncation and bad headers name the file
    std::set<std::string> in_file;
    for (const TensorInfo& t : header.tensors) {
      in_file.insert(t.name);
      if (!names.empty() && std::find(names.begin(), names.end(), t.name) == names.end()) continue;
      HT_CHECK(!file_of.count(t.name), "tensor '{}' is in both '{}' and '{}'", t.name,
               (dir / file_of.at(t.name).file).string(), path.string());
      file_of[t.name] = {file, t.dtype};
      HT_CHECK(is_floating(t.dtype), "'{}': tensor '{}' has dtype {}; LLaMA weights are floating", path.string(),
               t.name, dtype_name(t.dtype));
      auto e = expected.find(t.name);
      if (e != expected.end())
        HT_CHECK(t.shape == e->second, "'{}': tensor '{}' has shape {}, but {} implies {}", path.string(), t.name,
                 to_string(t.shape), config_path, to_string(e->second));
    }
    for (const std::string& n : names)
      HT_CHECK(in_file.count(n), "safetensors index '{}' maps tensor '{}' to '{}', which does not hold it",
               index.string(), n, path.string());
  }
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, shape] : expected)
    if (!file_of.count(name)) missing.push_back(name);
  for (const auto& [name, file] : file_of)
    if (!expected.count(name) && !ignored_tensor(name)) unexpected.push_back(name);
  HT_CHECK(missing.empty() && unexpected.empty(),
           "'{}' does not match its {} (a LLaMA with {} layers, {}): missing tensors [{}]; unexpected tensors [{}]",
           dir.string(), kConfig, out.config.num_hidden_layers,
           out.config.tie_word_embeddings ? "tied embeddings" : "an lm_head", list(missing), list(unexpected));

  out.files.push_back(kConfig);
  if (fs::is_regular_file(index)) out.files.push_back(kIndex);
  for (const auto& [file, names] : names_by_file) out.files.push_back(file);
  for (auto& [name, stored] : file_of)
    if (expected.count(name)) out.stored.emplace(name, std::move(stored));
  return out;
}

HfWeights read_hf_weights(const fs::path& dir) { return read_hf_weights(dir, read_hf_layout(dir)); }

HfWeights read_hf_weights(const fs::path& dir, HfLayout layout) {
  HfWeights out;
  static_cast<HfLayout&>(out) = std::move(layout);
  for (const std::string& file : out.files) {
    if (file == kConfig || file == kIndex) continue;
    SafetensorsContents part = load_safetensors(dir / file);
    for (auto& [name, t] : part.tensors)
      if (const auto it = out.stored.find(name); it != out.stored.end() && it->second.file == file)
        out.tensors.emplace(name, std::move(t));
  }
  return out;
}

void load_hf_tensors(Llama& model, const std::map<std::string, Tensor>& weights, const std::string& source) {
  const std::map<std::string, Shape> expected = hf_llama_shapes(model.config);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, shape] : expected)
    if (!weights.count(name)) missing.push_back(name);
  for (const auto& [name, t] : weights)
    if (!expected.count(name) && !ignored_tensor(name)) unexpected.push_back(name);
  HT_CHECK(missing.empty() && unexpected.empty(), "{}: missing tensors [{}]; unexpected tensors [{}]", source,
           list(missing), list(unexpected));
  NoGradGuard ng;
  for (auto& [name, slot] : model.named_parameters()) {
    auto it = weights.find(name);
    if (it == weights.end()) continue;  // adapters (LoRA) are not part of the HF layout
    HT_CHECK(it->second.shape() == slot->shape(), "{}: tensor '{}' has shape {}, the model {}", source, name,
             to_string(it->second.shape()), to_string(slot->shape()));
    copy_(slot->detach(), it->second);
  }
}

std::shared_ptr<Llama> load_hf_llama(const fs::path& dir, LlamaBuild build, Device device) {
  HfWeights w = read_hf_weights(dir);
  build.init = LlamaInit::none;
  auto model = std::make_shared<Llama>(w.config, build);
  if (device != Device::cpu()) model->to(device);
  load_hf_tensors(*model, w.tensors, dir.string());
  return model;
}

std::map<std::string, Tensor> hf_state_dict(Llama& model) {
  for (auto& [name, layer] : nn::lora_layers(model))
    HT_CHECK(layer->merged(), "hf_state_dict: LoRA layer '{}' is not merged; merge the adapters first "
             "(nn::merge_lora) to write a plain Hugging Face checkpoint", name);
  const std::map<std::string, Shape> expected = hf_llama_shapes(model.config);
  std::map<std::string, Tensor> out;
  for (auto& [name, slot] : model.named_parameters())
    if (expected.count(name)) out[name] = slot->detach();
  return out;
}

void save_hf_checkpoint(const fs::path& dir, const LlamaConfig& config,
                        const std::map<std::string, Tensor>& tensors, const HfWriteOptions& o) {
  config.validate();
  HT_CHECK(is_floating(o.dtype), "save_hf_checkpoint: dtype must be floating (bf16 or f32), got {}",
           dtype_name(o.dtype));
  HT_CHECK(o.max_shard_bytes > 0, "save_hf_checkpoint: max_shard_bytes must be positive");
  const std::map<std::string, Shape> expected = hf_llama_shapes(config);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, shape] : expected) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      missing.push_back(name);
      continue;
    }
    HT_CHECK(it->second.shape() == shape, "save_hf_checkpoint: tensor '{}' has shape {}, the config implies {}", name,
             to_string(it->second.shape()), to_string(shape));
  }
  for (const auto& [name, t] : tensors)
    if (!expected.count(name)) unexpected.push_back(name);
  HT_CHECK(missing.empty() && unexpected.empty(), "save_hf_checkpoint '{}': missing tensors [{}]; unexpected "
           "tensors [{}]", dir.string(), list(missing), list(unexpected));
  const std::vector<HfTokenizerFile> tokenizer_files =
      o.copy_tokenizer_from.empty() ? std::vector<HfTokenizerFile>{} : hf_tokenizer_files(o.copy_tokenizer_from);
  io::create_output_directory(dir, "save_hf_checkpoint");
  // Note [HF provenance file]: an earlier write's record goes before any of its weights are replaced.
  std::error_code ec;
  fs::remove(dir / kHfProvenanceFile, ec);
  HT_CHECK(!ec, "save_hf_checkpoint: cannot remove the earlier {}: {}", (dir / kHfProvenanceFile).string(),
           ec.message());

  // Shards in model order, each closed before it would pass max_shard_bytes (a larger tensor gets its own).
  std::vector<TensorList> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const std::string& name : ordered_names(config)) {
    const Tensor& t = tensors.at(name);
    const uint64_t bytes = storage_bytes(o.dtype, t.numel());
    if (!shards.back().empty() && shard_bytes + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += bytes;
    total += bytes;
  }
  const Metadata meta{{"format", "pt"}};
  auto host = [&](const TensorList& list) {
    TensorList out;
    NoGradGuard ng;
    for (const auto& [name, t] : list) out.emplace_back(name, to_dtype(to_device(t.detach(), Device::cpu()), o.dtype));
    return out;
  };
  std::set<std::string> written;
  if (shards.size() == 1) {
    save_safetensors(dir / kSingle, host(shards[0]), meta);
    written.insert(kSingle);
  } else {
    json weight_map = json::object();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      save_safetensors(dir / file, host(shards[i]), meta);
      for (const auto& [name, t] : shards[i]) weight_map[name] = file;
      written.insert(file);
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic(dir / kIndex, index.dump(2) + "\n");
    written.insert(kIndex);
  }
  // Weights of an earlier write to this folder would contradict the new ones: remove them.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string n = entry.path().filename().string();
    const bool weights = n == kIndex || (n.rfind("model", 0) == 0 && entry.path().extension() == ".safetensors");
    if (weights && !written.count(n)) fs::remove(entry.path());
  }

  LlamaConfig written_config = config;
  written_config.dtype = o.dtype;
  write_file_atomic(dir / kConfig, written_config.to_json().dump(2) + "\n");
  copy_tokenizer_files(dir, tokenizer_files);
  if (o.provenance) write_file_atomic(dir / kHfProvenanceFile, o.provenance());
}

void copy_tokenizer_files(const fs::path& dir, const std::vector<HfTokenizerFile>& files) {
  std::error_code ec;
  for (const HfTokenizerFile& f : files) {
    const fs::path target = dir / f.name;
    if (fs::exists(target, ec) && fs::equivalent(f.source, target, ec)) continue;  // the folder's own file
    fs::copy_file(f.source, target, fs::copy_options::overwrite_existing, ec);
    HT_CHECK(!ec, "cannot copy the tokenizer file {} to {}: {}", f.source.string(), target.string(), ec.message());
  }
}

std::vector<HfTokenizerFile> hf_tokenizer_files(const fs::path& path) {
  std::error_code ec;
  HT_CHECK(fs::exists(path, ec), "tokenizer {} does not exist (expected a tokenizer.json, a SentencePiece model or "
           "a folder holding one)", path.string());
  std::vector<HfTokenizerFile> out;
  if (!fs::is_directory(path, ec)) {
    if (path.extension() == ".json") {
      out.push_back({path, "tokenizer.json"});
      const fs::path config = path.parent_path() / "tokenizer_config.json";
      if (fs::is_regular_file(config, ec)) out.push_back({config, "tokenizer_config.json"});
    } else {
      out.push_back({path, "tokenizer.model"});
    }
    return out;
  }
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json"})
    if (fs::is_regular_file(path / f, ec)) out.push_back({path / f, f});
  HT_CHECK(!out.empty() && (out[0].name == "tokenizer.json" || out[0].name == "tokenizer.model"),
           "the folder {} holds neither tokenizer.json nor tokenizer.model", path.string());
  return out;
}

void save_hf_checkpoint(const fs::path& dir, Llama& model, const HfWriteOptions& o) {
  save_hf_checkpoint(dir, model.config, hf_state_dict(model), o);
}

}  // namespace ht::models
