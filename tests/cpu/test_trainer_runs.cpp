// Run folders that do not lose work (docs/checkpoints.md, "What a training run guarantees"): a saved
// config.yaml re-run with another run.out_dir writes only into the new folder; a resumed run that has nothing
// left to train says so and evaluates the checkpoint instead of reporting an empty evaluation; a failed
// --resume leaves no new folder and does not rewrite config.yaml; a stop request finishes the step,
// checkpoints and returns (with the run's last step, the run ends as it would have); `best` names the best of the
// evaluated epoch checkpoints, also across a max_steps stop at an epoch's end; a diverged run's error names the step; no checkpoint with non-finite weights is
// written or evaluated; an unusable checkpoint.dir is reported before the first step; a resume under another
// run.seed or optim.name than the checkpoint's, or with a negative count in state.json, is refused; a new run in a folder that holds a run warns.
#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"
#include "train/trainer_setup.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

// 8x8 MNIST-layout images, 64 train / 32 test: batch 16 gives 4 steps per epoch (test::idx8_dataset).
fs::path temp_dir() { return test::scratch_dir(); }
fs::path data_dir() { return test::idx8_dataset(); }

// The config file of these tests (written once); each run picks its folder and settings with --set.
std::string config_path() {
  static const std::string path = [] {
    const fs::path p = temp_dir() / "runs_test.yaml";
    std::ofstream(p) << fmt::format(
        "run:\n  seed: 3\n"
        "data:\n  dataset: mnist\n  root: {}\n  batch_size: 16\n  eval_batch_size: 16\n  num_workers: 0\n"
        "model:\n  name: mlp\n  hidden: [16]\n"
        "train:\n  epochs: 2\n  log_every: 1\n"
        "checkpoint:\n  every_steps: 2\n  keep_last: 1\n",
        data_dir().string());
    return p.string();
  }();
  return path;
}

TrainerConfig config_in(const std::string& name, std::vector<std::string> sets = {}) {
  sets.push_back("run.out_dir=" + (temp_dir() / name).string());
  return load_trainer_config(config_path(), sets);
}

using test::read_text;

}  // namespace

TEST_CASE("a saved config.yaml re-run with another run.out_dir writes only into the new folder",
          "[trainer][checkpoint]") {
  logging::set_level("warn");
  const TrainerConfig a = config_in("relocate_a", {"train.max_steps=2"});
  run_training(a);
  const fs::path a_ck = temp_dir() / "relocate_a" / "checkpoints";
  REQUIRE(io::list_checkpoints(a_ck) == std::vector<int64_t>{2});

  // The checkpoint folder derived from run.out_dir stays derived in the saved config.
  const std::string b_dir = (temp_dir() / "relocate_b").string();
  const TrainerConfig b =
      load_trainer_config((temp_dir() / "relocate_a" / "config.yaml").string(), {"run.out_dir=" + b_dir});
  CHECK(fs::path(b.checkpoint.dir) == fs::path(b_dir) / "checkpoints");
  // B runs further than A (steps 2 and 4 are written, keep_last 1 would prune A's step_2 if it shared A's folder).
  run_training(load_trainer_config((temp_dir() / "relocate_a" / "config.yaml").string(),
                                   {"run.out_dir=" + b_dir, "train.max_steps=4"}));
  CHECK(io::list_checkpoints(a_ck) == std::vector<int64_t>{2});
  CHECK(io::latest_checkpoint_step(a_ck) == 2);
  CHECK(io::list_checkpoints(fs::path(b_dir) / "checkpoints") == std::vector<int64_t>{4});

  // An explicit checkpoint.dir is kept as given.
  const TrainerConfig c = config_in("relocate_c", {"checkpoint.dir=" + (temp_dir() / "elsewhere").string()});
  CHECK(fs::path(c.checkpoint.dir) == temp_dir() / "elsewhere");
}

