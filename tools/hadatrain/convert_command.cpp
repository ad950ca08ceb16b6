// `hadatrain convert --input PATH --output DIR [--dtype bf16|fp32]`: language-model checkpoints from one
// format to another, chosen by what PATH is (docs/language_models.md), each output recording what it was made from
// (train/provenance.h):
//   a llama2.c .bin file          -> an HF folder (q/k rows permuted to HF's rotary layout); its
//                                    hadatrain_provenance.json names the file and its SHA-256
//   an HF folder (config.json)    -> a checkpoint root of ours (DIR/step_0, usable as model.init_from), recording
//                                    the folder, its config.json's essentials, its files' SHA-256 and the
//                                    tokenizer's (train::checkpoint_from_hf)
//   one of our LM checkpoints     -> an HF folder; a LoRA run's adapters are merged into the weights first; its
//                                    hadatrain_provenance.json names the checkpoint and nests its records
//   a LoRA run's checkpoint, with --adapter -> its adapters alone as a folder peft loads (train/peft_adapter.h),
//                                    with the same provenance record
//   a PEFT LoRA adapter folder    -> an HF folder: its adapters merged into its base (base_model_name_or_path: an HF
//                                    folder or our checkpoint); its hadatrain_provenance.json names the adapter folder
//                                    (adapter_config.json's essentials, its files' SHA-256, its own record) and the
//                                    base's record, nested
// An output folder holds one model (Note [One model per output folder] in train/peft_adapter.h).
#include <filesystem>
#include <future>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "commands.h"
#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/peft_adapter.h"
#include "hadatrain/train/provenance.h"

