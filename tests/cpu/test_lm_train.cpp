// Language-model training through the trainer (configs/llm/sotu_pretrain_small.yaml made tiny, on the CPU): a
// resumed run repeats the uninterrupted run's losses bit for bit; activation checkpointing and gradient
// accumulation leave the losses as they are; a LoRA run trains only its adapters; the checkpoint records the model
// so that it can be found and loaded again; evaluating the checkpoint gives the run's final validation loss.
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"
#include "test_tokenizer_support.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/io/safetensors.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

// The tests run in the source root (tests/CMakeLists.txt sets the working directory).
const std::string kRoot = fs::current_path().string();

TrainerConfig tiny_lm(const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"checkpoint.every_steps=3", "checkpoint.keep_last=0"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::tiny_lm_run(test::scratch_dir() / "lm" / name, sets);
}

// The LoRA fine-tuning recipe (configs/llm/moby_dick_finetune_lora.yaml) at test size from `base_ck`, then `extra`.
TrainerConfig lora_lm(const std::string& name, const fs::path& base_ck, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {
      "train.device=cpu", "train.precision=fp32", "train.log_every=1",
      "data.paths=[" + kRoot + "/tests/fixtures/lm_text]", "data.val_fraction=0.25",
      "data.tokenizer=" + kRoot + "/tests/fixtures/lm_char.model",
      "data.cache_dir=" + (test::scratch_dir() / "lm_cache").string(), "data.seq_len=16", "data.batch_size=4",
      "data.eval_batch_size=16", "schedule.warmup_steps=1", "checkpoint.every_epochs=0",
      "model.init_from=" + base_ck.string(), "run.out_dir=" + (test::scratch_dir() / "lm" / name).string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_trainer_config(kRoot + "/configs/llm/moby_dick_finetune_lora.yaml", sets);
}

}  // namespace

TEST_CASE("an LM run resumed from its step-3 checkpoint repeats the uninterrupted losses bit for bit", "[lm_train]") {
  const TrainerConfig whole = tiny_lm("whole");
  const TrainResult r = run_training(whole);
  REQUIRE(r.steps == 6);
  const auto expected = test::train_losses(whole.run.out_dir);
  REQUIRE(expected.size() == 6);
  CHECK(expected.at(6) < expected.at(1));  // it learns

  const TrainerConfig first = tiny_lm("resumed", {"train.max_steps=3"});
  run_training(first);
  const TrainerConfig rest = tiny_lm("resumed");
  const TrainResult r2 = run_training(rest, {.kind = ResumeFrom::Kind::latest});
  CHECK(r2.steps == 6);
  const auto got = test::train_losses(rest.run.out_dir);
  for (int64_t s = 1; s <= 6; ++s) {
    INFO("step " << s);
    REQUIRE(got.count(s) == 1);
    CHECK(got.at(s) == expected.at(s));
  }
  CHECK(r2.last_eval.loss == r.last_eval.loss);
  CHECK(r2.last_eval.has("ppl"));

  // The checkpoint records the model: found, loaded and evaluated again, it gives the run's validation loss.
  const LlamaSource src = find_llama_source(fs::path(whole.run.out_dir) / "checkpoints");
  CHECK(src.kind == LlamaSource::Kind::checkpoint);
  CHECK(src.dir.filename() == "step_6");
  CHECK(src.config.num_hidden_layers == 2);
  CHECK(src.config.vocab_size == 80);  // the tokenizer's
  CHECK(src.tokenizer == fs::path(kRoot + "/tests/fixtures/lm_char.model"));
  const EvalResult ev = run_evaluation(whole, (fs::path(whole.run.out_dir) / "checkpoints").string());
  CHECK(ev.loss == r.last_eval.loss);
}

