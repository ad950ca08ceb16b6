// A LoRA run's adapters as a PEFT folder (train/peft_adapter.h, `hadatrain convert --adapter`), from real tiny runs on
// the CPU: adapter_config.json says what peft needs (r, lora_alpha, targets, the base model's folder), the
// safetensors holds the checkpoint's adapters under peft's keys bit for bit (f32), and the base weight plus
// (lora_alpha / r) · B A computed from the folder alone equals the weight the merged HF conversion writes. Weights the
// run trained beside its adapters go into modules_to_save, or are refused when peft cannot carry them. Read back
// (model.init_from, load_llama_source), the folder gives the checkpoint's model bit for bit, and what a run from it or
// an HF folder merged from it records names the folder and its base; what does not fit is an error naming the file and
// the value or tensor. An output folder that holds the other kind of model is refused.
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/peft_adapter.h"
#include "hadatrain/train/provenance.h"
#include "hadatrain/train/trainer.h"
#include "train/trainer_setup.h"

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

namespace {

// `run`'s checkpoint as a PEFT folder in f32 (bit for bit), under `name`.
fs::path write_adapter(const TrainerConfig& run, const std::string& name) {
  const LlamaSource src = find_llama_source(fs::path(run.run.out_dir) / "checkpoints");
  const PeftFromCheckpoint p = peft_adapter_from_checkpoint(src);
  const fs::path out = test::scratch_dir() / "peft" / name;
  fs::remove_all(out);
  save_peft_adapter(out, p.adapter, {.dtype = DType::f32}, hf_provenance_record(src, DType::f32, 0).dump(2));
  return out;
}

// The LoRA recipe's config (test size) starting from `init_from`, without training.
TrainerConfig lora_config(const fs::path& init_from, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {
      "train.device=cpu", "train.precision=fp32", "data.paths=[" + kRoot + "/tests/fixtures/lm_text]",
      "data.val_fraction=0.25", "data.tokenizer=" + kRoot + "/tests/fixtures/lm_char.model",
      "data.cache_dir=" + (test::scratch_dir() / "lm_cache").string(), "data.seq_len=16",
      "model.init_from=" + init_from.string(), "run.out_dir=" + (test::scratch_dir() / "peft" / "unused").string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_trainer_config(kRoot + "/configs/llm/moby_dick_finetune_lora.yaml", sets);
}

std::shared_ptr<nn::Module> model_of(const TrainerConfig& cfg) {
  const Datasets ds = make_datasets(cfg);
  Generator gen(1);
  return make_model(cfg, ds, gen, std::make_shared<Generator>(2), {.weights = InitWeights::read});
}

}  // namespace

TEST_CASE("a PEFT folder read back: model.init_from and load_llama_source give the checkpoint's model bit for bit",
          "[peft][init_from]") {
  const TrainerConfig lora = lora_run("norm_roundtrip", base_hf_folder(), {"train.freeze=['!model.norm.*']"});
  const fs::path dir = write_adapter(lora, "roundtrip_adapter");
  const LlamaSource ck = find_llama_source(fs::path(lora.run.out_dir) / "checkpoints");
  const LlamaSource src = find_llama_source(dir);
  CHECK(src.peft == dir);
  CHECK(src.kind == LlamaSource::Kind::hf);
  CHECK(fs::equivalent(src.dir, base_hf_folder()));  // base_model_name_or_path
  REQUIRE(src.lora.has_value());
  CHECK(src.lora->rank == 16);
  CHECK(src.lora->alpha == 32);

  // A run started from the folder (model.lora as the recipe's) holds every tensor of the checkpoint, exactly: the
  // base from the HF folder, the adapters and the trained norm (modules_to_save) from the PEFT folder.
  auto reference = load_llama_source(ck);
  const std::map<std::string, Tensor> want = reference->state_dict();
  auto started = model_of(lora_config(dir));
  const std::map<std::string, Tensor> got = started->state_dict();
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(test::compare(got.at(name), t, 0.0, 0.0) == "");
  }
  // The forward (fp32, eval mode) is the checkpoint's to the bit, through both readers.
  auto loaded = load_llama_source(src);
  reference->eval();
  started->eval();
  loaded->eval();
  const Tensor ids = from_vector(std::vector<int64_t>{1, 5, 9, 3, 7, 2, 4, 6}, Shape{2, 4}, {DType::i64});
  const Tensor logits = reference->forward(ids);
  CHECK(test::compare(started->forward(ids), logits, 0.0, 0.0) == "");
  CHECK(test::compare(loaded->forward(ids), logits, 0.0, 0.0) == "");

