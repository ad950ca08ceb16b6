// `hadatrain convert --input PATH --output DIR [--dtype bf16|f32]`: language-model checkpoints from one
// format to another, chosen by what PATH is (docs/language_models.md):
//   a llama2.c .bin file          -> an HF folder (q/k rows permuted to HF's rotary layout)
//   an HF folder (config.json)    -> a checkpoint root of ours (DIR/step_0, usable as model.init_from)
//   one of our LM checkpoints     -> an HF folder; a LoRA run's adapters are merged into the weights first
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/train/lm_source.h"

namespace ht::cli {
namespace {

namespace fs = std::filesystem;

struct ConvertArgs {
  std::string input, output, dtype = "bf16", tokenizer, log_level = "info";
};

DType dtype_of(const std::string& name) { return name == "f32" ? DType::f32 : DType::bf16; }

int run_convert(const ConvertArgs& a) {
  ht::logging::set_level(a.log_level);
  const fs::path in = a.input, out = a.output;
  std::error_code ec;
  if (fs::is_regular_file(in, ec)) {
    // llama2.c -> HF
    const models::Llama2cModel m = models::read_llama2c(in);
    models::HfWriteOptions o;
    o.dtype = dtype_of(a.dtype);
    if (!a.tokenizer.empty()) o.copy_tokenizer_from = a.tokenizer;
    models::save_hf_checkpoint(out, m.config, m.tensors, o);
    fmt::print("wrote {} (HF layout, {}) from the llama2.c v{} checkpoint {}: {} layers, hidden {}, vocabulary {}\n",
               out.string(), a.dtype, m.version, in.string(), m.config.num_hidden_layers, m.config.hidden_size,
               m.config.vocab_size);
    return 0;
  }
  const train::LlamaSource src = train::find_llama_source(in);
  if (src.kind == train::LlamaSource::Kind::hf) {
    // HF -> ours: the weights in f32 (master precision) as step_0 of a checkpoint root.
    models::HfWeights w = models::read_hf_weights(in);
    io::CheckpointData d;
    d.step = 0;
    for (auto& [name, t] : w.tensors) d.model.emplace_back(name, t.to(DType::f32));
    d.model_metadata[train::kLlamaConfigKey] = w.config.to_json().dump();
    const std::string tok = a.tokenizer.empty() ? fs::absolute(in).string() : fs::absolute(a.tokenizer).string();
    d.model_metadata[train::kTokenizerKey] = tok;
    d.state = {{"step", 0}, {"converted_from", fs::absolute(in).string()}};
    const fs::path dir = io::save_checkpoint(out, d);
    fmt::print("wrote {} (our checkpoint format, f32) from the HF folder {}\n", dir.string(), in.string());
    return 0;
  }
  // ours -> HF (LoRA merged)
  std::shared_ptr<models::Llama> model = train::load_llama_source(src);
  const int64_t merged = nn::merge_lora(*model);
  models::HfWriteOptions o;
  o.dtype = dtype_of(a.dtype);
  const fs::path tok = a.tokenizer.empty() ? src.tokenizer : fs::path(a.tokenizer);
  if (!tok.empty()) o.copy_tokenizer_from = fs::is_directory(tok, ec) ? tok : tok.parent_path();
  models::save_hf_checkpoint(out, *model, o);
  fmt::print("wrote {} (HF layout, {}) from {}{}\n", out.string(), a.dtype, src.dir.string(),
             merged > 0 ? fmt::format(" with its {} LoRA layer(s) merged", merged) : "");
  return 0;
}

}  // namespace

Command add_convert_command(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  Command c;
  c.app = app.add_subcommand("convert", "Convert language-model checkpoints: llama2.c -> HF, HF <-> ours (LoRA merged)");
  c.app->add_option("--input", a->input,
                    "A llama2.c .bin file, an HF model folder, or a checkpoint (root) of a language-model run")
      ->required();
  c.app->add_option("--output", a->output, "The folder to write (an HF folder, or a checkpoint root for HF input)")
      ->required();
  c.app->add_option("--dtype", a->dtype, "Weights of an HF folder written in bf16 or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  c.app->add_option("--tokenizer", a->tokenizer,
                    "Tokenizer file or folder to carry along (default: the one the input names, if any)");
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] { return run_convert(*a); };
  return c;
}

}  // namespace ht::cli