TEST_CASE("resuming a run that has nothing left to train evaluates the checkpoint and writes nothing",
          "[trainer][checkpoint]") {
  logging::set_level("warn");
  const TrainerConfig full = config_in("complete");  // 2 epochs of 4 steps, checkpoints every 2 steps
  const TrainResult done = run_training(full);
  REQUIRE(done.steps == 8);
  REQUIRE(done.last_eval.total == 32);
  const fs::path out = temp_dir() / "complete";
  const std::string metrics = read_text(out / "metrics.jsonl");
  const std::string config = read_text(out / "config.yaml");

  // The finished run resumed as it was, with fewer epochs, and with a max_steps below its step.
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {}, {"train.epochs=1"}, {"train.max_steps=6"}, {"train.max_steps=8", "optim.lr=0.5"}}) {
    const TrainResult again = run_training(config_in("complete", sets), {ResumeFrom::Kind::latest, ""});
    CHECK(again.already_complete);
    CHECK(again.steps == 8);
    CHECK(again.checkpoint == io::checkpoint_dir(full.checkpoint.dir, 8).string());
    // The checkpoint's weights evaluated: the finished run's final figures.
    CHECK(again.last_eval.total == done.last_eval.total);
    CHECK(again.last_eval.number("acc") == done.last_eval.number("acc"));
    CHECK(again.last_eval.loss == done.last_eval.loss);
    CHECK(read_text(out / "metrics.jsonl") == metrics);
    CHECK(read_text(out / "config.yaml") == config);
  }
}

TEST_CASE("resuming a run stopped during its final evaluation records that evaluation", "[trainer][checkpoint]") {
  logging::set_level("warn");
  const TrainerConfig full = config_in("final_eval_killed");  // 2 epochs of 4 steps, checkpoints every 2 steps
  run_training(full);
  const fs::path metrics = temp_dir() / "final_eval_killed" / "metrics.jsonl";
  std::string text = read_text(metrics);
  // The state a kill during the final evaluation leaves: the last step's checkpoint, no record of the evaluation.
  REQUIRE(text.size() > 1);
  const std::size_t last = text.rfind('\n', text.size() - 2) + 1;
  const nlohmann::json final_eval = nlohmann::json::parse(text.substr(last));
  REQUIRE(final_eval["type"] == "eval");
  REQUIRE(final_eval["step"] == 8);
  REQUIRE(final_eval["train_loss"].is_number());
  REQUIRE(final_eval["test_acc"].is_number());
  text.resize(last);
  std::ofstream(metrics, std::ios::binary | std::ios::trunc) << text;

  CHECK(run_training(config_in("final_eval_killed"), {ResumeFrom::Kind::latest, ""}).already_complete);
  const std::string after = read_text(metrics);
  REQUIRE(after.substr(0, last) == text);
  const nlohmann::json added = nlohmann::json::parse(after.substr(last));
  for (const char* key : {"type", "step", "epoch", "train_loss", "test_loss", "test_acc"}) {
    INFO(key);
    CHECK(added[key] == final_eval[key]);
  }
  // Recorded once: a second resume finds it and writes nothing.
  run_training(config_in("final_eval_killed"), {ResumeFrom::Kind::latest, ""});
  CHECK(read_text(metrics) == after);
}

// SGD without momentum keeps no optimiser state: its checkpoints hold an optimizer.safetensors without tensors,
// and a resume from one continues to the uninterrupted run's result.
TEST_CASE("a run whose optimiser keeps no state resumes to the uninterrupted run's result", "[trainer][checkpoint]") {
  logging::set_level("warn");
  const TrainResult whole = run_training(config_in("stateless_whole", {"optim.momentum=0", "train.max_steps=4"}));
  REQUIRE(whole.steps == 4);
  const TrainerConfig first = config_in("stateless", {"optim.momentum=0", "train.max_steps=2"});
  run_training(first);
  const io::Checkpoint ck = io::load_checkpoint_dir(io::checkpoint_dir(first.checkpoint.dir, 2));
  REQUIRE(ck.optimizer.has_value());
  CHECK(ck.optimizer->tensors.empty());
  const TrainResult resumed =
      run_training(config_in("stateless", {"optim.momentum=0", "train.max_steps=4"}), {ResumeFrom::Kind::latest, ""});
  CHECK(resumed.steps == 4);
  CHECK(resumed.last_eval.loss == whole.last_eval.loss);
}

