// Evaluation inside epochs and on part of a split: train.eval_every_steps evaluates after every N-th optimiser step
// (a step that ends an epoch once, at the epoch's end), a step checkpoint at such a step can become `best`, and a
// resumed run keeps the uninterrupted run's evaluations, scores and `best` (Note [Step evaluations] in
// src/train/trainer.cpp); data.train_limit / test_limit take the first rows of a language model's splits; the config
// keys, their errors and their place in the resolved config.yaml.
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/catch.h"
#include "support/lm_run_testing.h"
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
using json = nlohmann::json;

namespace {

// 8x8 MNIST-layout images, 64 train / 32 test: batch 16 gives 4 steps per epoch (test::idx8_dataset); an MLP,
// 3 epochs (12 steps), SGD at a learning rate that moves the test accuracy from evaluation to evaluation.
std::string config_path() {
  static const std::string path = [] {
    const fs::path p = test::scratch_dir() / "eval_steps.yaml";
    std::ofstream(p) << fmt::format(
        "run:\n  seed: 3\n"
        "data:\n  dataset: mnist\n  root: {}\n  batch_size: 16\n  eval_batch_size: 16\n  num_workers: 0\n"
        "model:\n  name: mlp\n  hidden: [16]\n"
        "optim:\n  lr: 0.5\n"
        "train:\n  epochs: 3\n  log_every: 1\n",
        test::idx8_dataset().string());
    return p.string();
  }();
  return path;
}

TrainerConfig config_in(const std::string& name, std::vector<std::string> sets = {}) {
  sets.push_back("run.out_dir=" + (test::scratch_dir() / name).string());
  return load_trainer_config(config_path(), sets);
}

using test::read_text;

std::vector<json> eval_records(const fs::path& out_dir) {
  std::vector<json> out;
  std::ifstream in(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    json rec = json::parse(line);
    if (rec.at("type") == "eval") out.push_back(std::move(rec));
  }
  return out;
}

std::vector<int64_t> eval_steps(const fs::path& out_dir) {
  std::vector<int64_t> out;
  for (const json& e : eval_records(out_dir)) out.push_back(e.at("step").get<int64_t>());
  return out;
}

// step -> (test loss, test top-1) of every eval record.
std::map<int64_t, std::pair<double, double>> eval_scores(const fs::path& out_dir) {
  std::map<int64_t, std::pair<double, double>> out;
  for (const json& e : eval_records(out_dir))
    out[e.at("step").get<int64_t>()] = {e.at("test_loss").get<double>(), e.at("test_acc").get<double>()};
  return out;
}

std::string pointer(const std::string& checkpoints, const char* name) {
  return fs::exists(fs::path(checkpoints) / name) ? read_text(fs::path(checkpoints) / name) : std::string("(none)");
}

json state_of(const std::string& checkpoints, int64_t step) {
  return json::parse(read_text(io::checkpoint_dir(checkpoints, step) / "state.json"));
}

// The step `best` should name: the first with the highest top-1 among the evaluated steps that `eligible` accepts.
template <typename F>
int64_t best_step_of(const fs::path& out_dir, F eligible) {
  int64_t best_step = -1;
  double best = -1.0;
  for (const auto& [step, s] : eval_scores(out_dir))
    if (eligible(step) && s.second > best) best = s.second, best_step = step;
  return best_step;
}

}  // namespace