  // A run from the folder trains (its norm too, as the run that wrote it), and its adapters name the same HF base.
  const TrainerConfig again = lora_run("from_peft", dir, {"train.freeze=['!model.norm.*']"});
  const PeftFromCheckpoint p2 =
      peft_adapter_from_checkpoint(find_llama_source(fs::path(again.run.out_dir) / "checkpoints"));
  CHECK(p2.adapter.config["base_model_name_or_path"] == fs::absolute(base_hf_folder()).lexically_normal().string());
  CHECK(p2.adapter.modules_to_save == std::vector<std::string>{"model.norm"});

  // `hadatrain eval --checkpoint <folder>` under the run's config: the checkpoint's loss to the bit, as step 0.
  const TrainerConfig eval_cfg = lora_config(base_hf_folder(), {"data.eval_batch_size=16"});
  const CheckpointEvaluation from_ck = run_evaluation(eval_cfg, ck.dir.string());
  const CheckpointEvaluation from_peft = run_evaluation(eval_cfg, dir.string());
  CHECK(from_peft.step == 0);
  CHECK(from_peft.total == from_ck.total);
  CHECK(from_peft.loss == from_ck.loss);
  // ... which the base alone does not give: the adapters and the norm trained.
  CHECK(run_evaluation(lora_config(base_hf_folder(), {"model.lora=null"}), base_hf_folder().string()).loss != from_ck.loss);
  CHECK_THAT(test::error_of([&] { run_evaluation(lora_config(base_hf_folder(), {"model.lora.alpha=8"}), dir.string()); }),
             HasSubstr("--checkpoint " + dir.string() + ": model.lora.alpha is 8 but " + (dir / kPeftConfigFile).string() +
                       " has lora_alpha 32"));

  // The run's provenance: the adapter folder by SHA-256, its own record, and the base HF folder beneath.
  const TrainerConfig cfg = lora_config(dir);
  const nlohmann::json r = init_from_record(*resolve_init_from(cfg, InitWeights::read));
  CHECK(r["kind"] == "peft");
  CHECK(r["folder"] == fs::absolute(dir).lexically_normal().string());
  CHECK(r["files"].size() == 2);
  CHECK(r["files"][1]["name"] == kPeftWeightsFile);
  CHECK(r["files"][1]["sha256"].get<std::string>().size() == 64);
  CHECK(r["base"]["kind"] == "hf");
  CHECK(r["base"]["folder"] == fs::absolute(base_hf_folder()).lexically_normal().string());
  const std::vector<std::string> lines = provenance_lines({{kInitFromKey, r.dump()}});
  REQUIRE(lines.size() >= 4);
  CHECK_THAT(lines[0], HasSubstr("trained from the PEFT LoRA adapter " + r["folder"].get<std::string>()));
  CHECK_THAT(lines[1], HasSubstr("which hadatrain convert wrote from the checkpoint " +
                                 fs::absolute(ck.dir).lexically_normal().string() + " (step 2)"));
  CHECK_THAT(lines[2], HasSubstr("which was trained from the HF folder"));
  CHECK_THAT(lines.back(), HasSubstr("on the base the HF folder " + r["base"]["folder"].get<std::string>()));
  CHECK(r["config"]["r"] == 16);
  CHECK(r["config"]["base_model_name_or_path"] == fs::absolute(base_hf_folder()).lexically_normal().string());