TEST_CASE("an LM resume on edited text is an error; the same text elsewhere resumes", "[lm_train]") {
  const fs::path corpus = test::scratch_dir() / "lm" / "edited_corpus";
  const fs::path moved = test::scratch_dir() / "lm" / "moved_corpus";
  for (const auto& d : {corpus, moved}) {
    fs::remove_all(d);
    fs::create_directories(d);
    fs::copy(kRoot + "/tests/fixtures/lm_text", d, fs::copy_options::recursive);
  }
  const auto on = [](const fs::path& d, std::vector<std::string> sets = {}) {
    sets.push_back("data.paths=[" + d.string() + "]");
    return tiny_lm("edited", sets);
  };
  run_training(on(corpus, {"train.max_steps=3"}));
  // One character replaced by another: the same token count and rows, other text.
  const fs::path file = corpus / "1801_thomas_jefferson_dr.txt";
  std::string text;
  {
    std::ifstream in(file, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t at = text.find('e', 100);
  REQUIRE(at != std::string::npos);
  text[at] = 'a';
  std::ofstream(file, std::ios::binary) << text;
  const std::string err = test::error_of([&] { run_training(on(corpus), {.kind = ResumeFrom::Kind::latest}); });
  CHECK_THAT(err, HasSubstr("was written training on other rows than this config's data gives"));
  CHECK_THAT(err, HasSubstr("step_3"));
  // Twice the text: more rows.
  std::ofstream(file, std::ios::binary | std::ios::app) << text;
  CHECK_THAT(test::error_of([&] { run_training(on(corpus), {.kind = ResumeFrom::Kind::latest}); }),
             HasSubstr("but this config's training data has"));
  // The same files in another folder are the same data.
  CHECK(run_training(on(moved), {.kind = ResumeFrom::Kind::latest}).steps == 6);
}

TEST_CASE("activation checkpointing and gradient accumulation leave an LM run's losses as they are", "[lm_train]") {
  const TrainerConfig plain = tiny_lm("plain", {"train.max_steps=4", "checkpoint.every_steps=0"});
  run_training(plain);
  const TrainerConfig ck =
      tiny_lm("ckpt", {"train.max_steps=4", "checkpoint.every_steps=0", "model.activation_checkpointing=true"});
  run_training(ck);
  const auto a = test::train_losses(plain.run.out_dir), b = test::train_losses(ck.run.out_dir);
  REQUIRE(a.size() == 4);
  for (int64_t s = 1; s <= 4; ++s) CHECK(b.at(s) == a.at(s));  // the same ops on the same inputs
  const TrainerConfig accum = tiny_lm("accum", {"train.max_steps=4", "checkpoint.every_steps=0", "train.grad_accum_steps=2"});
  run_training(accum);
  const auto c = test::train_losses(accum.run.out_dir);
  for (int64_t s = 1; s <= 4; ++s) CHECK(std::abs(c.at(s) - a.at(s)) < 1e-5 * a.at(s));  // f32 sums in another order
}

TEST_CASE("a LoRA run from a checkpoint trains only its adapters and records them", "[lm_train]") {
  const TrainerConfig base = tiny_lm("lora_base", {"train.max_steps=3"});
  run_training(base);
  const fs::path base_ck = fs::path(base.run.out_dir) / "checkpoints";
  const TrainerConfig lora = lora_lm("lora", base_ck, {"train.max_steps=3", "checkpoint.every_steps=3"});
  run_training(lora);
  const auto before = io::load_safetensors(base_ck / "step_3" / "model.safetensors");
  const auto after = io::load_safetensors(fs::path(lora.run.out_dir) / "checkpoints" / "step_3" / "model.safetensors");
  int adapters = 0, base_weights = 0;
  for (const auto& [name, t] : after.tensors) {
    INFO(name);
    if (name.find(".lora_") != std::string::npos) {
      ++adapters;
      continue;
    }
    REQUIRE(before.contains(name));
    CHECK(test::compare(t, before.at(name), 0.0, 0.0) == "");  // frozen
    ++base_weights;
  }
  CHECK(adapters == 2 * 7 * 2);  // A and B of 7 targets in each of the 2 layers
  CHECK(base_weights == static_cast<int>(before.tensors.size()));
  // lora_B starts at zero and trained: at least one is no longer zero.
  bool moved = false;
  for (const auto& [name, t] : after.tensors)
    if (name.find(".lora_B.") != std::string::npos && test::rel_error(t, zeros_like(t)) > 0) moved = true;
  CHECK(moved);
  const LlamaSource src = find_llama_source(fs::path(lora.run.out_dir) / "checkpoints");
  REQUIRE(src.lora.has_value());
  CHECK(src.lora->rank == 16);
  // A resume continues under the adapters' settings only: another alpha would rescale what they learned.
  const std::string err = test::error_of([&] {
    run_training(lora_lm("lora", base_ck, {"train.max_steps=4", "model.lora.alpha=7"}), {.kind = ResumeFrom::Kind::latest});
  });
  CHECK_THAT(err, HasSubstr(fmt::format("was written with model.lora.alpha {}, but the config has model.lora.alpha "
                                        "7.0; resume with --set model.lora.alpha={}",
                                        nlohmann::json(src.lora->alpha).dump(), nlohmann::json(src.lora->alpha).dump())));
  CHECK(run_training(lora_lm("lora", base_ck, {"train.max_steps=4"}), {.kind = ResumeFrom::Kind::latest}).steps == 4);
}

// LoRA dropout draws its masks from the step-keyed dropout generator; an activation checkpoint rewinds the draw index
// to recompute a block with the forward's masks. From the second step on, the first block's checkpoint is taken
// before the step's first draw: it must rewind to draw 0 of this step, not to the previous step's count.
TEST_CASE("activation checkpointing leaves a LoRA run with dropout as it is", "[lm_train]") {
  const TrainerConfig base = tiny_lm("lora_ac_base", {"train.max_steps=3"});
  run_training(base);
  auto lora = [&](const std::string& name, bool checkpointing) {
    const TrainerConfig c = lora_lm(name, fs::path(base.run.out_dir) / "checkpoints",
                                    {"train.max_steps=5", "checkpoint.every_steps=0", "model.lora.dropout=0.3",
                                     std::string("model.activation_checkpointing=") + (checkpointing ? "true" : "false")});
    run_training(c);
    return test::train_losses(c.run.out_dir);
  };
  const auto plain = lora("lora_dropout_plain", false), ck = lora("lora_dropout_ckpt", true);
  REQUIRE(plain.size() == 5);
  for (int64_t s = 1; s <= 5; ++s) {
    INFO("step " << s);
    CHECK(ck.at(s) == plain.at(s));  // the same masks, the same ops
  }
}

// A model made from a preset records its tokenizer's bos and eos ids (generate stops at eos ids), not the preset's
// 1 and 2, which are '"' and '#' in Llama-3's vocabulary.
TEST_CASE("a LLaMA made from a preset records its tokenizer's bos and eos ids", "[lm_train]") {
  if (!tk_test::engines_built()) return;
  const TrainerConfig c = tiny_lm("llama3_ids", {"train.max_steps=1", "checkpoint.every_steps=1",
                                                 "data.tokenizer=" + tk_test::cached("llama3").string()});
  run_training(c);
  const LlamaSource src = find_llama_source(fs::path(c.run.out_dir) / "checkpoints");
  CHECK(src.config.vocab_size == 128256);
  CHECK(src.config.bos_token_id == 128000);
  CHECK(src.config.eos_token_ids == std::vector<int64_t>{128001});
}

TEST_CASE("LM config mistakes are named", "[lm_train]") {
  const std::string cfg = kRoot + "/configs/llm/moby_dick_finetune_full.yaml";
  // The architecture comes from init_from: a preset beside it is an error naming the key.
  CHECK(test::error_of([&] { load_trainer_config(cfg, {"model.preset=tiny"}); })
            .find("model.preset: the architecture comes from model.init_from") != std::string::npos);
  CHECK(test::error_of([&] { load_trainer_config(cfg, {"schedule.warmup_epochs=1"}); })
            .find("give warmup_steps or warmup_epochs, not both") != std::string::npos);
  CHECK(test::error_of([&] { load_trainer_config(cfg, {"train.grad_accum_steps=0"}); }).find("grad_accum_steps") !=
        std::string::npos);
  // A language model needs text: llama on images (and a classifier on text) is refused when the config is read,
  // naming both keys' lines (tests/cpu/test_config_checks.cpp has the others).
  const fs::path yaml = test::scratch_dir() / "llama_on_images.yaml";
  std::ofstream(yaml) << "data:\n  dataset: mnist\n  root: " << test::idx8_dataset().string()
                      << "\nmodel:\n  name: llama\n  preset: tiny\n";
  CHECK(test::error_of([&] { load_trainer_config(yaml.string()); })
            .find("llama_on_images.yaml:5:9: model.name: data.dataset mnist (" + yaml.string() +
                  ":2:12) and model.name llama do not go together") != std::string::npos);
  // data.seq_len beyond the model's context (the tiny preset: 256 positions) is found when the config is read ...
  CHECK(test::error_of([&] { tiny_lm("long_rows", {"data.seq_len=300"}); })
            .find("--set data.seq_len=300: data.seq_len: 300 is longer than the model's max_position_embeddings 256 "
                  "(model.preset tiny's)") != std::string::npos);
  // ... and with init_from, whose architecture the run reads, when the run starts.
  const TrainerConfig base = tiny_lm("long_rows_base", {"train.max_steps=1", "checkpoint.every_steps=1"});
  run_training(base);
  const TrainerConfig long_rows = tiny_lm("long_rows", {"data.seq_len=300", "model.preset=null",
                                                        "model.init_from=" + base.run.out_dir + "/checkpoints"});
  CHECK(test::error_of([&] { run_training(long_rows); })
            .find("data.seq_len 300 is longer than the model's max_position_embeddings 256") != std::string::npos);
  // Without data.seq_len the rows take init_from's positions (256, under 512) when the run starts, and the run's
  // config.yaml records them.
  const TrainerConfig fitted = tiny_lm("source_rows", {"data.seq_len=null", "model.preset=null", "train.max_steps=1",
                                                       "model.init_from=" + base.run.out_dir + "/checkpoints"});
  CHECK(fitted.data.text.seq_len == 0);
  run_training(fitted);
  CHECK(load_trainer_config(fitted.run.out_dir + "/config.yaml").data.text.seq_len == 256);
}

// Metadata that hadatrain writes as JSON, edited or made by another program: the error names the file and the key.
TEST_CASE("a checkpoint whose Llama or LoRA metadata is not what hadatrain writes is named", "[lm_train]") {
  const fs::path dir = test::scratch_dir() / "bad_llama_metadata";
  fs::create_directories(dir);
  const nlohmann::json config = models::LlamaConfig::tiny().to_json();
  auto error_with = [&](const io::Metadata& md) {
    io::save_safetensors(dir / "model.safetensors", {{"w", zeros({1})}}, md);
    return test::error_of([&] { find_llama_source(dir); });
  };
  const std::string file = (dir / "model.safetensors").string();
  CHECK_THAT(error_with({{kLlamaConfigKey, "{\"vocab_size\": "}}),
             HasSubstr(file + ": the metadata \"hadatrain.llama_config\" is not what hadatrain writes"));
  CHECK_THAT(error_with({{kLlamaConfigKey, config.dump()}, {kLoraKey, "{\"rank\": 8}"}}),
             HasSubstr(file + ": the metadata \"hadatrain.lora\" is not what hadatrain writes"));
  CHECK(error_with({{kLlamaConfigKey, config.dump()}}).empty());
}