// A state.json written by another program or edited by hand: the error names the file and the key, not a JSON
// library's exception.
TEST_CASE("a resume from a state.json with a missing or mistyped key names the file and the key",
          "[trainer][checkpoint][errors]") {
  logging::set_level("warn");
  const TrainerConfig cfg = config_in("bad_state", {"train.max_steps=2"});
  run_training(cfg);
  const fs::path state = io::checkpoint_dir(cfg.checkpoint.dir, 2) / "state.json";
  const nlohmann::json good = nlohmann::json::parse(read_text(state));
  auto resume_with = [&](nlohmann::json j) {
    std::ofstream(state) << j.dump();
    return test::error_of([&] {
      run_training(config_in("bad_state", {"train.max_steps=4"}), {ResumeFrom::Kind::latest, ""});
    });
  };
  nlohmann::json j = good;
  j.erase("step");
  CHECK_THAT(resume_with(j), HasSubstr("--resume: " + state.string() + " has no \"step\""));
  j = good;
  j["epoch"] = "zero";
  CHECK_THAT(resume_with(j), HasSubstr(state.string() + ": \"epoch\" is \"zero\", expected an integer"));
  j = good;
  j["seed"] = -3;
  CHECK_THAT(resume_with(j), HasSubstr("\"seed\" is -3, expected a non-negative integer"));
  // A negative count is refused before anything is written: metrics.jsonl keeps the records of steps 1 and 2.
  const fs::path metrics = fs::path(cfg.run.out_dir) / "metrics.jsonl";
  const std::string records = read_text(metrics);
  for (const char* key : {"step", "epoch", "batch", "optimizer_steps"}) {
    j = good;
    j[key] = -4;
    CHECK_THAT(resume_with(j), HasSubstr(state.string() + ": \"" + key + "\" is -4, expected an integer >= 0"));
    CHECK(read_text(metrics) == records);
  }
  CHECK(resume_with(good).empty());
}

TEST_CASE("a resume under another optimiser than the checkpoint's is an error naming both", "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  run_training(config_in("optim_resume", {"train.max_steps=2", "optim.momentum=0.9"}));
  const std::string err = test::error_of([] {
    run_training(config_in("optim_resume", {"optim.name=adamw"}), {ResumeFrom::Kind::latest, ""});
  });
  INFO(err);
  CHECK_THAT(err, HasSubstr("was written with optim.name sgd, but the config has optim.name adamw"));
  CHECK_THAT(err, HasSubstr((temp_dir() / "optim_resume" / "checkpoints" / "step_2").string()));
  CHECK(run_training(config_in("optim_resume", {"optim.momentum=0.9"}), {ResumeFrom::Kind::latest, ""}).steps == 8);
}

TEST_CASE("a resume under another data.batch_size than the checkpoint's is an error naming both",
          "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  run_training(config_in("batch_resume", {"train.max_steps=3", "checkpoint.every_steps=3"}));
  const std::string err = test::error_of([] {
    run_training(config_in("batch_resume", {"data.batch_size=8"}), {ResumeFrom::Kind::latest, ""});
  });
  CHECK_THAT(err, HasSubstr("was written with data.batch_size 16, but the config has data.batch_size 8"));
  CHECK(run_training(config_in("batch_resume"), {ResumeFrom::Kind::latest, ""}).steps == 8);
}

TEST_CASE("a resume on training data with another number of rows is an error naming both counts",
          "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  run_training(config_in("rows_resume", {"train.max_steps=3", "checkpoint.every_steps=3"}));
  const std::string err = test::error_of([] {
    run_training(config_in("rows_resume", {"data.train_limit=48"}), {ResumeFrom::Kind::latest, ""});
  });
  CHECK_THAT(err, HasSubstr("was written training on 64 rows, but this config's training data has 48"));
  CHECK_THAT(err, HasSubstr((temp_dir() / "rows_resume" / "checkpoints" / "step_3").string()));
  CHECK(run_training(config_in("rows_resume"), {ResumeFrom::Kind::latest, ""}).steps == 8);
}