  // The HF folder `convert` merges from the PEFT folder records the same (the folder, adapter_config.json's
  // essentials, its files by SHA-256, its own record, its base) and what was written; inspect-checkpoint reads it.
  const nlohmann::json h = hf_provenance_record(src, DType::f32, 14);
  CHECK(h["format"] == "peft");
  CHECK(h["dtype"] == "f32");
  CHECK(h["lora_merged"] == 14);
  for (const char* key : {"folder", "config", "files", "provenance", "base"}) {
    INFO(key);
    CHECK(h[key] == r[key]);
  }
  CHECK(h["config"]["lora_alpha"] == 32);
  CHECK(h["config"]["target_modules"].size() == 7);
  CHECK(h["config"]["modules_to_save"] == nlohmann::json({"model.norm"}));
  const std::vector<std::string> hf_lines = hf_provenance_lines(h.dump());
  REQUIRE(hf_lines.size() == lines.size());
  CHECK(hf_lines[0] == "written by hadatrain convert from the PEFT LoRA adapter " + r["folder"].get<std::string>() +
                           " (adapter_config.json and adapter_model.safetensors, each with its SHA-256; its LoRA "
                           "adapters merged)");
  for (std::size_t i = 1; i < lines.size(); ++i) CHECK(hf_lines[i] == lines[i]);
}

TEST_CASE("a PEFT folder that does not fit: model.lora's values, its base, its keys and shapes are named",
          "[peft][init_from]") {
  const TrainerConfig lora = lora_run("errors", base_hf_folder());
  const fs::path dir = write_adapter(lora, "errors_adapter");
  const std::string config_file = (dir / kPeftConfigFile).string();
  const std::string weights_file = (dir / kPeftWeightsFile).string();

  // model.lora against adapter_config.json: both values and the file.
  std::string err = test::error_of([&] { model_of(lora_config(dir, {"model.lora.rank=8"})); });
  CHECK_THAT(err, HasSubstr("model.lora.rank is 8 but the adapters in " + config_file + " have r 16"));
  err = test::error_of([&] { model_of(lora_config(dir, {"model.lora.alpha=16"})); });
  CHECK_THAT(err, HasSubstr("model.lora.alpha is 16 but " + config_file + " has lora_alpha 32"));
  err = test::error_of([&] { model_of(lora_config(dir, {"model.lora.target_modules=[q_proj]"})); });
  CHECK_THAT(err, HasSubstr("model.lora.target_modules is [\"q_proj\"] but " + config_file));
  err = test::error_of([&] { model_of(lora_config(dir, {"model.lora=null"})); });
  CHECK_THAT(err, HasSubstr("is a PEFT LoRA adapter (r 16, lora_alpha 32"));
  CHECK_THAT(err, HasSubstr("but the config has no model.lora"));

  const auto edit_config = [&](const fs::path& to, const std::function<void(nlohmann::json&)>& f) {
    fs::remove_all(to);
    fs::create_directories(to);
    fs::copy_file(dir / kPeftWeightsFile, to / kPeftWeightsFile);
    nlohmann::json c = read_json(dir / kPeftConfigFile);
    f(c);
    std::ofstream(to / kPeftConfigFile) << c.dump(2);
  };
  // The base: null, and a name that is no local folder (a hub id).
  const fs::path no_base = test::scratch_dir() / "peft" / "no_base";
  edit_config(no_base, [](nlohmann::json& c) { c["base_model_name_or_path"] = nullptr; });
  err = test::error_of([&] { find_llama_source(no_base); });
  CHECK_THAT(err, HasSubstr("base_model_name_or_path is null in " + (no_base / kPeftConfigFile).string()));
  const fs::path hub = test::scratch_dir() / "peft" / "hub_base";
  edit_config(hub, [](nlohmann::json& c) { c["base_model_name_or_path"] = "meta-llama/Llama-3.2-1B"; });
  err = test::error_of([&] { find_llama_source(hub); });
  CHECK_THAT(err, HasSubstr("on the base model 'meta-llama/Llama-3.2-1B'"));
  CHECK_THAT(err, HasSubstr("which is not a local folder"));
  const fs::path dora = test::scratch_dir() / "peft" / "dora";
  edit_config(dora, [](nlohmann::json& c) { c["use_dora"] = true; });
  CHECK_THAT(test::error_of([&] { find_llama_source(dora); }), HasSubstr("use_dora is true"));

  // The weights: a wrong shape and a key that is no adapter of the model, each named with the file.
  const auto edit_weights = [&](const std::string& name, const std::function<void(std::map<std::string, Tensor>&)>& f) {
    const fs::path to = test::scratch_dir() / "peft" / name;
    fs::remove_all(to);
    fs::create_directories(to);
    fs::copy_file(dir / kPeftConfigFile, to / kPeftConfigFile);
    std::map<std::string, Tensor> t = io::load_safetensors(dir / kPeftWeightsFile).tensors;
    f(t);
    io::TensorList list(t.begin(), t.end());
    io::save_safetensors(to / kPeftWeightsFile, list, {});
    return to;
  };
  const std::string a0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
  const fs::path shape = edit_weights("bad_shape", [&](auto& t) { t[a0] = zeros(Shape{8, t.at(a0).shape()[1]}); });
  err = test::error_of([&] { model_of(lora_config(shape)); });
  CHECK_THAT(err, HasSubstr((shape / kPeftWeightsFile).string() + ": the tensor '" + a0 + "' has shape (8, "));
  const fs::path renamed = edit_weights("bad_key", [&](auto& t) {
    t["base_model.model.model.layers.0.self_attn.qq_proj.lora_A.weight"] = t.at(a0);
    t.erase(a0);
  });
  err = test::error_of([&] { load_llama_source(find_llama_source(renamed)); });
  CHECK_THAT(err, HasSubstr("the tensor 'base_model.model.model.layers.0.self_attn.qq_proj.lora_A.weight' is no "
                            "adapter of a LoRA layer of the model"));
  const fs::path missing = edit_weights("missing_key", [&](auto& t) { t.erase(a0); });
  err = test::error_of([&] { load_llama_source(find_llama_source(missing)); });
  CHECK_THAT(err, HasSubstr("the model's adapter 'model.layers.0.self_attn.q_proj.lora_A.weight' is missing"));
}

