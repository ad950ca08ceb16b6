// Where a language model's weights came from (train/provenance.h): the records `hadatrain convert` and runs started
// from model.init_from write, and the line of descent inspect-checkpoint reads from them.
#include "hadatrain/train/provenance.h"
#include "hadatrain/train/peft_adapter.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <future>
#include <initializer_list>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/io/json_metadata.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string absolute_folder(const fs::path& dir) {
  fs::path folder = fs::absolute(dir).lexically_normal();
  if (!folder.has_filename()) folder = folder.parent_path();  // "hf/" -> "hf"
  return folder.string();
}

std::string written_by() { return fmt::format("hadatrain {}", HADATRAIN_VERSION); }

// The keys of `config` among `keys`, those it gives.
json essentials(const json& config, std::initializer_list<const char*> keys) {
  json out = json::object();
  for (const char* key : keys)
    if (config.is_object() && config.contains(key)) out[key] = config[key];
  return out;
}

// config.json's keys that say what the model is and where it came from, those the file gives.
json config_essentials(const fs::path& config_path) {
  return essentials(models::read_json_file(config_path, "config"),
                    {"architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path"});
}

// The record the checkpoint `dir` (its model.safetensors metadata `md`) keeps under `key` (kSourceKey, kInitFromKey),
// parsed; errors name the file and the key.
json checkpoint_record(const fs::path& dir, const io::Metadata& md, const char* key) {
  const fs::path file = dir / "model.safetensors";
  json r = io::read_json_metadata(md, key, file, [](json j) { return j; });
  HT_CHECK(r.is_object(), "{}: the metadata \"{}\" is {}, not what hadatrain writes (a JSON object)", file.string(),
           key, r.dump());
  return r;
}

// A checkpoint's own records, nested into the record of what was made from it.
void nest_checkpoint_records(const fs::path& dir, const io::Metadata& md, json& r) {
  if (md.count(kSourceKey)) r["source"] = checkpoint_record(dir, md, kSourceKey);
  if (md.count(kInitFromKey)) r["init_from"] = checkpoint_record(dir, md, kInitFromKey);
}

// The weight files of a folder read_pretrained reads (relative names): the index and its shards (sorted), or
// model.safetensors. Errors name an index that is not one.
std::vector<std::string> pretrained_folder_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) return {"model.safetensors"};
  const json j = models::read_json_file(index, "the index");
  HT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
           "{}: no \"weight_map\" object, so not a safetensors index", index.string());
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    HT_CHECK(file.is_string(), "{}: \"weight_map\" maps '{}' to {}, expected a file name", index.string(), name,
             file.dump());
    shards.insert(file.get<std::string>());
  }
  std::vector<std::string> out = {"model.safetensors.index.json"};
  out.insert(out.end(), shards.begin(), shards.end());
  return out;
}

// One of our checkpoints, as read_pretrained finds it: a folder with state.json beside model.safetensors.
bool is_our_checkpoint(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path / "model.safetensors", ec) && fs::is_regular_file(path / "state.json", ec);
}

// The PEFT adapter folder `src.peft` on its base (find_llama_source): "folder", "config" (adapter_config.json's
// essentials), "files" (its two files by SHA-256), "provenance" (its own record, when it has one) and "base" (the
// base's init_from_record, nested).
json peft_folder_record(const LlamaSource& src) {
  const fs::path& dir = src.peft;
  const std::vector<std::string> names = {kPeftConfigFile, kPeftWeightsFile};
  const std::vector<FileSha256> digests = sha256_files({dir / names[0], dir / names[1]});
  json files = json::array();
  for (std::size_t i = 0; i < names.size(); ++i)
    files.push_back({{"name", names[i]}, {"bytes", digests[i].bytes}, {"sha256", digests[i].sha256}});
  json r;
  r["folder"] = absolute_folder(dir);
  r["config"] = essentials(models::read_json_file(dir / kPeftConfigFile, "the PEFT adapter config"),
                           {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "target_modules",
                            "modules_to_save", "base_model_name_or_path"});
  r["files"] = files;
  std::error_code ec;
  if (fs::exists(dir / models::kHfProvenanceFile, ec)) {
    json p = models::read_json_file(dir / models::kHfProvenanceFile, "the provenance record");
    HT_CHECK(p.is_object(), "{} is not a JSON object; remove or restore it", (dir / models::kHfProvenanceFile).string());
    r["provenance"] = std::move(p);
  }
  InitFromSource base;
  base.value = src.dir.string();
  base.path = src.dir;
  base.llama = src;
  base.llama->peft.clear();
  base.llama->lora.reset();
  r["base"] = init_from_record(base);
  return r;
}

}  // namespace