TEST_CASE("a resume under other trained parameters than the checkpoint's is an error naming them",
          "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  // Biases frozen, then trained on resume: they have no AdamW moments, and the run's step count would scale their
  // first updates up.
  run_training(config_in("freeze_resume", {"train.max_steps=2", "optim.name=adamw", "train.freeze=['*.bias']"}));
  const std::string more = test::error_of([] {
    run_training(config_in("freeze_resume", {"optim.name=adamw"}), {ResumeFrom::Kind::latest, ""});
  });
  CHECK_THAT(more, HasSubstr("--resume: 2 parameter(s) train under this config that the checkpoint "));
  CHECK_THAT(more, HasSubstr(".bias'): they have no optimiser state, and adamw would start theirs at the run's step 2"));
  // Trained, then frozen on resume: their state would be dropped.
  run_training(config_in("unfreeze_resume", {"train.max_steps=2", "optim.name=adamw"}));
  const std::string fewer = test::error_of([] {
    run_training(config_in("unfreeze_resume", {"optim.name=adamw", "train.freeze=['*.bias']"}),
                 {ResumeFrom::Kind::latest, ""});
  });
  CHECK_THAT(fewer, HasSubstr("--resume: 2 parameter(s) the checkpoint "));
  CHECK_THAT(fewer, HasSubstr("are frozen under this config"));
  CHECK(run_training(config_in("freeze_resume", {"optim.name=adamw", "train.freeze=['*.bias']"}),
                     {ResumeFrom::Kind::latest, ""})
            .steps == 8);
}

TEST_CASE("a failed resume leaves no new folder and does not rewrite config.yaml", "[trainer][checkpoint]") {
  logging::set_level("warn");
  const fs::path fresh = temp_dir() / "failed_resume_fresh";
  CHECK_THROWS(run_training(config_in("failed_resume_fresh"), {ResumeFrom::Kind::latest, ""}));
  CHECK_THROWS(run_training(config_in("failed_resume_fresh"),
                            {ResumeFrom::Kind::path, (temp_dir() / "no_such_step").string()}));
  CHECK_FALSE(fs::exists(fresh));

  const TrainerConfig ran = config_in("failed_resume_ran", {"train.max_steps=2", "checkpoint.every_steps=0"});
  run_training(ran);  // no checkpoints: a resume of it has nothing to load
  const fs::path out = temp_dir() / "failed_resume_ran";
  const std::string config = read_text(out / "config.yaml");
  CHECK_THROWS(run_training(config_in("failed_resume_ran", {"optim.lr=0.5", "checkpoint.every_steps=0"}),
                            {ResumeFrom::Kind::latest, ""}));
  CHECK(read_text(out / "config.yaml") == config);
}

TEST_CASE("a new run in a folder that holds a run's metrics or checkpoints warns, naming the folder",
          "[trainer][checkpoint]") {
  const fs::path out = temp_dir() / "rerun";
  std::string first, second;
  {
    const test::LogCapture capture(SPDLOG_LEVEL_WARN);
    run_training(config_in("rerun", {"train.max_steps=2"}));
    first = capture.str();
    run_training(config_in("rerun", {"train.max_steps=2"}));
    second = capture.str().substr(first.size());
  }
  INFO(second);
  CHECK(first.find("already holds a run") == std::string::npos);
  CHECK(second.find(out.string() + " already holds a run (metrics.jsonl and checkpoints)") != std::string::npos);
  CHECK(second.find("re-point latest and best") != std::string::npos);
}

TEST_CASE("a resume whose run.seed differs from the checkpoint's is an error naming both seeds",
          "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  run_training(config_in("seed_resume", {"train.max_steps=2"}));
  const std::string err = test::error_of(
      [] { run_training(config_in("seed_resume", {"run.seed=4"}), {ResumeFrom::Kind::latest, ""}); });
  INFO(err);
  CHECK(err.find("was written with run.seed 3, but the config has run.seed 4") != std::string::npos);
  CHECK(err.find((temp_dir() / "seed_resume" / "checkpoints" / "step_2").string()) != std::string::npos);
  // The same seed resumes.
  CHECK(run_training(config_in("seed_resume"), {ResumeFrom::Kind::latest, ""}).steps == 8);
}