TEST_CASE("an output folder holds one model: an HF model and a PEFT adapter are not written into each other's folder",
          "[peft]") {
  const fs::path dir = test::scratch_dir() / "peft" / "one_model";
  fs::remove_all(dir);
  check_model_folder_output(dir, ModelFolder::hf, "--output");  // missing: created later
  fs::create_directories(dir);
  std::ofstream(dir / "README.md") << "notes\n";
  std::ofstream(dir / "tokenizer.model") << "x";  // shared by both kinds
  check_model_folder_output(dir, ModelFolder::hf, "--output");
  check_model_folder_output(dir, ModelFolder::peft, "--output");

  std::ofstream(dir / "config.json") << "{}";
  std::ofstream(dir / "model-00001-of-00002.safetensors") << "x";
  check_model_folder_output(dir, ModelFolder::hf, "--output");  // written again: replaced
  CHECK_THAT(test::error_of([&] { check_model_folder_output(dir, ModelFolder::peft, "--output"); }),
             HasSubstr("--output: " + dir.string() + " holds an HF model (config.json, "
                       "model-00001-of-00002.safetensors); the PEFT adapter written there would sit beside it and the "
                       "folder would read as both. Write to another folder, or remove those files first"));

  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / kPeftWeightsFile) << "x";
  check_model_folder_output(dir, ModelFolder::peft, "--output");
  CHECK_THAT(test::error_of([&] { check_model_folder_output(dir, ModelFolder::hf, "--output"); }),
             HasSubstr("--output: " + dir.string() + " holds a PEFT LoRA adapter (adapter_model.safetensors); the HF "
                       "model written there"));
}