TEST_CASE("train.eval_every_steps evaluates every N steps from the run's start; a step ending an epoch once",
          "[trainer][eval_steps]") {
  logging::set_level("off");
  // 4 steps an epoch; eval_every 2 leaves epoch 1 out, but step 4 ends it and eval_every_steps 2 evaluates it.
  const TrainerConfig c = config_in("es_every2", {"train.eval_every=2", "train.eval_every_steps=2",
                                                  "checkpoint.every_steps=2", "checkpoint.keep_last=0"});
  const TrainResult r = run_training(c);
  CHECK(r.steps == 12);
  CHECK(eval_steps(c.run.out_dir) == std::vector<int64_t>{2, 4, 6, 8, 10, 12});
  const std::vector<json> evals = eval_records(c.run.out_dir);
  for (const json& e : evals) {
    INFO(e.dump());
    const int64_t step = e.at("step").get<int64_t>();
    CHECK(e.at("epoch") == (step - 1) / 4 + 1);
    // Only an epoch's end records epoch_seconds (their sum is the run's training time).
    CHECK(e.contains("epoch_seconds") == (step % 4 == 0));
    CHECK(e.at("train_loss").is_number());
    CHECK(e.at("test_total") == test::kIdx8Test);
  }
  // The evaluation of step 2 is of the weights after step 2: its checkpoint evaluates to the same figures.
  const EvalResult at2 = run_evaluation(c, io::checkpoint_dir(c.checkpoint.dir, 2).string());
  CHECK(at2.loss == evals[0].at("test_loss").get<double>());
  CHECK(at2.count("correct") == evals[0].at("test_correct").get<int64_t>());
  // The mid-epoch record's train_loss is the mean of the epoch's steps so far: steps 1 and 2.
  std::map<int64_t, double> train_loss;
  std::ifstream in(fs::path(c.run.out_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (const json j = json::parse(line); j.at("type") == "train")
      train_loss[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  CHECK(evals[0].at("train_loss").get<double>() == Approx((train_loss.at(1) + train_loss.at(2)) / 2).epsilon(1e-12));

  SECTION("without eval_every_steps only the epochs' ends are evaluated, as eval_every says") {
    const TrainerConfig off = config_in("es_off", {"train.eval_every=2"});
    run_training(off);
    CHECK(eval_steps(off.run.out_dir) == std::vector<int64_t>{8, 12});
  }
  SECTION("a step evaluation that lands on max_steps is the stop's evaluation, once") {
    const TrainerConfig stop = config_in("es_stop", {"train.eval_every_steps=3", "train.max_steps=6"});
    CHECK(run_training(stop).steps == 6);
    CHECK(eval_steps(stop.run.out_dir) == std::vector<int64_t>{3, 4, 6});
  }
}

TEST_CASE("a step checkpoint at a step evaluation can become best; best is the best of those",
          "[trainer][eval_steps][checkpoint]") {
  logging::set_level("off");
  SECTION("every step checkpoint is evaluated") {
    const TrainerConfig c = config_in("es_best", {"train.eval_every_steps=2", "checkpoint.every_steps=2",
                                                  "checkpoint.keep_last=0"});
    run_training(c);
    const int64_t best = best_step_of(c.run.out_dir, [](int64_t s) { return s % 2 == 0; });
    INFO("evaluations: " << json(eval_scores(c.run.out_dir)).dump());
    REQUIRE(best > 0);
    CHECK(pointer(c.checkpoint.dir, "best") == fmt::format("step_{}\n", best));
    CHECK(state_of(c.checkpoint.dir, 12).at("best_checkpoint_top1").get<double>() ==
          eval_scores(c.run.out_dir).at(best).second);
  }
  SECTION("every_steps 3 and eval_every_steps 2: only the checkpoints of steps 6 and 12 are evaluated") {
    const TrainerConfig c = config_in("es_best_lcm", {"train.eval_every_steps=2", "checkpoint.every_steps=3",
                                                      "checkpoint.keep_last=0"});
    run_training(c);
    const int64_t best = best_step_of(c.run.out_dir, [](int64_t s) { return s % 6 == 0; });
    INFO("evaluations: " << json(eval_scores(c.run.out_dir)).dump());
    CHECK(pointer(c.checkpoint.dir, "best") == fmt::format("step_{}\n", best));
  }
}

TEST_CASE("a run resumed at or between step evaluations keeps the uninterrupted run's evaluations, scores and best",
          "[trainer][eval_steps][checkpoint][resume]") {
  logging::set_level("off");
  // Step evaluations at 3, 6 (mid-epoch), 9 and 12; epochs end at 4, 8, 12; checkpoints every 2 steps (6 and 12
  // can become best) and at epoch ends.
  const std::vector<std::string> sets = {"train.eval_every_steps=3", "checkpoint.every_steps=2",
                                         "checkpoint.every_epochs=1", "checkpoint.keep_last=0"};
  const TrainerConfig whole = config_in("es_whole", sets);
  run_training(whole);
  const auto scores = eval_scores(whole.run.out_dir);
  REQUIRE(eval_steps(whole.run.out_dir) == std::vector<int64_t>{3, 4, 6, 8, 9, 12});
  const json final_state = state_of(whole.checkpoint.dir, 12);
  const std::string best = pointer(whole.checkpoint.dir, "best");
  INFO("evaluations: " << json(scores).dump() << "; best " << best);
  CHECK(best != "(none)");
  // Each stop lands on an evaluated step (so the stop's evaluation is one the uninterrupted run makes as well).
  for (const int64_t k : {3, 4, 6, 9}) {
    INFO("stopped by max_steps at step " << k);
    const std::string name = fmt::format("es_split{}", k);
    std::vector<std::string> first = sets;
    first.push_back(fmt::format("train.max_steps={}", k));
    run_training(config_in(name, first));
    const TrainerConfig rest = config_in(name, sets);
    CHECK(run_training(rest, {ResumeFrom::Kind::latest, ""}).steps == 12);
    CHECK(eval_scores(rest.run.out_dir) == scores);
    CHECK(pointer(rest.checkpoint.dir, "best") == best);
    const json state = state_of(rest.checkpoint.dir, 12);
    CHECK(state.at("best_top1") == final_state.at("best_top1"));
    CHECK(state.at("best_checkpoint_top1") == final_state.at("best_checkpoint_top1"));
  }
  // A stop request between evaluations (a pending SIGTERM stops after the first step).
  const std::atomic<int> sigterm{SIGTERM};
  const TrainerConfig stopped = config_in("es_sigterm", sets);
  CHECK(run_training(stopped, {}, &sigterm).stopped_by == SIGTERM);
  CHECK(run_training(stopped, {ResumeFrom::Kind::latest, ""}).steps == 12);
  CHECK(eval_scores(stopped.run.out_dir) == scores);
  CHECK(pointer(stopped.checkpoint.dir, "best") == best);
}

TEST_CASE("eval_every_steps, train_limit and test_limit: defaults, errors with file:line, the resolved config",
          "[config][eval_steps]") {
  const TrainerConfig d = config_in("es_cfg_default");
  CHECK(d.train.eval_every_steps == 0);
  const std::string bad = test::error_of([] { config_in("es_cfg_bad", {"train.eval_every_steps=-1"}); });
  CHECK_THAT(bad, HasSubstr("--set train.eval_every_steps=-1: train.eval_every_steps: expected an integer >= 0, got -1"));
  const fs::path file = test::scratch_dir() / "es_cfg_bad.yaml";
  std::ofstream(file) << "train:\n  eval_every_steps: 1.5\n";
  CHECK_THAT(test::error_of([&] { load_trainer_config(file.string()); }),
             HasSubstr(file.string() + ":2:21: train.eval_every_steps: expected an integer"));
  // The same in the resolved config of an image run, which records the default.
  CHECK_THAT(d.resolved_yaml, HasSubstr("eval_every_steps: 0"));

  // Language-model data takes the limits (rows); a negative one is an error naming the key and its line.
  const TrainerConfig lm = test::tiny_lm_run(test::scratch_dir() / "es_cfg_lm",
                                             {"data.train_limit=8", "data.test_limit=2", "train.eval_every_steps=2"});
  CHECK(lm.data.train_limit == 8);
  CHECK(lm.data.test_limit == 2);
  // The resolved config.yaml holds them and reads back to the same values.
  const TrainerConfig again = read_trainer_config(ConfigReader::from_string(lm.resolved_yaml, "config.yaml"));
  CHECK(again.data.train_limit == 8);
  CHECK(again.data.test_limit == 2);
  CHECK(again.train.eval_every_steps == 2);
  CHECK_THAT(lm.resolved_yaml, HasSubstr("test_limit: 2"));
  CHECK_THAT(lm.resolved_yaml, HasSubstr("eval_every_steps: 2"));
  CHECK_THAT(test::error_of([] { test::tiny_lm_run(test::scratch_dir() / "es_cfg_lm", {"data.test_limit=-3"}); }),
             HasSubstr("--set data.test_limit=-3: data.test_limit: expected an integer >= 0, got -3"));
  const fs::path chat = test::scratch_dir() / "es_chat.yaml";
  std::ofstream(chat) << "data:\n  dataset: chat\n  paths: [x.jsonl]\n  tokenizer: t.model\n  test_limit: -1\n"
                         "model:\n  name: llama\n";
  CHECK_THAT(test::error_of([&] { load_trainer_config(chat.string()); }),
             HasSubstr(chat.string() + ":5:15: data.test_limit: expected an integer >= 0, got -1"));
}

TEST_CASE("data.train_limit and test_limit take a language model's first rows; step evaluations of an LM run",
          "[lm_train][eval_steps]") {
  logging::set_level("off");
  const fs::path out = test::scratch_dir() / "es_lm";
  const Datasets all = make_datasets(test::tiny_lm_run(out));
  const Datasets cut = make_datasets(test::tiny_lm_run(out, {"data.train_limit=5", "data.test_limit=2"}));
  REQUIRE(all.text_train->size() > 5);
  REQUIRE(all.text_test->size() > 2);
  CHECK(cut.text_train->size() == 5);
  CHECK(cut.text_test->size() == 2);
  const int64_t T = all.text_test->seq_len();
  for (const auto& [whole, part] : {std::pair{all.text_train, cut.text_train}, std::pair{all.text_test, cut.text_test}})
    for (int64_t i = 0; i < part->size(); ++i) {
      std::vector<int64_t> a(2 * T), b(2 * T);
      whole->get(i, a.data(), a.data() + T);
      part->get(i, b.data(), b.data() + T);
      CHECK(a == b);
    }
  // A limit above the split's size keeps every row.
  CHECK(make_datasets(test::tiny_lm_run(out, {"data.test_limit=100000"})).text_test->size() == all.text_test->size());

  // The run: 5 rows of batch 4 are 2 steps an epoch; 3 epochs; evaluations at every 2nd step, of 2 rows.
  const TrainerConfig c = test::tiny_lm_run(out, {"data.train_limit=5", "data.test_limit=2", "train.epochs=3",
                                                  "train.max_steps=0", "train.eval_every_steps=3"});
  const TrainResult r = run_training(c);
  CHECK(r.steps == 6);
  // Step 3 is inside epoch 2; 2, 4 and 6 end epochs (eval_every 1), 6 once.
  CHECK(eval_steps(c.run.out_dir) == std::vector<int64_t>{2, 3, 4, 6});
  for (const json& e : eval_records(c.run.out_dir)) {
    INFO(e.dump());
    CHECK(e.at("test_tokens") == 2 * T);  // two packed windows, every label counted
    CHECK(e.at("test_ppl").is_number());
  }
}