TEST_CASE("a stop request finishes the step, checkpoints it, and the resumed run ends as the uninterrupted one",
          "[trainer][checkpoint]") {
  logging::set_level("warn");
  const TrainResult whole = run_training(config_in("stop_whole", {"checkpoint.every_steps=0",
                                                                  "checkpoint.every_epochs=1"}));
  // A request already pending when the run starts stops it after its first step.
  const std::atomic<int> sigterm{SIGTERM};
  const TrainerConfig cfg = config_in("stop_part", {"checkpoint.every_steps=0", "checkpoint.every_epochs=1"});
  const TrainResult stopped = run_training(cfg, {}, &sigterm);
  CHECK(stopped.stopped_by == SIGTERM);
  CHECK(stopped.steps == 1);
  CHECK(stopped.last_eval.total == 0);  // no evaluation at a stop
  CHECK(stopped.checkpoint == io::checkpoint_dir(cfg.checkpoint.dir, 1).string());
  CHECK(io::list_checkpoints(cfg.checkpoint.dir) == std::vector<int64_t>{1});
  for (const auto& e : fs::directory_iterator(cfg.checkpoint.dir))  // no temporaries left
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);

  const std::atomic<int> none{0};
  const TrainResult resumed = run_training(cfg, {ResumeFrom::Kind::latest, ""}, &none);
  CHECK(resumed.stopped_by == 0);
  CHECK(resumed.steps == whole.steps);
  CHECK(resumed.last_eval.number("acc") == whole.last_eval.number("acc"));
  CHECK(resumed.last_eval.loss == whole.last_eval.loss);

  // Without checkpointing the stop saves nothing and says so through an empty checkpoint.
  const TrainResult unsaved = run_training(config_in("stop_unsaved", {"checkpoint.every_steps=0"}), {}, &sigterm);
  CHECK(unsaved.stopped_by == SIGTERM);
  CHECK(unsaved.checkpoint.empty());
  CHECK_FALSE(fs::exists(temp_dir() / "stop_unsaved" / "checkpoints"));
}

TEST_CASE("a diverged run names the step and says NaN or infinity, not '-nan' or 'between steps 3 and 3'",
          "[trainer][errors]") {
  logging::set_level("off");
  const std::string err =
      test::error_of([] { run_training(config_in("diverged", {"optim.lr=1e30", "checkpoint.every_steps=0"})); });
  INFO(err);
  CHECK(err.find("training diverged at step ") != std::string::npos);
  CHECK((err.find("the loss is NaN") != std::string::npos || err.find("infinity") != std::string::npos));
  CHECK(err.find("nan") == std::string::npos);
  CHECK(err.find("between") == std::string::npos);

  // Between log points (log_every 4) the run stops at the step that went bad, before the checkpoint due at
  // step 3 is written, and names that step.
  const TrainerConfig cfg = config_in("diverged_early", {"optim.lr=1e30", "checkpoint.every_steps=3", "train.log_every=4"});
  const std::string early = test::error_of([&] { run_training(cfg); });
  INFO(early);
  CHECK(early.find("training diverged at step 2 (epoch 1): the loss is ") != std::string::npos);
  CHECK(early.find("training stopped and no checkpoint of step 2 or later was written (no checkpoint was written in " +
                   cfg.checkpoint.dir + ")") != std::string::npos);
  CHECK(io::list_checkpoints(cfg.checkpoint.dir).empty());
  // The metrics end with the last good step's record.
  const std::string metrics = read_text(temp_dir() / "diverged_early" / "metrics.jsonl");
  CHECK(metrics.find("\"step\": 1,") != std::string::npos);
  CHECK(metrics.find("\"step\": 2,") == std::string::npos);
}

TEST_CASE("no checkpoint with non-finite weights is written, and eval refuses one", "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  // lr 1e300 (infinite in f32): step 1's loss is finite, the weights after it are not. Its checkpoint is refused.
  const TrainerConfig blown = config_in("nonfinite_save", {"optim.lr=1e300", "checkpoint.every_steps=1",
                                                           "train.log_every=100"});
  const std::string err = test::error_of([&] { run_training(blown); });
  INFO(err);
  CHECK(err.find("the checkpoint of step 1 was not written: the model's tensor '") != std::string::npos);
  CHECK((err.find("' holds NaN") != std::string::npos || err.find("infinity") != std::string::npos));
  CHECK(io::list_checkpoints(blown.checkpoint.dir).empty());

  // A checkpoint whose weights hold a NaN (written here by hand) is refused by eval, naming it and the tensor.
  const TrainerConfig cfg = config_in("nonfinite_eval", {"train.max_steps=2"});
  run_training(cfg);
  io::Checkpoint ck = io::load_checkpoint_dir(io::checkpoint_dir(cfg.checkpoint.dir, 2));
  auto& [name, t] = *ck.model.tensors.begin();
  REQUIRE(t.dtype() == DType::f32);
  t.data<float>()[t.numel() - 1] = std::nanf("");
  io::CheckpointData d;
  d.step = 2;
  for (const auto& [n, v] : ck.model.tensors) d.model.emplace_back(n, v);
  const fs::path nan_root = temp_dir() / "nonfinite_eval_nan";
  io::save_checkpoint(nan_root, d, {});
  CHECK_NOTHROW(run_evaluation(cfg, cfg.checkpoint.dir));
  const std::string eval_err = test::error_of([&] { run_evaluation(cfg, nan_root.string()); });
  INFO(eval_err);
  CHECK(eval_err.find(io::checkpoint_dir(nan_root, 2).string() + " cannot be evaluated: its model tensor '" + name +
                      "' holds NaN") != std::string::npos);
}

