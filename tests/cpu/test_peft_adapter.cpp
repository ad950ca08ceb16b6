// A LoRA run's adapters as a PEFT folder (train/peft_adapter.h, `hadatrain convert --adapter`), from real tiny runs on
// the CPU: adapter_config.json says what peft needs (r, lora_alpha, targets, the base model's folder), the
// safetensors holds the checkpoint's adapters under peft's keys bit for bit (f32), and the base weight plus
// (lora_alpha / r) · B A computed from the folder alone equals the weight the merged HF conversion writes. Weights the
// run trained beside its adapters go into modules_to_save, or are refused when peft cannot carry them.
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/peft_adapter.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

const std::string kRoot = fs::current_path().string();  // tests run in the source root

// The LoRA recipe (configs/llm/moby_dick_finetune_lora.yaml: rank 16, alpha 32, dropout 0.05, 7 targets) at test
// size from `init_from`, 2 steps, a checkpoint at step 2.
TrainerConfig lora_run(const std::string& name, const fs::path& init_from, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {
      "train.device=cpu", "train.precision=fp32", "train.max_steps=2", "checkpoint.every_steps=2",
      "data.paths=[" + kRoot + "/tests/fixtures/lm_text]", "data.val_fraction=0.25",
      "data.tokenizer=" + kRoot + "/tests/fixtures/lm_char.model",
      "data.cache_dir=" + (test::scratch_dir() / "lm_cache").string(), "data.seq_len=16", "data.batch_size=4",
      "data.eval_batch_size=16", "schedule.warmup_steps=1", "checkpoint.every_epochs=0",
      "model.init_from=" + init_from.string(), "run.out_dir=" + (test::scratch_dir() / "peft" / name).string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  const TrainerConfig c = load_trainer_config(kRoot + "/configs/llm/moby_dick_finetune_lora.yaml", sets);
  fs::remove_all(c.run.out_dir);
  run_training(c);
  return c;
}

// A tiny model trained 3 steps from scratch, converted to an HF folder (f32): the base the LoRA runs start from.
const fs::path& base_hf_folder() {
  static const fs::path hf = [] {
    const fs::path out = test::scratch_dir() / "peft" / "base";
    fs::remove_all(out);
    run_training(test::tiny_lm_run(out, {"train.max_steps=3", "checkpoint.every_steps=3"}));
    const LlamaSource src = find_llama_source(out / "checkpoints");
    const fs::path dir = test::scratch_dir() / "peft" / "base_hf";
    models::save_hf_checkpoint(dir, *load_llama_source(src), {.dtype = DType::f32});
    return dir;
  }();
  return hf;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

std::map<std::string, Tensor> checkpoint_tensors(const TrainerConfig& c) {
  return io::load_safetensors(fs::path(c.run.out_dir) / "checkpoints" / "step_2" / "model.safetensors").tensors;
}

}  // namespace

TEST_CASE("a LoRA checkpoint as a PEFT folder: peft's config and keys, the adapters exactly, the merged weights",
          "[peft]") {
  const TrainerConfig lora = lora_run("plain", base_hf_folder());
  const LlamaSource src = find_llama_source(fs::path(lora.run.out_dir) / "checkpoints");
  const PeftFromCheckpoint p = peft_adapter_from_checkpoint(src);
  CHECK(p.unchecked.empty());  // AdamW keeps state: what trained is known
  CHECK(p.adapter.base_model_note.empty());
  const fs::path out = test::scratch_dir() / "peft" / "plain_adapter";
  fs::remove_all(out);
  save_peft_adapter(out, p.adapter, {.dtype = DType::f32}, "{}\n");

  const nlohmann::json cfg = read_json(out / kPeftConfigFile);
  CHECK(cfg["peft_type"] == "LORA");
  CHECK(cfg["task_type"] == "CAUSAL_LM");
  CHECK(cfg["r"] == 16);
  CHECK(cfg["lora_alpha"] == 32);
  CHECK(cfg["lora_dropout"].get<double>() == 0.05);
  CHECK(cfg["target_modules"] == nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"}));
  CHECK(cfg["bias"] == "none");
  CHECK(cfg["fan_in_fan_out"] == false);
  CHECK(cfg["use_rslora"] == false);
  CHECK(cfg["inference_mode"] == true);
  CHECK(cfg["modules_to_save"].is_null());
  // The run started from the HF folder: it is the base peft loads.
  CHECK(cfg["base_model_name_or_path"] == fs::absolute(base_hf_folder()).lexically_normal().string());

  // Every adapter of the checkpoint under "base_model.model.<name>", (r, in) and (out, r), bit for bit; nothing else.
  const std::map<std::string, Tensor> ck = checkpoint_tensors(lora);
  const std::map<std::string, Tensor> peft = io::load_safetensors(out / kPeftWeightsFile).tensors;
  int adapters = 0;
  for (const auto& [name, t] : ck) {
    if (name.find(".lora_") == std::string::npos) continue;
    INFO(name);
    ++adapters;
    const auto it = peft.find("base_model.model." + name);
    REQUIRE(it != peft.end());
    CHECK(it->second.dtype() == DType::f32);
    CHECK(test::compare(it->second, t, 0.0, 0.0) == "");
  }
  CHECK(adapters == 2 * 7 * 2);
  CHECK(peft.size() == static_cast<std::size_t>(adapters));
  CHECK(p.adapter.lora_layers == 14);
  const Tensor& a0 = peft.at("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  const Tensor& b0 = peft.at("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  const models::LlamaConfig mc = src.config;
  CHECK(a0.shape() == Shape{16, mc.hidden_size});        // (r, in)
  CHECK(b0.shape() == Shape{mc.hidden_size, 16});        // (out, r)

  // What peft computes from the folder, W + (lora_alpha / r) · B A, is what the merged HF conversion holds.
  const fs::path merged_dir = test::scratch_dir() / "peft" / "plain_merged";
  {
    auto model = load_llama_source(src);
    nn::merge_lora(*model);
    models::save_hf_checkpoint(merged_dir, *model, {.dtype = DType::f32});
  }
  const std::map<std::string, Tensor> merged = models::read_hf_weights(merged_dir).tensors;
  const double scaling = cfg["lora_alpha"].get<double>() / cfg["r"].get<double>();
  bool moved = false;
  int layers = 0;
  for (const auto& [key, a] : peft) {
    if (!key.ends_with(".lora_A.weight")) continue;
    const std::string layer = key.substr(std::string("base_model.model.").size(),
                                         key.size() - std::string("base_model.model.").size() - 14);
    INFO(layer);
    ++layers;
    const Tensor& b = peft.at("base_model.model." + layer + ".lora_B.weight");
    const Tensor& w = ck.at(layer + ".weight");
    const Tensor expected = add(w, mul(matmul(b, a), scaling));
    CHECK(test::compare(merged.at(layer + ".weight"), expected, 0.0, 0.0) == "");
    if (test::rel_error(merged.at(layer + ".weight"), w) > 0) moved = true;
  }
  CHECK(layers == 14);
  CHECK(moved);  // the adapters trained: the merge changed the weights

  // --dtype bf16: every tensor rounded once.
  const fs::path out16 = test::scratch_dir() / "peft" / "plain_adapter_bf16";
  save_peft_adapter(out16, p.adapter, {}, "");
  const std::map<std::string, Tensor> peft16 = io::load_safetensors(out16 / kPeftWeightsFile).tensors;
  REQUIRE(peft16.size() == peft.size());
  for (const auto& [key, t] : peft16) {
    INFO(key);
    CHECK(t.dtype() == DType::bf16);
    CHECK(test::compare(t, to_dtype(peft.at(key), DType::bf16), 0.0, 0.0) == "");
  }
}

TEST_CASE("weights trained beside the adapters go into modules_to_save, or are refused naming what would be lost",
          "[peft]") {
  // train.freeze's "!model.norm.*" trains the final norm too: peft carries it as a module to save, whole.
  const TrainerConfig norm = lora_run("norm", base_hf_folder(), {"train.freeze=['!model.norm.*']"});
  const LlamaSource src = find_llama_source(fs::path(norm.run.out_dir) / "checkpoints");
  const PeftFromCheckpoint p = peft_adapter_from_checkpoint(src);
  CHECK(p.adapter.modules_to_save == std::vector<std::string>{"model.norm"});
  CHECK(p.adapter.config["modules_to_save"] == nlohmann::json({"model.norm"}));
  const std::map<std::string, Tensor> ck = checkpoint_tensors(norm);
  REQUIRE(p.adapter.tensors.count("base_model.model.model.norm.weight"));
  CHECK(test::compare(p.adapter.tensors.at("base_model.model.model.norm.weight"), ck.at("model.norm.weight"), 0.0,
                      0.0) == "");
  const std::map<std::string, Tensor> base = models::read_hf_weights(base_hf_folder()).tensors;
  CHECK(test::rel_error(ck.at("model.norm.weight"), base.at("model.norm.weight")) > 0);  // it trained
  CHECK(p.adapter.tensors.size() == 2 * 14 + 1);

  // A LoRA layer's base weight trained: peft keeps that frozen, so the adapter folder would lose it.
  const TrainerConfig q = lora_run("q_base", base_hf_folder(), {"train.freeze=['!model.layers.0.self_attn.q_proj.weight']"});
  const std::string err =
      test::error_of([&] { peft_adapter_from_checkpoint(find_llama_source(fs::path(q.run.out_dir) / "checkpoints")); });
  CHECK_THAT(err, HasSubstr("trained 1 weight(s) beside its LoRA adapters that a PEFT adapter cannot carry: "
                            "'model.layers.0.self_attn.q_proj.weight (the base weight of a LoRA layer)'"));
  CHECK_THAT(err, HasSubstr("Convert without --adapter"));
}

TEST_CASE("a checkpoint without LoRA adapters has no PEFT adapter; a run from a trained checkpoint names no base",
          "[peft]") {
  const fs::path plain = test::scratch_dir() / "peft" / "no_lora";
  fs::remove_all(plain);
  run_training(test::tiny_lm_run(plain, {"train.max_steps=2", "checkpoint.every_steps=2"}));
  const std::string err = test::error_of([&] { peft_adapter_from_checkpoint(find_llama_source(plain / "checkpoints")); });
  CHECK_THAT(err, HasSubstr("--adapter: the checkpoint " + (plain / "checkpoints" / "step_2").string() +
                            " holds no LoRA adapters"));
  CHECK_THAT(err, HasSubstr("records no hadatrain.lora"));
  // A LoRA run from that checkpoint (trained from scratch): no HF model is its base.
  const TrainerConfig lora = lora_run("from_checkpoint", plain / "checkpoints");
  const PeftFromCheckpoint p = peft_adapter_from_checkpoint(find_llama_source(fs::path(lora.run.out_dir) / "checkpoints"));
  CHECK(p.adapter.config["base_model_name_or_path"].is_null());
  CHECK_THAT(p.adapter.base_model_note, HasSubstr("which is no HF model"));
}
