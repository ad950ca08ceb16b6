// The weight average (config `ema`, Note [Weight EMA] in src/train/ema.h): its update rule, restarts and swap on a
// small module; through run_training, the average a run checkpoints against one recomputed from the run's own
// per-step weights, its evaluation records, an exact resume, and the config's errors.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/nn/module.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"
#include "train/ema.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

// A trained weight w (4), a frozen one (2), a floating buffer b (2) and an integer buffer n (1).
struct Tiny : nn::Module {
  Tensor w = zeros({4}), frozen = zeros({2}), b = zeros({2}), n = zeros({1}, {DType::i64, Device::cpu()});
  Tiny() {
    register_parameter("w", &w);
    register_parameter("frozen", &frozen);
    register_buffer("b", &b);
    register_buffer("n", &n);
    frozen.set_requires_grad(false);
  }
  std::string type_name() const override { return "Tiny"; }
  void set(double wv, double bv, int64_t nv) {
    fill_(w.detach(), wv);
    fill_(b.detach(), bv);
    fill_(n, static_cast<double>(nv));
  }
};

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

TEST_CASE("the weight average copies at its first update, then decays, every every_steps steps", "[ema]") {
  Tiny m;
  m.set(1.0, 10.0, 5);
  WeightEma ema(m, {.decay = 0.75, .every_steps = 2});
  const auto names = ema.tensors();
  REQUIRE(names.size() == 3);  // w, b, n: the frozen parameter is its own average
  CHECK(names.count("w") == 1);
  CHECK(names.count("frozen") == 0);
  CHECK(ema.updates() == 0);

  m.set(2.0, 20.0, 6);
  ema.after_step(1, false);  // not a multiple of every_steps: nothing
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 1.0));
  ema.after_step(2, false);  // the first update copies
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 2.0));
  CHECK(ema.updates() == 1);

  m.set(6.0, 40.0, 9);
  ema.after_step(4, false);  // 0.75 * 2 + 0.25 * 6 = 3 (exact in f32)
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 3.0));
  CHECK(values(ema.tensors().at("b")) == std::vector<double>(2, 25.0));  // 0.75 * 20 + 0.25 * 40
  CHECK(values(ema.tensors().at("n")) == std::vector<double>{9.0});      // an integer buffer is copied
  CHECK(ema.updates() == 2);

  // with_average: the model holds the average inside, its own weights again after (also when fn throws).
  const double inside = ema.with_average([&] { return m.w.to_vector<double>()[0]; });
  CHECK(inside == 3.0);
  CHECK(values(m.w) == std::vector<double>(4, 6.0));
  CHECK_THROWS(ema.with_average([&]() -> int { throw Error("evaluation failed"); }));
  CHECK(values(m.w) == std::vector<double>(4, 6.0));
  CHECK(values(m.b) == std::vector<double>(2, 40.0));
}

TEST_CASE("restart_during_warmup makes the average follow the weights until warm-up ends", "[ema]") {
  Tiny m;
  WeightEma ema(m, {.decay = 0.5, .every_steps = 1, .restart_during_warmup = true});
  m.set(2.0, 0.0, 0);
  ema.after_step(1, true);
  m.set(4.0, 0.0, 0);
  ema.after_step(2, true);  // restarted after step 1: copies
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 4.0));
  CHECK(ema.updates() == 0);
  m.set(6.0, 0.0, 0);
  ema.after_step(3, false);  // restarted after step 2 (the last warm-up step): copies
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 6.0));
  m.set(8.0, 0.0, 0);
  ema.after_step(4, false);  // averages: 0.5 * 6 + 0.5 * 8
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 7.0));
  CHECK(ema.updates() == 2);
}

TEST_CASE("a weight average that does not match the run's is refused by name", "[ema]") {
  Tiny m;
  WeightEma ema(m, {});
  std::map<std::string, Tensor> t = ema.tensors();
  t.erase("b");
  CHECK_THAT(test::error_of([&] { ema.load(t, 3, "ckpt"); }),
             HasSubstr("ckpt: the weight average has no tensor 'b'"));
  t = ema.tensors();
  t["w"] = zeros({5});
  CHECK_THAT(test::error_of([&] { ema.load(t, 3, "ckpt"); }), HasSubstr("'w' is"));
  t = ema.tensors();
  t["extra"] = zeros({1});
  CHECK_THAT(test::error_of([&] { ema.load(t, 3, "ckpt"); }),
             HasSubstr("holds 4 tensors, this run averages 3"));
  t = ema.tensors();
  t["w"] = full({4}, 7.0);
  ema.load(t, 3, "ckpt");
  CHECK(values(ema.tensors().at("w")) == std::vector<double>(4, 7.0));
  CHECK(ema.updates() == 3);
}