TEST_CASE("an unusable checkpoint.dir is reported before the first step", "[trainer][checkpoint][errors]") {
  logging::set_level("off");
  const fs::path file = temp_dir() / "a_regular_file";
  std::ofstream(file) << "not a folder\n";
  const fs::path bad = file / "checkpoints";
  const std::string err = test::error_of(
      [&] { run_training(config_in("bad_checkpoint_dir", {"checkpoint.dir=" + bad.string()})); });
  INFO(err);
  CHECK(err.find("checkpoint.dir: cannot create " + bad.string()) != std::string::npos);
  CHECK_FALSE(fs::exists(temp_dir() / "bad_checkpoint_dir"));  // no step ran, no metrics were written

  // Without checkpointing the folder is not used, so it is not checked.
  CHECK_NOTHROW(run_training(config_in("bad_checkpoint_dir_off", {"checkpoint.dir=" + bad.string(),
                                                                  "checkpoint.every_steps=0", "train.max_steps=1"})));
}

TEST_CASE("data.repeated_augmentation trains on repeated rows and resumes mid-epoch to the same losses",
          "[trainer][checkpoint]") {
  logging::set_level("warn");
  // 64 samples (below 256: epochs keep 64 rows), each image twice in a row: 4 steps per epoch, 32 distinct images.
  const std::vector<std::string> ra = {"data.repeated_augmentation=2"};
  const TrainerConfig whole_cfg = config_in("ra_whole", ra);
  const TrainResult whole = run_training(whole_cfg);
  CHECK(whole.steps == 8);
  const auto ref = test::train_losses(whole_cfg.run.out_dir);
  run_training(config_in("ra_off"));
  CHECK(test::train_losses(temp_dir() / "ra_off").at(2) != ref.at(2));  // other rows from the second batch on
  std::vector<std::string> part = ra;
  part.push_back("train.max_steps=3");
  run_training(config_in("ra_part", part));
  run_training(config_in("ra_part", ra), {ResumeFrom::Kind::latest, ""});
  const auto got = test::train_losses(temp_dir() / "ra_part");
  REQUIRE(got.size() == ref.size());
  for (const auto& [step, loss] : ref) {
    INFO("step " << step);
    CHECK(got.at(step) == loss);
  }
  CHECK_THAT(test::error_of([] { config_in("ra_bad", {"data.repeated_augmentation=0"}); }),
             HasSubstr("data.repeated_augmentation"));
}

