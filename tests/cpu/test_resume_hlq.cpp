// Exact resume with a pipeline that draws stochastic-rounding noise: HLQ's 4-bit g_y (per token) and 8-bit HLA g̃
// round stochastically with Philox noise keyed by (seed, layer, step, role) (Note [Pipeline noise]). A run stopped in
// the middle and resumed from its checkpoint must draw the same noise at every later step, so its losses equal the
// uninterrupted run's bit for bit. Through the public trainer API only (run_training, a config built in code).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

// 8x8 MNIST-layout images, 64 training and 32 test samples (test::idx8_dataset).
fs::path temp_dir() { return test::scratch_dir(); }
fs::path data_dir() { return test::idx8_dataset(); }

// batch 16: 4 steps per epoch, 3 epochs; every layer's gradients through `pipeline` (a YAML flow map).
TrainerConfig make_config(const std::string& name, const std::string& model_yaml, const std::string& pipeline,
                          const std::vector<std::string>& sets) {
  const std::string yaml = fmt::format(
      "run:\n"
      "  seed: 3\n"
      "data:\n"
      "  dataset: mnist\n"
      "  root: {}\n"
      "  batch_size: 16\n"
      "  eval_batch_size: 16\n"
      "  num_workers: 0\n"
      "model: {}\n"
      "optim: {{name: adamw, lr: 3e-3, weight_decay: 0.01}}\n"
      "train:\n"
      "  epochs: 3\n"
      "  log_every: 1\n"
      "  device: cpu\n"
      "checkpoint:\n"
      "  every_steps: 3\n"
      "  keep_last: 0\n"
      "grad_pipeline:\n"
      "  default: {}\n",
      data_dir().string(), model_yaml, pipeline);
  std::vector<std::string> all = {"run.name=" + name, "run.out_dir=" + (temp_dir() / name).string()};
  all.insert(all.end(), sets.begin(), sets.end());
  return read_trainer_config(ConfigReader::from_string(yaml, "test_resume_hlq.yaml", all));
}

// The uninterrupted run, a run stopped by max_steps at `stop` and resumed from its latest checkpoint, and a run
// resumed from the uninterrupted run's step-3 checkpoint: all log the same losses, compared as exact doubles.
void check_resume(const std::string& tag, const std::string& model_yaml, int64_t stop) {
  const std::string hlq = "{name: hlq}";
  const TrainerConfig full = make_config(tag + "_full", model_yaml, hlq, {});
  REQUIRE(run_training(full).steps == 12);
  const auto ref = test::train_losses(full.run.out_dir);
  REQUIRE(ref.size() == 12);

  // The pipeline changes the losses: the quantised, noisy gradients really ran (exact gives other numbers).
  const TrainerConfig exact = make_config(tag + "_exact", model_yaml, "{name: exact}", {"train.max_steps=4"});
  REQUIRE(run_training(exact).steps == 4);
  const auto exact_losses = test::train_losses(exact.run.out_dir);
  CHECK(exact_losses.at(4) != ref.at(4));  // after three updates from other gradients

  {
    const std::string name = tag + "_part";
    const TrainerConfig part = make_config(name, model_yaml, hlq, {fmt::format("train.max_steps={}", stop)});
    REQUIRE(run_training(part).steps == stop);
    REQUIRE(io::latest_checkpoint_step(part.checkpoint.dir) == stop);
    const TrainResult r = run_training(make_config(name, model_yaml, hlq, {}), {ResumeFrom::Kind::latest, ""});
    CHECK(r.steps == 12);
    const auto got = test::train_losses(part.run.out_dir);
    REQUIRE(got.size() == 12);
    for (const auto& [step, loss] : ref) {
      INFO(tag << ": stopped at step " << stop << ", resumed; step " << step);
      CHECK(got.at(step) == loss);
    }
  }
  {
    const TrainerConfig other = make_config(tag + "_from3", model_yaml, hlq, {});
    run_training(other, {ResumeFrom::Kind::path, io::checkpoint_dir(full.checkpoint.dir, 3).string()});
    const auto got = test::train_losses(other.run.out_dir);
    for (int64_t step = 4; step <= 12; ++step) {
      INFO(tag << ": resumed from the step-3 checkpoint; step " << step);
      REQUIRE(got.count(step) == 1);
      CHECK(got.at(step) == ref.at(step));
    }
  }
}

}  // namespace

TEST_CASE("an HLQ MLP run (stochastic rounding) resumed mid-epoch repeats the uninterrupted losses bit for bit",
          "[trainer][resume][hlq]") {
  // The hidden Linear's 2-D input puts HLA on the batch axis (16 rows: n 16, r 10); the 10-class head has T 2.
  check_resume("mlp", "{name: mlp, hidden: [32]}", 5);
}

TEST_CASE("an HLQ ViT run (stochastic rounding, rebuilt inputs) resumed mid-epoch repeats the uninterrupted losses",
          "[trainer][resume][hlq]") {
  // 4 patches + the class token: 5 tokens per sample (the identity HLA plan); the patch embedding is a Conv2d
  // product, the qkv / fc1 / fc2 inputs are rebuilt in backward (acbp_rebuild), the dropout draws its own noise.
  check_resume("vit", "{name: vit, patch_size: 4, dim: 16, depth: 1, heads: 2, mlp_ratio: 2, dropout: 0.1}", 6);
}

TEST_CASE("a ViT run with drop path (per-sample masks) resumed mid-epoch repeats the uninterrupted losses",
          "[trainer][resume][hlq]") {
  // Block 1 of 2 drops each branch with p 0.3: its masks come from the checkpointed dropout generator.
  check_resume("vit_drop_path", "{name: vit, patch_size: 4, dim: 16, depth: 2, heads: 2, mlp_ratio: 2, drop_path: 0.3}",
               6);
}