namespace ht::cli {
namespace {

namespace fs = std::filesystem;

struct ConvertArgs {
  std::string input, output, dtype = "bf16", tokenizer, log_level = "info";
  bool adapter = false;  // --adapter: a LoRA checkpoint's adapters alone, as a PEFT folder
};

DType dtype_of(const std::string& name) { return name == "fp32" ? DType::f32 : DType::bf16; }

// A tokenizer to carry into the output: its path and the tokenizer loaded from there ("" and null: none).
struct CheckedTokenizer {
  fs::path path;
  std::unique_ptr<data::Tokenizer> tokenizer;
};

using train::recorded_tokenizer;
using train::RecordedTokenizer;

// The tokenizer to carry into the output, checked against the model's vocabulary before anything is written
// (Note [Tokenizer and model vocabularies]): --tokenizer, else the one the input records (none when neither).
CheckedTokenizer checked_tokenizer(const ConvertArgs& a, const RecordedTokenizer& recorded,
                                   const models::LlamaConfig& config, const fs::path& model) {
  const bool flag = !a.tokenizer.empty();
  CheckedTokenizer out;
  out.path = flag ? fs::path(a.tokenizer) : recorded.path;
  if (out.path.empty()) return out;
  const std::string what = flag ? "--tokenizer" : recorded.what + " (pass --tokenizer to carry another one)";
  out.tokenizer = train::load_tokenizer_for(out.path, config.vocab_size, {.what = what, .model = model.string()});
  spdlog::info("tokenizer {}: {} ids{}", out.path.string(), out.tokenizer->vocab_size(),
               out.tokenizer->vocab_size() < config.vocab_size
                   ? fmt::format(" (the model's embedding has {} rows: padding)", config.vocab_size)
                   : "");
  return out;
}

// An HF folder's provenance record with the tokenizer it carries.
std::string provenance_text(nlohmann::json record, const CheckedTokenizer& tok) {
  if (tok.tokenizer) record["tokenizer"] = train::tokenizer_record(tok.path, *tok.tokenizer);
  return record.dump(2) + "\n";
}

// ours (LoRA) -> a PEFT adapter folder: the adapters (and the modules the run trained beside them) alone.
int write_peft_adapter(const ConvertArgs& a, const train::LlamaSource& src) {
  const fs::path out = a.output;
  train::check_model_folder_output(out, train::ModelFolder::peft, "--output");
  train::PeftAdapterOptions o;
  o.dtype = dtype_of(a.dtype);
  const CheckedTokenizer tok = checked_tokenizer(a, recorded_tokenizer(src), src.config, src.dir);
  o.copy_tokenizer_from = tok.path;
  const train::PeftFromCheckpoint p = train::peft_adapter_from_checkpoint(src);
  if (!p.unchecked.empty())
    spdlog::warn("--adapter: {}, so whether the run trained weights beside its adapters (train.freeze) cannot be "
                 "told; the adapter folder holds the adapters alone",
                 p.unchecked);
  if (!p.adapter.base_model_note.empty())
    spdlog::warn("--adapter: base_model_name_or_path is null in {}: {}; set it to the HF model whose weights are the "
                 "checkpoint's base before loading the adapter with AutoPeftModelForCausalLM",
                 (out / train::kPeftConfigFile).string(), p.adapter.base_model_note);
  nlohmann::json record = train::hf_provenance_record(src, o.dtype, 0);
  record["peft_adapter"] = {{"lora_layers", p.adapter.lora_layers},
                            {"modules_to_save", p.adapter.modules_to_save},
                            {"base_model_name_or_path", p.adapter.config["base_model_name_or_path"]}};
  train::save_peft_adapter(out, p.adapter, o, provenance_text(std::move(record), tok));
  fmt::print("wrote {} (PEFT LoRA adapter, {}) from {}: {} LoRA layer(s), rank {}, alpha {:g}{}{}\n", out.string(),
             a.dtype, src.dir.string(), p.adapter.lora_layers, src.lora->rank, src.lora->alpha,
             p.adapter.modules_to_save.empty()
                 ? std::string()
                 : fmt::format(", modules_to_save [{}]", fmt::join(p.adapter.modules_to_save, ", ")),
             o.copy_tokenizer_from.empty() ? ", no tokenizer" : "");
  return 0;
}

int run_convert(const ConvertArgs& a) {
  ht::logging::set_level(a.log_level);
  const fs::path in = a.input, out = a.output;
  std::error_code ec;
  const auto not_for_adapter = [&](const char* what) {
    HT_CHECK(!a.adapter, "--adapter: {} is {}, which holds no LoRA adapters; --adapter writes the adapters of a LoRA "
             "run's checkpoint", in.string(), what);
  };
  if (fs::is_regular_file(in, ec)) {
    not_for_adapter("a llama2.c file");
    // llama2.c -> HF
    io::check_output_path(out, io::OutputKind::directory, "--output");
    train::check_model_folder_output(out, train::ModelFolder::hf, "--output");
    const models::Llama2cModel m = models::read_llama2c(in);  // its header checked before its weights are read
    models::HfWriteOptions o;
    o.dtype = dtype_of(a.dtype);
    const CheckedTokenizer tok = checked_tokenizer(a, {}, m.config, in);
    o.copy_tokenizer_from = tok.path;
    // The file's SHA-256 for the provenance record, on a thread of its own while the HF folder is written.
    std::future<FileSha256> digest = std::async(std::launch::async, [&] { return sha256_file(in); });
    o.provenance = [&] { return provenance_text(train::llama2c_provenance_record(in, m.version, digest.get()), tok); };
    models::save_hf_checkpoint(out, m.config, m.tensors, o);
    fmt::print("wrote {} (HF layout, {}) from the llama2.c v{} checkpoint {}: {} layers, hidden {}, vocabulary {}{}\n",
               out.string(), a.dtype, m.version, in.string(), m.config.num_hidden_layers, m.config.hidden_size,
               m.config.vocab_size, o.copy_tokenizer_from.empty() ? ", no tokenizer" : "");
    return 0;
  }
  // A PEFT adapter folder reads as its base with its adapters; whatever the base is, it goes to the merge below.
  const bool peft = train::is_peft_folder(in);
  HT_CHECK(!(peft && a.adapter), "--adapter: {} already is a PEFT LoRA adapter folder ({}); --adapter writes the "
           "adapters of a LoRA run's checkpoint. Convert it without --adapter to merge its adapters into its base",
           in.string(), train::kPeftConfigFile);
  const train::LlamaSource src = train::find_llama_source(in);
  if (!peft && src.kind == train::LlamaSource::Kind::hf) {
    not_for_adapter("an HF folder");
    // HF -> ours: the weights in f32 (master precision) as step_0 of a checkpoint root. The tokenizer is
    // recorded, not copied: --tokenizer, else the HF folder when it holds one. So is where the weights came from,
    // which `hadatrain inspect-checkpoint` shows.
    io::check_output_path(out, io::OutputKind::directory, "--output");
    const CheckedTokenizer tok = checked_tokenizer(a, recorded_tokenizer(src), src.config, in);
    const io::CheckpointData d = train::checkpoint_from_hf(in, tok.path, tok.tokenizer.get());
    io::create_output_directory(out, "--output");
    const fs::path dir = io::save_checkpoint(out, d);
    fmt::print("wrote {} (our checkpoint format, f32) from the HF folder {}{}\n", dir.string(), in.string(),
               tok.path.empty() ? "; it records no tokenizer" : "");
    return 0;
  }
  // ours -> HF (LoRA merged), and a PEFT folder -> HF (its adapters merged into its base)
  io::check_output_path(out, io::OutputKind::directory, "--output");
  if (a.adapter) return write_peft_adapter(a, src);
  train::check_model_folder_output(out, train::ModelFolder::hf, "--output");
  models::HfWriteOptions o;
  o.dtype = dtype_of(a.dtype);
  const CheckedTokenizer tok = checked_tokenizer(a, recorded_tokenizer(src), src.config, src.dir);
  o.copy_tokenizer_from = tok.path;
  std::shared_ptr<models::Llama> model = train::load_llama_source(src);
  const int64_t merged = nn::merge_lora(*model);
  o.provenance = [&] { return provenance_text(train::hf_provenance_record(src, o.dtype, merged), tok); };
  models::save_hf_checkpoint(out, *model, o);
  const std::string from = peft ? fmt::format("the PEFT LoRA adapter {} on its base {}", in.string(), src.dir.string())
                                : src.dir.string();
  fmt::print("wrote {} (HF layout, {}) from {}{}{}\n", out.string(), a.dtype, from,
             merged > 0 ? fmt::format(" with its {} LoRA layer(s) merged", merged) : "",
             o.copy_tokenizer_from.empty() ? ", no tokenizer" : "");
  return 0;
}

}  // namespace

Command add_convert_command(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  Command c;
  c.app = app.add_subcommand("convert", "Convert language-model checkpoints: llama2.c -> HF, HF <-> ours (LoRA merged), "
                                      "LoRA -> PEFT adapter, PEFT adapter -> HF (merged into its base)");
  c.app->add_option("--input", a->input,
                    "A llama2.c .bin file, an HF model folder, a checkpoint (root) of a language-model run, or a PEFT "
                    "LoRA adapter folder (merged into its base_model_name_or_path)")
      ->required();
  c.app->add_option("--output", a->output, "The folder to write (an HF folder, or a checkpoint root for HF input)")
      ->required();
  c.app->add_option("--dtype", a->dtype, "The dtype of the weights of an HF folder written")
      ->transform(spelling_check({"bf16", "fp32"}, float_spellings()))
      ->capture_default_str();
  c.app->add_option("--tokenizer", a->tokenizer,
                    "Tokenizer file or folder to carry along (default: the one the input names, if any); a file is "
                    "copied as tokenizer.model (SentencePiece) or tokenizer.json");
  c.app->add_flag("--adapter", a->adapter,
                  "Write a LoRA checkpoint's adapters alone as a PEFT folder (adapter_config.json, "
                  "adapter_model.safetensors) instead of the merged model");
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] { return run_convert(*a); };
  return c;
}

}  // namespace ht::cli