TEST_CASE("optim.layer_decay scales each ViT layer's learning rate by decay^(depth + 1 - layer), times lr_multipliers",
          "[trainer][optim]") {
  auto vit_config = [](std::vector<std::string> sets) {
    const std::string yaml = fmt::format(
        "data: {{dataset: mnist, root: {}, batch_size: 16, num_workers: 0}}\n"
        "model: {{name: vit, patch_size: 4, dim: 16, depth: 2, heads: 2, mlp_ratio: 2}}\n"
        "optim: {{name: adamw, lr_multipliers: {{\"head.*\": 3}}}}\n",
        data_dir().string());
    sets.push_back("run.out_dir=" + (temp_dir() / "layer_decay").string());
    return read_trainer_config(ConfigReader::from_string(yaml, "layer_decay.yaml", sets));
  };
  const TrainerConfig cfg = vit_config({"optim.layer_decay=0.5"});
  const Datasets ds = make_datasets(cfg);
  Generator gen(1);
  auto model = make_model(cfg, ds, gen, std::make_shared<Generator>(2), {.weights = InitWeights::read});
  const auto opt = make_optimizer(cfg, *model);
  int checked = 0;
  for (const nn::ParamRef& p : opt->store().params()) {
    INFO(p.name);
    const double expect = p.name.rfind("head.", 0) == 0       ? 3.0    // layer 3: decay^0, times the multiplier
                          : p.name.rfind("norm.", 0) == 0     ? 1.0
                          : p.name.rfind("blocks.1.", 0) == 0 ? 0.5    // layer 2
                          : p.name.rfind("blocks.0.", 0) == 0 ? 0.25   // layer 1
                                                              : 0.125;  // the stem, layer 0
    CHECK(p.lr_scale == expect);
    ++checked;
  }
  CHECK(checked == static_cast<int>(model->named_parameters().size()));
  CHECK_THAT(test::error_of([] { config_in("layer_decay_bad", {"optim.layer_decay=0.5"}); }),
             HasSubstr("optim.layer_decay: layer-wise decay is defined for model.name vit"));
  CHECK_THAT(test::error_of([&] { vit_config({"optim.layer_decay=0"}); }), HasSubstr("optim.layer_decay"));
}

TEST_CASE("train.label_smoothing with data.mix is an error: the mix's soft targets carry their own smoothing",
          "[trainer][config]") {
  CHECK_THAT(test::error_of([] {
               config_in("ls_mix", {"train.label_smoothing=0.1", "data.mix.mixup_alpha=0.8"});
             }),
             HasSubstr("train.label_smoothing: data.mix is on, and its soft targets are smoothed by "
                       "data.mix.label_smoothing instead"));
  CHECK(test::error_of([] { config_in("ls_mix", {"data.mix.mixup_alpha=0.8"}); }).empty());
  CHECK(test::error_of([] { config_in("ls_mix", {"train.label_smoothing=0.1"}); }).empty());
}

namespace {

// step -> test_acc (top-1) of the eval records of <out_dir>/metrics.jsonl.
std::map<int64_t, double> eval_top1(const fs::path& out_dir) {
  std::map<int64_t, double> out;
  std::ifstream in(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto rec = nlohmann::json::parse(line);
    if (rec.at("type") == "eval") out[rec.at("step").get<int64_t>()] = rec.at("test_acc").get<double>();
  }
  return out;
}

std::string pointer(const fs::path& checkpoints, const char* name) {
  return fs::exists(checkpoints / name) ? read_text(checkpoints / name) : std::string("(none)");
}

}  // namespace

TEST_CASE("best names the epoch checkpoint with the best score among the evaluations that have one",
          "[trainer][checkpoint]") {
  logging::set_level("off");
  // Every epoch evaluated, every third one checkpointed: the other epochs' scores must not decide `best` (here
  // epoch 4 scores as high as epoch 6 and higher than epoch 3, so epoch 6's checkpoint is `best` only if epoch 4's
  // evaluation, which has no checkpoint, does not count).
  const TrainerConfig cfg = config_in("best_of_saved", {"train.epochs=6", "checkpoint.every_steps=0",
                                                        "checkpoint.every_epochs=3", "checkpoint.keep_last=0",
                                                        "optim.lr=0.5"});
  run_training(cfg);
  const auto top1 = eval_top1(cfg.run.out_dir);
  REQUIRE(top1.size() == 6);
  int64_t best_step = -1;
  double best = -1;
  std::string scores;
  for (const auto& [step, score] : top1) {
    scores += fmt::format(" {}:{}", step, score);
    if (step % 12 == 0 && score > best) best = score, best_step = step;  // 4 steps an epoch: epochs 3 and 6
  }
  INFO("top-1 per step:" << scores);
  CHECK(top1.at(16) >= top1.at(24));  // the case this test is for (a change of the run's numbers may need new settings)
  CHECK(top1.at(16) > top1.at(12));
  CHECK(pointer(cfg.checkpoint.dir, "best") == fmt::format("step_{}\n", best_step));
}