namespace {

// An MLP on 8x8 MNIST-layout images, batch 16: 4 steps per epoch, 3 epochs, a checkpoint every step.
TrainerConfig make_config(const std::string& name, const std::vector<std::string>& sets) {
  const std::string yaml = fmt::format(
      "run: {{seed: 5}}\n"
      "data: {{dataset: mnist, root: {}, batch_size: 16, eval_batch_size: 16, num_workers: 0}}\n"
      "model: {{name: mlp, hidden: [16]}}\n"
      "optim: {{name: adamw, lr: 3e-2, weight_decay: 0.01}}\n"
      "schedule: {{name: constant, warmup_steps: 2}}\n"
      "train: {{epochs: 3, log_every: 1, device: cpu}}\n"
      "checkpoint: {{every_steps: 1, keep_last: 0}}\n"
      "ema: {{decay: 0.8, every_steps: 1}}\n",
      test::idx8_dataset().string());
  std::vector<std::string> all = {"run.name=" + name, "run.out_dir=" + (test::scratch_dir() / name).string()};
  all.insert(all.end(), sets.begin(), sets.end());
  return read_trainer_config(ConfigReader::from_string(yaml, "test_ema.yaml", all));
}

std::vector<nlohmann::json> eval_records(const fs::path& out_dir) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.at("type") == "eval") out.push_back(j);
  }
  return out;
}

io::SafetensorsContents ema_file(const fs::path& ckpt_root, int64_t step) {
  return io::load_safetensors(io::checkpoint_dir(ckpt_root, step) / "ema.safetensors");
}

}  // namespace

TEST_CASE("a run's checkpointed average is the average of its own per-step weights", "[ema][trainer]") {
  const TrainerConfig cfg = make_config("ema_full", {});
  const TrainResult r = run_training(cfg);
  REQUIRE(r.steps == 12);
  REQUIRE(r.last_average_eval.has_value());
  CHECK(r.last_average_eval->total == test::kIdx8Test);

  // Recomputed in f64 from the weights of every step's checkpoint: step 1 copies, each later step averages.
  const auto model_at = [&](int64_t s) { return io::load_checkpoint_dir(io::checkpoint_dir(cfg.checkpoint.dir, s)); };
  const io::Checkpoint last = model_at(12);
  REQUIRE(last.ema.has_value());
  CHECK(last.state.at("ema_updates").get<int64_t>() == 12);
  for (const auto& [name, avg] : last.ema->tensors) {
    INFO(name);
    REQUIRE(last.model.contains(name));
    std::vector<double> expect = model_at(1).model.at(name).to_vector<double>();
    for (int64_t s = 2; s <= 12; ++s) {
      const std::vector<double> w = model_at(s).model.at(name).to_vector<double>();
      for (std::size_t i = 0; i < w.size(); ++i) expect[i] = 0.8 * expect[i] + 0.2 * w[i];
    }
    CHECK(test::compare(avg, expect, 1e-5, 1e-6) == "");
    CHECK(test::compare(avg, last.model.at(name).to_vector<double>(), 0.0, 0.0) != "");  // not the weights
  }

  // Every evaluation is recorded for the weights and for their average, which differ.
  const auto evals = eval_records(cfg.run.out_dir);
  REQUIRE(evals.size() == 3);
  for (const auto& e : evals) {
    REQUIRE(e.contains("ema_test_loss"));
    REQUIRE(e.contains("ema_test_acc"));
    CHECK(e.at("ema_test_loss").get<double>() != e.at("test_loss").get<double>());
  }
  CHECK(evals.back().at("ema_test_loss").get<double>() == r.last_average_eval->loss);
}

TEST_CASE("a run stopped and resumed ends with the uninterrupted run's average, bit for bit", "[ema][trainer]") {
  const TrainerConfig full = make_config("ema_ref", {"ema.restart_during_warmup=true"});
  REQUIRE(run_training(full).steps == 12);
  const TrainerConfig part = make_config("ema_part", {"ema.restart_during_warmup=true", "train.max_steps=5"});
  REQUIRE(run_training(part).steps == 5);
  const TrainResult resumed =
      run_training(make_config("ema_part", {"ema.restart_during_warmup=true"}), {ResumeFrom::Kind::latest, ""});
  REQUIRE(resumed.steps == 12);
  const io::SafetensorsContents a = ema_file(full.checkpoint.dir, 12), b = ema_file(part.checkpoint.dir, 12);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    INFO(name);
    CHECK(test::compare(b.at(name), t, 0.0, 0.0) == "");
  }
  CHECK(eval_records(full.run.out_dir).back().at("ema_test_loss") ==
        eval_records(part.run.out_dir).back().at("ema_test_loss"));
}

TEST_CASE("ema config errors name the key", "[ema][config]") {
  CHECK_THAT(test::error_of([] { make_config("ema_bad", {"ema.decay=1"}); }),
             HasSubstr("ema.decay"));
  CHECK_THAT(test::error_of([] { make_config("ema_bad", {"ema.every_steps=0"}); }),
             HasSubstr("ema.every_steps"));
  CHECK_THAT(test::error_of([] { make_config("ema_bad", {"dist.mode=fsdp"}); }),
             HasSubstr("dist.mode fsdp"));
  // Cleared by --set, the section is not given: no average.
  CHECK_FALSE(make_config("ema_off", {"ema=null"}).ema.has_value());
}