std::vector<FileSha256> sha256_files(const std::vector<fs::path>& files) {
  std::vector<FileSha256> out(files.size());
  std::vector<std::exception_ptr> errors(files.size());
  std::vector<std::size_t> order(files.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::vector<uintmax_t> sizes(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    sizes[i] = fs::file_size(files[i], ec);  // unreadable: 0 here, an error naming it from sha256_file
    if (ec) sizes[i] = 0;
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t k; (k = next.fetch_add(1)) < order.size();) {
      const std::size_t i = order[k];
      try {
        out[i] = sha256_file(files[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const std::size_t threads = std::min<std::size_t>(files.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  for (std::size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);  // the first file in the caller's order
  return out;
}

json tokenizer_record(const fs::path& path, const data::Tokenizer& tok) {
  std::vector<fs::path> paths;
  for (const models::HfTokenizerFile& f : models::hf_tokenizer_files(path)) paths.push_back(fs::absolute(f.source));
  const std::vector<FileSha256> digests = sha256_files(paths);
  json files = json::array();
  for (std::size_t i = 0; i < paths.size(); ++i)
    files.push_back({{"path", paths[i].lexically_normal().string()},
                     {"bytes", digests[i].bytes},
                     {"sha256", digests[i].sha256}});
  return {{"path", absolute_folder(path)},
          {"fingerprint", tok.fingerprint()},
          {"vocab_size", tok.vocab_size()},
          {"files", files}};
}

json hf_source_record(const fs::path& dir, const models::HfLayout& layout) {
  json r;
  r["format"] = "hf";
  r["folder"] = absolute_folder(dir);
  r["converted_by"] = written_by();
  r["config"] = config_essentials(dir / "config.json");
  std::set<std::string> dtypes;
  for (const auto& [name, stored] : layout.stored) dtypes.insert(std::string(dtype_name(stored.dtype)));
  r["dtypes"] = json(std::vector<std::string>(dtypes.begin(), dtypes.end()));
  std::vector<std::string> names = layout.files;
  const fs::path provenance = dir / models::kHfProvenanceFile;
  std::error_code ec;
  const bool has_provenance = fs::is_regular_file(provenance, ec);
  if (has_provenance) names.push_back(models::kHfProvenanceFile);
  std::vector<fs::path> paths;
  for (const std::string& name : names) paths.push_back(dir / name);
  const std::vector<FileSha256> digests = sha256_files(paths);
  json files = json::array();
  for (std::size_t i = 0; i < names.size(); ++i)
    files.push_back({{"name", names[i]}, {"bytes", digests[i].bytes}, {"sha256", digests[i].sha256}});
  r["files"] = files;
  if (has_provenance) {
    std::ifstream in(provenance, std::ios::binary);
    const json p = json::parse(in, nullptr, /*allow_exceptions=*/false);
    HT_CHECK(p.is_object(), "{}: not a JSON object, so not the record of what the folder's weights were made from "
                            "that hadatrain convert writes; remove it (or restore it) and convert again",
             provenance.string());
    r["provenance"] = p;
  }
  return r;
}

io::CheckpointData checkpoint_from_hf(const fs::path& dir, const fs::path& tokenizer_path,
                                      const data::Tokenizer* tokenizer) {
  // The record reads every file once more for its SHA-256: on threads of its own, beside the conversion, which reads
  // the same files (so mostly from the page cache) and spends its time converting to f32.
  const models::HfLayout layout = models::read_hf_layout(dir);
  std::future<json> record = std::async(std::launch::async, [&] { return hf_source_record(dir, layout); });
  models::HfWeights w = models::read_hf_weights(dir, layout);
  io::CheckpointData d;
  d.step = 0;
  for (auto& [name, t] : w.tensors) d.model.emplace_back(name, t.to(DType::f32));
  json source = record.get();
  d.model_metadata[kLlamaConfigKey] = w.config.to_json().dump();
  if (tokenizer != nullptr) {
    record_tokenizer(d.model_metadata, tokenizer_path, tokenizer->fingerprint(), tokenizer->vocab_size());
    source["tokenizer"] = tokenizer_record(tokenizer_path, *tokenizer);
  }
  d.model_metadata[kSourceKey] = source.dump();
  d.state = {{"step", 0}, {"converted_from", absolute_folder(dir)}};
  return d;
}

// Note [Provenance of a fine-tuned run]
// A run started from model.init_from records in every checkpoint it writes what it started from (kInitFromKey), for
// every model (a LLaMA, a ResNet or ViT from timm's or torchvision's weights or from one of our checkpoints): the
// checkpoint, folder or file its weights were read from, which is the one source the model was built from (Note
// [model.init_from resolved once] in trainer_setup.cpp), and that source's own records nested (a checkpoint's
// kSourceKey and kInitFromKey; an HF folder's hf_source_record; a file's or hub folder's SHA-256), so a checkpoint
// trained from a checkpoint trained from a converted one still names the HF folder and its files' SHA-256. The record
// is made once, when a new run starts, by the rank that writes checkpoints (for anything but one of our checkpoints
// that reads every weight file once more). A resumed run keeps the record of the checkpoint it resumes
// (Checkpointer::resume), whatever model.init_from names now: its weights descend from what that run started from,
// and model.init_from then gives the architecture only (a checkpoint root's `latest` may have moved on since). A
// checkpoint that records nothing gives a resumed run nothing to carry, and the run claims nothing it did not record
// when the weights were read.
json init_from_record(const InitFromSource& src) {
  json r;
  r["model.init_from"] = src.value;
  if (src.llama && !src.llama->peft.empty()) {
    r["kind"] = "peft";
    r.update(peft_folder_record(*src.llama));
    return r;
  }
  if (src.llama && src.llama->kind == LlamaSource::Kind::hf) {
    r["kind"] = "hf";
    r["folder"] = absolute_folder(src.llama->dir);
    r["source"] = hf_source_record(src.llama->dir, models::read_hf_layout(src.llama->dir));
    return r;
  }
  if (src.llama || is_our_checkpoint(src.path)) {
    const io::Metadata md =
        src.llama ? src.llama->metadata : io::read_safetensors_header(src.path / "model.safetensors").metadata;
    r["kind"] = "checkpoint";
    r["folder"] = absolute_folder(src.path);
    r["step"] = io::checkpoint_step(md, src.path);
    nest_checkpoint_records(src.path, md, r);
    return r;
  }
  std::error_code ec;
  if (!fs::is_directory(src.path, ec)) {
    const FileSha256 d = sha256_file(src.path);
    r["kind"] = "file";
    r["file"] = fs::absolute(src.path).lexically_normal().string();
    r["bytes"] = d.bytes;
    r["sha256"] = d.sha256;
    return r;
  }
  const std::vector<std::string> names = pretrained_folder_files(src.path);
  std::vector<fs::path> paths;
  for (const std::string& name : names) paths.push_back(src.path / name);
  const std::vector<FileSha256> digests = sha256_files(paths);
  json files = json::array();
  for (std::size_t i = 0; i < names.size(); ++i)
    files.push_back({{"name", names[i]}, {"bytes", digests[i].bytes}, {"sha256", digests[i].sha256}});
  r["kind"] = "folder";
  r["folder"] = absolute_folder(src.path);
  r["files"] = files;
  return r;
}

bool init_from_record_digests(const InitFromSource& src) {
  if (src.llama && !src.llama->peft.empty()) return true;
  if (src.llama) return src.llama->kind == LlamaSource::Kind::hf;
  return !is_our_checkpoint(src.path);
}

json hf_provenance_record(const LlamaSource& src, DType dtype, int64_t lora_merged) {
  json r;
  if (!src.peft.empty()) {
    r = peft_folder_record(src);
    r["format"] = "peft";
  } else {
    HT_ASSERT(src.kind == LlamaSource::Kind::checkpoint, "hf_provenance_record: {} is neither one of our checkpoints "
              "nor a PEFT adapter folder", src.dir.string());
    r["format"] = "hadatrain";
    r["checkpoint"] = absolute_folder(src.dir);
    r["step"] = io::checkpoint_step(src.metadata, src.dir);
    nest_checkpoint_records(src.dir, src.metadata, r);
  }
  r["written_by"] = written_by();
  r["dtype"] = std::string(dtype_name(dtype));
  if (lora_merged > 0) r["lora_merged"] = lora_merged;
  return r;
}

json llama2c_provenance_record(const fs::path& file, int version, const FileSha256& d) {
  return {{"format", "llama2c"},
          {"file", fs::absolute(file).lexically_normal().string()},
          {"version", version},
          {"bytes", d.bytes},
          {"sha256", d.sha256},
          {"written_by", written_by()}};
}

// ---- the line of descent (inspect-checkpoint) ----

namespace {

using Lines = std::vector<std::string>;

// r[key] as text ("?" when r has no such key): a string as it is, anything else as JSON.
std::string text_of(const json& r, const char* key) {
  if (!r.is_object() || !r.contains(key)) return "?";
  const json& v = r[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}
// r[key] when it is a string, else "".
std::string string_at(const json& r, const char* key) {
  return r.is_object() && r.contains(key) && r[key].is_string() ? r[key].get<std::string>() : "";
}

void describe_init_from(const json& r, const std::string& how, Lines& out);
void describe_hf_provenance(const json& p, const std::string& by, Lines& out);

// A PEFT adapter folder's record (peft_folder_record): the folder, then what it was written from and its base.
void describe_peft(const json& r, const std::string& how, const std::string& merged, Lines& out) {
  out.push_back(fmt::format("{} the PEFT LoRA adapter {} ({} and {}, each with its SHA-256{})", how,
                            text_of(r, "folder"), kPeftConfigFile, kPeftWeightsFile, merged));
  if (r.contains("provenance")) describe_hf_provenance(r["provenance"], "which hadatrain convert wrote from", out);
  if (r.contains("base")) describe_init_from(r["base"], "on the base", out);
}

// A kSourceKey record (format "hf"): the folder, its name on the hub, its files; then what the folder was made from.
void describe_hf(const json& r, const std::string& how, Lines& out) {
  if (string_at(r, "format") != "hf") {
    out.push_back(fmt::format("{} a source whose record is not what hadatrain writes", how));
    return;
  }
  std::string what;
  if (r.contains("config") && !string_at(r["config"], "_name_or_path").empty())
    what = fmt::format("_name_or_path {}; ", text_of(r["config"], "_name_or_path"));
  const std::size_t files = r.contains("files") && r["files"].is_array() ? r["files"].size() : 0;
  out.push_back(fmt::format("{} the HF folder {} ({}{} file(s), each with its SHA-256)", how, text_of(r, "folder"), what,
                            files));
  if (r.contains("provenance")) describe_hf_provenance(r["provenance"], "which hadatrain convert wrote from", out);
}

// An HF folder's models::kHfProvenanceFile: what `hadatrain convert` wrote the folder from ("by" starts the line).
void describe_hf_provenance(const json& p, const std::string& by, Lines& out) {
  const std::string format = string_at(p, "format");
  if (format == "llama2c") {
    out.push_back(fmt::format("{} the llama2.c file {}", by, text_of(p, "file")));
  } else if (format == "peft") {
    describe_peft(p, by, p.contains("lora_merged") ? "; its LoRA adapters merged" : "", out);
  } else if (format == "hadatrain") {
    out.push_back(fmt::format("{} the checkpoint {} (step {}{})", by, text_of(p, "checkpoint"), text_of(p, "step"),
                              p.contains("lora_merged") ? ", its LoRA adapters merged" : ""));
    if (p.contains("source")) describe_hf(p["source"], "which was converted from", out);
    if (p.contains("init_from")) describe_init_from(p["init_from"], "which was trained from", out);
  } else {
    out.push_back(fmt::format("{} a model whose record ({}) is not what hadatrain writes", by, models::kHfProvenanceFile));
  }
}

// A kInitFromKey record: the checkpoint, HF folder, file or folder a run started from, then what that was made from.
void describe_init_from(const json& r, const std::string& how, Lines& out) {
  const std::string kind = string_at(r, "kind");
  if (kind == "hf") {
    describe_hf(r.contains("source") ? r["source"] : json(), how, out);
  } else if (kind == "checkpoint") {
    out.push_back(fmt::format("{} the checkpoint {} (step {})", how, text_of(r, "folder"), text_of(r, "step")));
    if (r.contains("source")) describe_hf(r["source"], "which was converted from", out);
    if (r.contains("init_from")) describe_init_from(r["init_from"], "which was trained from", out);
  } else if (kind == "peft") {
    describe_peft(r, how, "", out);
  } else if (kind == "file") {
    out.push_back(fmt::format("{} the file {} ({} bytes, SHA-256 {})", how, text_of(r, "file"), text_of(r, "bytes"),
                              text_of(r, "sha256")));
  } else if (kind == "folder") {
    const std::size_t files = r.contains("files") && r["files"].is_array() ? r["files"].size() : 0;
    out.push_back(
        fmt::format("{} the folder {} ({} file(s), each with its SHA-256)", how, text_of(r, "folder"), files));
  } else {
    out.push_back(fmt::format("{} a model whose record is not what hadatrain writes", how));
  }
}

}  // namespace

std::vector<std::string> provenance_lines(const io::Metadata& md) {
  Lines out;
  const auto parsed = [&](const char* key) { return json::parse(md.at(key), nullptr, /*allow_exceptions=*/false); };
  if (md.count(kInitFromKey)) describe_init_from(parsed(kInitFromKey), "trained from", out);
  if (md.count(kSourceKey)) describe_hf(parsed(kSourceKey), "converted from", out);
  return out;
}

std::vector<std::string> hf_provenance_lines(const std::string& text) {
  Lines out;
  describe_hf_provenance(json::parse(text, nullptr, /*allow_exceptions=*/false), "written by hadatrain convert from",
                         out);
  return out;
}

std::string init_from_hf_folder(const io::Metadata& md, std::string& note) {
  const auto it = md.find(kInitFromKey);
  if (it == md.end()) {
    note = "the checkpoint records no model.init_from, so its base weights are no HF model hadatrain knows of";
    return "";
  }
  json r = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (r.is_object() && r.value("kind", json()) == "peft" && r.contains("base")) r = json(r["base"]);
  const std::string kind = string_at(r, "kind");
  if (kind == "hf" && !string_at(r, "folder").empty()) return string_at(r, "folder");
  if (kind == "checkpoint" && r.contains("source") && string_at(r["source"], "format") == "hf" &&
      !string_at(r["source"], "folder").empty() && !r.contains("init_from"))
    return string_at(r["source"], "folder");
  note = kind == "checkpoint"
             ? fmt::format("the run started from the checkpoint {}, which is no HF model", string_at(r, "folder"))
             : "the checkpoint's model.init_from record names no HF folder";
  return "";
}

}  // namespace ht::train