TEST_CASE("a max_steps stop at an epoch's end keeps that epoch's evaluation in its checkpoint and best",
          "[trainer][checkpoint]") {
  logging::set_level("off");
  const std::vector<std::string> sets = {"train.epochs=3", "checkpoint.every_steps=0", "checkpoint.every_epochs=1",
                                         "checkpoint.keep_last=0"};
  const TrainerConfig whole = config_in("stop_at_epoch_whole", sets);
  run_training(whole);
  std::vector<std::string> first = sets;
  first.push_back("train.max_steps=4");  // the first epoch's last step
  const TrainerConfig split = config_in("stop_at_epoch_split", first);
  run_training(split);
  // The stop's checkpoint holds the epoch's score and is `best`, as the uninterrupted run's epoch checkpoint is.
  CHECK(pointer(split.checkpoint.dir, "best") == "step_4\n");
  const auto state = nlohmann::json::parse(read_text(io::checkpoint_dir(split.checkpoint.dir, 4) / "state.json"));
  const auto whole_state = nlohmann::json::parse(read_text(io::checkpoint_dir(whole.checkpoint.dir, 4) / "state.json"));
  CHECK(state.at("best_top1") == whole_state.at("best_top1"));
  CHECK(state.at("best_checkpoint_top1") == whole_state.at("best_checkpoint_top1"));
  run_training(config_in("stop_at_epoch_split", sets), {ResumeFrom::Kind::latest, ""});
  CHECK(pointer(split.checkpoint.dir, "best") == pointer(whole.checkpoint.dir, "best"));
  CHECK(eval_top1(split.run.out_dir) == eval_top1(whole.run.out_dir));
  // eval and --resume take the pointer files as init_from does.
  const fs::path best = fs::path(whole.checkpoint.dir) / "best";
  const std::string best_dir = (fs::path(whole.checkpoint.dir) / read_text(best).substr(0, read_text(best).size() - 1)).string();
  CHECK(run_evaluation(whole, best.string(), false).loss == run_evaluation(whole, best_dir, false).loss);
  const TrainResult again = run_training(config_in("stop_at_epoch_whole", sets), {ResumeFrom::Kind::path, best.string()});
  CHECK(again.steps == 12);
}

TEST_CASE("a stop request that comes with the run's last step lets the run end with its evaluation",
          "[trainer][checkpoint]") {
  logging::set_level("off");
  const std::atomic<int> sigterm{SIGTERM};
  const TrainerConfig cfg = config_in("stop_at_last_step", {"train.epochs=1", "train.max_steps=0",
                                                            "checkpoint.every_steps=0", "checkpoint.every_epochs=1",
                                                            "data.train_limit=16"});  // one step in all
  const TrainResult r = run_training(cfg, {}, &sigterm);
  CHECK(r.stopped_by == 0);
  CHECK(r.steps == 1);
  CHECK(r.last_eval.total > 0);
  CHECK(eval_top1(cfg.run.out_dir).size() == 1);
  CHECK(io::list_checkpoints(cfg.checkpoint.dir) == std::vector<int64_t>{1});
}

TEST_CASE("a train record averages every step since the one before, across epochs and across a resume",
          "[trainer][checkpoint]") {
  logging::set_level("off");
  // 4 steps an epoch, a record every 3 steps: the record at step 6 spans the epochs' seam (steps 4, 5, 6).
  const std::vector<std::string> sets = {"train.log_every=3", "checkpoint.every_steps=0", "checkpoint.every_epochs=0"};
  run_training(config_in("window_each", {"train.log_every=1", "checkpoint.every_steps=0"}));
  const auto each = test::train_losses(temp_dir() / "window_each");
  run_training(config_in("window_whole", sets));
  const auto whole = test::train_losses(temp_dir() / "window_whole");
  REQUIRE(whole.count(6) == 1);
  const double mean = (each.at(4) + each.at(5) + each.at(6)) / 3.0;
  CHECK(std::abs(whole.at(6) - mean) <= 1e-12 * std::abs(mean));
  CHECK(std::abs(whole.at(3) - (each.at(2) + each.at(3)) / 2.0) <= 1e-12 * std::abs(whole.at(3)));
  // Split at step 5, inside that window: the resumed run's records are the uninterrupted run's.
  std::vector<std::string> first = sets;
  first.push_back("train.max_steps=5");
  first.push_back("checkpoint.every_steps=5");
  run_training(config_in("window_split", first));
  run_training(config_in("window_split", sets), {ResumeFrom::Kind::latest, ""});
  CHECK(test::train_losses(temp_dir() / "window_split") == whole);
}
