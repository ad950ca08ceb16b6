// The trainer (train::run_training / run_evaluation) on small synthetic datasets: exact resume (the losses
// of a resumed run equal the uninterrupted run's bit for bit, for optimiser state, schedule, dropout and
// augmentation), max_steps, eval_every, top-1/top-5, the best-checkpoint pointer, evaluation of a saved
// checkpoint, the image-classification task on its own, and the trainer-specific config errors with their
// file:line: key messages.
#include <unistd.h>

#include <cmath>
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
#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/image_classification.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;
using json = nlohmann::json;

using ht::test::error_of;

namespace {

// The run folders and a small MNIST-layout dataset: 8x8 images, 10 classes (test::idx8_dataset).
fs::path temp_dir() { return test::scratch_dir(); }
fs::path data_dir() { return test::idx8_dataset(); }
constexpr int kTest = test::kIdx8Test;

// ---- configs and runs ----

// The common part of every run: the synthetic data, batch 16 (4 steps per epoch), logs every step.
std::string base_yaml() {
  return fmt::format(
      "run:\n"
      "  seed: 7\n"
      "data:\n"
      "  dataset: mnist\n"
      "  root: {}\n"
      "  batch_size: 16\n"
      "  eval_batch_size: 10\n"
      "  num_workers: 0\n"
      "train:\n"
      "  epochs: 3\n"
      "  log_every: 1\n",
      data_dir().string());
}

// A tiny ViT with dropout, trained with SGD + Nesterov momentum + weight decay, cosine schedule with a
// one-epoch warm-up, label smoothing and gradient clipping: every piece of state a resume must restore.
const std::vector<std::string> kVitSets = {
    "model.name=vit",           "model.patch_size=4",        "model.dim=16",
    "model.depth=2",            "model.heads=2",             "model.mlp_ratio=2",
    "model.dropout=0.2",        "optim.name=sgd",            "optim.lr=0.1",
    "optim.momentum=0.9",       "optim.nesterov=true",       "optim.weight_decay=5e-4",
    "optim.clip_grad_norm=1.0", "schedule.name=cosine",      "schedule.warmup_epochs=1",
    "schedule.warmup_start_factor=0.1", "train.label_smoothing=0.1"};

// An MLP with AdamW, a multistep schedule and random-crop + flip augmentation, read by 2 loader threads.
const std::vector<std::string> kMlpSets = {
    "model.name=mlp",          "model.hidden=[32]",        "optim.name=adamw",
    "optim.lr=3e-3",           "optim.weight_decay=0.05",  "schedule.name=multistep",
    "schedule.milestones=[1.5, 2.25]", "schedule.gamma=0.5", "data.augment=cifar",
    "data.num_workers=2"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A config for the run in temp_dir()/<name>: base_yaml() plus the --set style `sets`.
TrainerConfig make_config(const std::string& name, const std::vector<std::string>& sets) {
  const std::vector<std::string> all =
      std::vector<std::string>{"run.name=" + name, "run.out_dir=" + (temp_dir() / name).string()} + sets;
  return read_trainer_config(ConfigReader::from_string(base_yaml(), "trainer_test.yaml", all));
}

// The records of one type in <out_dir>/metrics.jsonl, in file order.
std::vector<json> read_metrics(const fs::path& out_dir, const std::string& type) {
  std::ifstream in(out_dir / "metrics.jsonl");
  REQUIRE(in.good());
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    if (j.at("type") == type) out.push_back(std::move(j));
  }
  return out;
}

// step -> train record, for the records with first <= step <= last. A step logged twice is an error.
std::map<int64_t, json> train_records(const fs::path& out_dir, int64_t first, int64_t last) {
  std::map<int64_t, json> out;
  for (const json& r : read_metrics(out_dir, "train")) {
    const int64_t step = r.at("step").get<int64_t>();
    if (step < first || step > last) continue;
    INFO("step " << step << " logged twice in " << out_dir);
    REQUIRE(out.count(step) == 0);
    out[step] = r;
  }
  return out;
}

// Every train record of `resumed` for steps first..last has the same loss and learning rate as `reference`,
// compared as exact doubles (the JSON holds the shortest representation that reads back to the same double).
void require_same_losses(const fs::path& reference, const fs::path& resumed, int64_t first, int64_t last) {
  const auto ref = train_records(reference, first, last);
  const auto got = train_records(resumed, first, last);
  REQUIRE(static_cast<int64_t>(ref.size()) == last - first + 1);
  REQUIRE(static_cast<int64_t>(got.size()) == last - first + 1);
  for (int64_t step = first; step <= last; ++step) {
    INFO("step " << step << ": reference " << ref.at(step).dump() << ", resumed " << got.at(step).dump());
    CHECK(ref.at(step).at("loss").get<double>() == got.at(step).at("loss").get<double>());
    CHECK(ref.at(step).at("lr").get<double>() == got.at(step).at("lr").get<double>());
    CHECK(ref.at(step).at("epoch") == got.at(step).at("epoch"));
  }
}

// The last eval record of a run.
json last_eval(const fs::path& out_dir) {
  const auto evals = read_metrics(out_dir, "eval");
  REQUIRE(!evals.empty());
  return evals.back();
}

fs::path out_of(const TrainerConfig& c) { return c.run.out_dir; }

}  // namespace

TEST_CASE("a resumed ViT run (dropout, SGD momentum, cosine warm-up) repeats the uninterrupted losses exactly",
          "[trainer][resume]") {
  // Reference: 3 epochs x 4 steps, a checkpoint every 2 steps (all kept).
  const auto sets = kVitSets + std::vector<std::string>{"checkpoint.every_steps=2", "checkpoint.keep_last=0"};
  const TrainerConfig full = make_config("vit_full", sets);
  const TrainResult a = run_training(full);
  REQUIRE(a.steps == 12);
  REQUIRE(io::list_checkpoints(full.checkpoint.dir) == std::vector<int64_t>{2, 4, 6, 8, 10, 12});

  // The losses move (the test would be vacuous on a constant loss) and dropout drew random streams.
  const auto ref = train_records(out_of(full), 1, 12);
  CHECK(ref.at(1).at("loss") != ref.at(12).at("loss"));
  CHECK(ref.at(1).at("lr").get<double>() == Approx(0.1 * 0.1));  // warm-up starts at lr * warmup_start_factor
  const io::Checkpoint ck2 = io::load_checkpoint_dir(io::checkpoint_dir(full.checkpoint.dir, 2));
  CHECK(ck2.state.at("dropout_stream").get<uint64_t>() > 0);
  CHECK(ck2.state.at("step") == 2);
  CHECK(ck2.optimizer.has_value());

  {  // stopped by max_steps in the middle of epoch 2, then resumed from latest
    const TrainerConfig part = make_config("vit_part", sets + std::vector<std::string>{"train.max_steps=5"});
    const TrainResult b1 = run_training(part);
    REQUIRE(b1.steps == 5);
    REQUIRE(io::latest_checkpoint_step(part.checkpoint.dir) == 5);  // the stop writes a checkpoint
    require_same_losses(out_of(full), out_of(part), 1, 5);

    const TrainerConfig rest = make_config("vit_part", sets);  // same run, no step limit
    const TrainResult b2 = run_training(rest, {ResumeFrom::Kind::latest, ""});
    CHECK(b2.steps == 12);
    require_same_losses(out_of(full), out_of(part), 6, 12);
    // The final evaluation sees the same weights.
    CHECK(last_eval(out_of(part)).at("test_loss").get<double>() == last_eval(out_of(full)).at("test_loss").get<double>());
    CHECK(b2.last_eval.count("correct") == a.last_eval.count("correct"));
  }

  {  // resumed from an earlier checkpoint of the reference run (step 2) into a new run directory
    const TrainerConfig other = make_config("vit_from2", sets);
    const fs::path step2 = io::checkpoint_dir(full.checkpoint.dir, 2);
    const TrainResult c = run_training(other, {ResumeFrom::Kind::path, step2.string()});
    CHECK(c.steps == 12);
    CHECK(train_records(out_of(other), 1, 2).empty());  // nothing before the resume point is logged
    require_same_losses(out_of(full), out_of(other), 3, 12);
    CHECK(last_eval(out_of(other)).at("test_loss").get<double>() == last_eval(out_of(full)).at("test_loss").get<double>());
  }
}

TEST_CASE("a resumed MLP run (AdamW, multistep, random-crop augmentation, 2 loader threads) is exact",
          "[trainer][resume]") {
  const auto sets = kMlpSets + std::vector<std::string>{"checkpoint.every_steps=3", "checkpoint.keep_last=0"};
  const TrainerConfig full = make_config("mlp_full", sets);
  REQUIRE(run_training(full).steps == 12);
  const auto ref = train_records(out_of(full), 1, 12);
  CHECK(ref.at(1).at("lr").get<double>() == 3e-3);
  CHECK(ref.at(7).at("lr").get<double>() == Approx(1.5e-3));  // milestone 1.5 epochs = step 6
  CHECK(ref.at(10).at("lr").get<double>() == Approx(0.75e-3));  // milestone 2.25 epochs = step 9

  // K = 6 stops mid-epoch; K = 4 stops on the last batch of epoch 1 (the loader position is then
  // (epoch 0, batch 4), the end of an epoch not yet reported).
  for (const int64_t k : {int64_t{6}, int64_t{4}}) {
    INFO("stopped at step " << k << " and resumed");
    {
      const std::string name = fmt::format("mlp_part{}", k);
      const TrainerConfig part = make_config(name, sets + std::vector<std::string>{fmt::format("train.max_steps={}", k)});
      REQUIRE(run_training(part).steps == k);
      const TrainResult r = run_training(make_config(name, sets), {ResumeFrom::Kind::latest, ""});
      CHECK(r.steps == 12);
      require_same_losses(out_of(full), out_of(part), 1, 12);
      CHECK(last_eval(out_of(part)).at("test_loss").get<double>() == last_eval(out_of(full)).at("test_loss").get<double>());
    }
  }

  {  // an earlier checkpoint (step 3) of the reference run gives the same continuation
    const TrainerConfig other = make_config("mlp_from3", sets);
    run_training(other, {ResumeFrom::Kind::path, io::checkpoint_dir(full.checkpoint.dir, 3).string()});
    require_same_losses(out_of(full), out_of(other), 4, 12);
  }
}

TEST_CASE("a ResNet-18 resumed from an epoch checkpoint restores batch-norm statistics; eval of a checkpoint "
          "matches the run",
          "[trainer][resume][eval]") {
  const std::vector<std::string> sets = {"model.name=resnet18", "optim.lr=0.05", "optim.weight_decay=5e-4",
                                         "train.epochs=2", "checkpoint.every_epochs=1", "checkpoint.keep_last=0"};
  const TrainerConfig full = make_config("r18_full", sets);
  const TrainResult a = run_training(full);
  REQUIRE(a.steps == 8);
  REQUIRE(io::list_checkpoints(full.checkpoint.dir) == std::vector<int64_t>{4, 8});

  // Resume from the end of epoch 1 into a new directory: epoch 2 and its evaluation (which uses the running
  // statistics carried over from epoch 1) are the same.
  const TrainerConfig other = make_config("r18_from4", sets);
  const TrainResult b = run_training(other, {ResumeFrom::Kind::path, io::checkpoint_dir(full.checkpoint.dir, 4).string()});
  CHECK(b.steps == 8);
  require_same_losses(out_of(full), out_of(other), 5, 8);
  const json ea = last_eval(out_of(full)), eb = last_eval(out_of(other));
  CHECK(ea.at("test_loss").get<double>() == eb.at("test_loss").get<double>());
  CHECK(ea.at("test_correct") == eb.at("test_correct"));

  // `hadatrain eval` on the final checkpoint (given as the step directory, or the root: its latest) reports
  // what the run reported.
  for (const fs::path& dir : {io::checkpoint_dir(full.checkpoint.dir, 8), fs::path(full.checkpoint.dir)}) {
    INFO(dir);
    const CheckpointEvaluation e = run_evaluation(full, dir.string());
    CHECK(e.checkpoint == io::checkpoint_dir(full.checkpoint.dir, 8));  // the root resolves to its latest
    CHECK(e.step == 8);
    // `eval --json`: the same figures, named as the task names them.
    const json j = json::parse(evaluation_json(e));
    CHECK(j.at("checkpoint") == e.checkpoint.string());
    CHECK(j.at("step") == 8);
    CHECK(j.at("weights") == "model");
    CHECK(j.at("loss").get<double>() == e.loss);
    CHECK(j.at("total") == kTest);
    CHECK(j.at("correct") == e.count("correct"));
    CHECK(j.at("top5").get<double>() == e.number("top5"));
    CHECK(e.total == kTest);
    CHECK(e.count("correct") == a.last_eval.count("correct"));
    CHECK(e.number("top5") == a.last_eval.number("top5"));
    CHECK(e.loss == Approx(a.last_eval.loss).epsilon(1e-12));
    CHECK(e.loss == Approx(ea.at("test_loss").get<double>()).epsilon(1e-12));
  }
  // The epoch-1 checkpoint evaluates to the epoch-1 numbers.
  const json e1 = read_metrics(out_of(full), "eval").front();
  const EvalResult e = run_evaluation(full, io::checkpoint_dir(full.checkpoint.dir, 4).string());
  CHECK(e.count("correct") == e1.at("test_correct").get<int64_t>());
  CHECK(e.loss == Approx(e1.at("test_loss").get<double>()).epsilon(1e-12));
}

TEST_CASE("max_steps stops the run, evaluates and checkpoints; eval_every picks the evaluated epochs",
          "[trainer]") {
  SECTION("max_steps in the middle of epoch 2") {
    const TrainerConfig c = make_config("max6", kMlpSets + std::vector<std::string>{"train.max_steps=6", "checkpoint.every_epochs=1"});
    const TrainResult r = run_training(c);
    CHECK(r.steps == 6);
    const auto train = read_metrics(out_of(c), "train");
    REQUIRE(train.size() == 6);
    CHECK(train.back().at("step") == 6);
    for (const json& t : train) {  // the share of each logging window spent waiting in loader.next()
      REQUIRE(t.contains("data_wait"));
      CHECK(t.at("data_wait").get<double>() >= 0.0);
      CHECK(t.at("data_wait").get<double>() <= 1.0);
    }
    const auto evals = read_metrics(out_of(c), "eval");
    REQUIRE(evals.size() == 2);  // end of epoch 1, and the stop
    CHECK(evals[0].at("step") == 4);
    CHECK(evals[1].at("step") == 6);
    CHECK(evals[1].at("epoch") == 2);
    CHECK(r.last_eval.total == kTest);
    CHECK(evals[1].at("test_correct").get<int64_t>() == r.last_eval.count("correct"));
    CHECK(io::list_checkpoints(c.checkpoint.dir) == std::vector<int64_t>{4, 6});  // epoch 1, and the stop
  }
  SECTION("eval_every 2 over 4 epochs evaluates epochs 2 and 4") {
    const TrainerConfig c = make_config("every2", kMlpSets + std::vector<std::string>{"train.epochs=4", "train.eval_every=2"});
    CHECK(run_training(c).steps == 16);
    const auto evals = read_metrics(out_of(c), "eval");
    REQUIRE(evals.size() == 2);
    CHECK(evals[0].at("epoch") == 2);
    CHECK(evals[1].at("epoch") == 4);
    CHECK(evals[1].at("step") == 16);
  }
  SECTION("the last epoch is always evaluated (eval_every 2 over 3 epochs: epochs 2 and 3)") {
    const TrainerConfig c = make_config("every2of3", kMlpSets + std::vector<std::string>{"train.eval_every=2"});
    run_training(c);
    const auto evals = read_metrics(out_of(c), "eval");
    REQUIRE(evals.size() == 2);
    CHECK(evals[0].at("epoch") == 2);
    CHECK(evals[1].at("epoch") == 3);
  }
  SECTION("no checkpoint settings: no checkpoint directory is written, even at a max_steps stop") {
    const TrainerConfig c = make_config("nock", kMlpSets + std::vector<std::string>{"train.max_steps=2"});
    CHECK(run_training(c).steps == 2);
    CHECK(io::list_checkpoints(c.checkpoint.dir).empty());
    // The resolved config is saved with the run and reads back.
    const TrainerConfig again = load_trainer_config((out_of(c) / "config.yaml").string());
    CHECK(again.train.max_steps == 2);
    CHECK(again.optim.name == OptimKind::adamw);
    CHECK(again.schedule.milestones == std::vector<double>{1.5, 2.25});
  }
}

TEST_CASE("evaluation reports top-1 <= top-5 <= 1; the best pointer follows the highest test accuracy",
          "[trainer][eval]") {
  const TrainerConfig c = make_config(
      "best", kMlpSets + std::vector<std::string>{"data.augment=none", "optim.lr=1e-2", "train.epochs=4", "checkpoint.every_epochs=1", "checkpoint.keep_last=1"});
  const TrainResult r = run_training(c);
  const auto evals = read_metrics(out_of(c), "eval");
  REQUIRE(evals.size() == 4);
  double best = -1.0;
  int64_t best_step = -1;
  for (const json& e : evals) {
    const double top1 = e.at("test_acc").get<double>(), top5 = e.at("test_top5").get<double>();
    INFO(e.dump());
    CHECK(e.at("test_total") == kTest);
    CHECK(top1 == static_cast<double>(e.at("test_correct").get<int64_t>()) / kTest);
    CHECK(top1 >= 0.0);
    CHECK(top5 >= top1);
    CHECK(top5 <= 1.0);
    if (top1 > best) {  // the first epoch that reaches the maximum
      best = top1;
      best_step = e.at("step").get<int64_t>();
    }
  }
  // 10 classes: a trained model beats chance on the separable synthetic data, and top-5 beats top-1.
  REQUIRE(r.best_score.has_value());
  CHECK(*r.best_score == best);
  CHECK(best > 0.2);
  CHECK(r.last_eval.number("top5") > r.last_eval.number("acc"));
  CHECK(r.last_eval.number("top5") <= 1.0);
  CHECK(r.last_eval.score == r.last_eval.number("acc"));

  REQUIRE(io::best_checkpoint_step(c.checkpoint.dir) == best_step);
  // keep_last 1 prunes every older checkpoint except the best one.
  std::vector<int64_t> expected{best_step};
  if (best_step != 16) expected.push_back(16);
  CHECK(io::list_checkpoints(c.checkpoint.dir) == expected);
  // The best checkpoint evaluates to the accuracy recorded for it.
  const EvalResult e = run_evaluation(c, io::checkpoint_dir(c.checkpoint.dir, best_step).string());
  CHECK(e.number("acc") == best);
}

TEST_CASE("tied logits are ranked by class index, as argmax/topk do: a constant model is not 100% correct",
          "[trainer][eval]") {
  // A checkpoint of the MLP with every weight and bias zero: all logits are equal for every image.
  const TrainerConfig c = make_config(
      "ties", std::vector<std::string>{"train.max_steps=1", "checkpoint.every_steps=1"});
  run_training(c);
  const io::Checkpoint ck = io::load_checkpoint_dir(io::checkpoint_dir(c.checkpoint.dir, 1));
  io::CheckpointData zero;
  zero.step = 1;
  for (const auto& [name, t] : ck.model.tensors) zero.model.emplace_back(name, zeros_like(t));
  const fs::path root = temp_dir() / "ties_zero";
  io::save_checkpoint(root, zero);
  const EvalResult e = run_evaluation(c, root.string());
  // Labels are i % 10 for i < 32: class 0 wins every tie, so top-1 counts the 4 images of class 0 and top-5
  // the 17 images of classes 0..4.
  REQUIRE(e.total == kTest);
  CHECK(e.count("correct") == 4);
  CHECK(e.number("top5") == 17.0 / kTest);
  CHECK(e.loss == Approx(std::log(10.0)));
}

TEST_CASE("the image-classification task: its batch keys, its training loss, its evaluation", "[trainer][task]") {
  const ImageClassification task({.compute_dtype = DType::f32, .label_smoothing = 0.1});
  CHECK(task.required_keys() == std::vector<std::string>{"image", "label"});
  CHECK(task.unit() == "img");
  CHECK(task.score_name() == "top1");
  // 6 images of 2x2 pixels, 3 classes; a linear model.
  std::vector<float> pixels(24);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>((i * 7) % 11) / 11.0f - 0.5f;
  const Tensor x = from_vector(pixels, {6, 1, 2, 2});
  const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2}, {6}, {DType::i64});
  data::Batch batch;
  batch.set(data::batch_key::image, x);
  CHECK_THAT(error_of([&] { task.check_batch(batch); }),
             HasSubstr("image classification: the batch has no label (it has: image)"));
  batch.set(data::batch_key::label, y);
  task.check_batch(batch);
  CHECK(task.units(batch) == 6);
  Generator gen(3);
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Flatten>(1));
  model.push_back(std::make_shared<nn::Linear>(4, 3, nn::Bias::yes, gen));
  const Tensor logits = model.forward(x);  // (6, 3)

  // The training loss is cross-entropy with the task's label smoothing, and carries gradients.
  const Tensor loss = task.loss(model, batch);
  CHECK(loss.item() == cross_entropy(logits, y, {.label_smoothing = 0.1}).item());
  CHECK(loss.requires_grad());

  // Evaluation: mean cross-entropy without smoothing, top-1 counted by hand from the logits.
  const std::vector<float> l = logits.to_vector<float>();
  int64_t correct = 0;
  for (int64_t i = 0; i < 6; ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < 3; ++c)
      if (l[static_cast<std::size_t>(i * 3 + c)] > l[static_cast<std::size_t>(i * 3 + best)]) best = c;
    correct += best == (i % 3) ? 1 : 0;
  }
  const auto ev = task.evaluator();
  ev->add(model, batch);
  const EvalResult r = ev->result();
  CHECK(r.total == 6);
  CHECK(r.loss == Approx(cross_entropy(logits, y).item()).epsilon(1e-6));
  CHECK(r.count("correct") == correct);
  CHECK(r.number("acc") == static_cast<double>(correct) / 6);
  CHECK(r.score == r.number("acc"));
  CHECK(r.number("top5") == 1.0);  // 3 classes: the target is always in the top 5
  std::vector<std::string> names;
  for (const EvalMetric& m : r.metrics) names.push_back(m.name);
  CHECK(names == std::vector<std::string>{"acc", "top5", "correct", "total"});  // the eval record's order
  CHECK_THAT(error_of([&] { r.number("perplexity"); }),
             HasSubstr("the evaluation has no metric 'perplexity' (it has: acc, top5, correct, total)"));
  CHECK_THAT(error_of([&] { r.count("acc"); }), HasSubstr("'acc' is not a count"));
}

TEST_CASE("checkpoint.keep_best false writes no best pointer", "[trainer]") {
  const TrainerConfig n = make_config(
      "nobest", kMlpSets + std::vector<std::string>{"train.epochs=1", "checkpoint.every_epochs=1", "checkpoint.keep_best=false"});
  run_training(n);
  CHECK(io::list_checkpoints(n.checkpoint.dir) == std::vector<int64_t>{4});
  CHECK_FALSE(io::best_checkpoint_step(n.checkpoint.dir).has_value());
}

TEST_CASE("resume and eval errors name the checkpoint directory", "[trainer][errors]") {
  const TrainerConfig c = make_config("noresume", kMlpSets);
  CHECK_THAT(error_of([&] { run_training(c, {ResumeFrom::Kind::latest, ""}); }),
             HasSubstr("--resume: no checkpoint found in " + c.checkpoint.dir));
  const std::string missing = (temp_dir() / "no_such_dir").string();
  CHECK_THAT(error_of([&] { run_evaluation(c, missing); }), HasSubstr("--checkpoint: no checkpoint found in " + missing));
  CHECK_THAT(error_of([&] { run_training(c, {ResumeFrom::Kind::path, missing}); }), HasSubstr(missing));
}

TEST_CASE("trainer config errors name file:line: key and say what is wrong", "[trainer][config]") {
  auto err = [](const std::string& yaml, const std::vector<std::string>& sets = {}) {
    return error_of([&] { read_trainer_config(ConfigReader::from_string(yaml, "t.yaml", sets)); });
  };
  // model.heads must divide model.dim (the error points at heads).
  CHECK_THAT(err("model:\n  name: vit\n  dim: 30\n  heads: 4\n"),
             HasSubstr("t.yaml:4:10: model.heads: model.dim 30 must be divisible by heads 4"));
  CHECK_THAT(err("model:\n  name: vit\n  dim: 30\n", {"model.heads=4"}),
             HasSubstr("--set model.heads=4: model.heads: model.dim 30 must be divisible by heads 4"));
  // Coarse labels exist only for CIFAR-100.
  CHECK_THAT(err("data:\n  dataset: cifar10\n  root: /x\n  label: coarse\n"),
             HasSubstr("t.yaml:4:10: data.label: coarse labels exist only for cifar100"));
  CHECK(err("data:\n  dataset: cifar100\n  root: /x\n  label: coarse\n").empty());
  // The evaluation resize must not be smaller than the crop.
  CHECK_THAT(err("data:\n  dataset: image_folder\n  root: /x\n  image_size: 224\n  eval_resize: 200\n"),
             HasSubstr("t.yaml:5:16: data.eval_resize: must be >= data.image_size (224)"));
  // Only Fashion-MNIST has a default root.
  CHECK_THAT(err("data:\n  dataset: cifar100\n"), HasSubstr("t.yaml:1:1: data.root: expected the directory holding the cifar100 files (only Fashion-MNIST has a packaged default"));
  // Keys of another model / optimiser / schedule are unknown, not silently ignored.
  CHECK_THAT(err("model:\n  name: vit\n  hidden: [10]\n"), HasSubstr("t.yaml:3:3: model.hidden: unknown key"));
  CHECK_THAT(err("model:\n  name: resnet18\n  dim: 64\n"), HasSubstr("t.yaml:3:3: model.dim: unknown key"));
  CHECK_THAT(err("optim:\n  name: sgd\n  beta2: 0.95\n"), HasSubstr("t.yaml:3:3: optim.beta2: unknown key"));
  CHECK_THAT(err("optim:\n  name: adamw\n  momentum: 0.9\n"), HasSubstr("t.yaml:3:3: optim.momentum: unknown key"));
  CHECK_THAT(err("schedule:\n  name: cosine\n  milestones: [10]\n"), HasSubstr("t.yaml:3:3: schedule.milestones: unknown key"));
  CHECK_THAT(err("schedule:\n  name: multistep\n  min_lr: 0.1\n"), HasSubstr("t.yaml:3:3: schedule.min_lr: unknown key"));
  // Ranges and choices of trainer keys.
  CHECK_THAT(err("model:\n  name: resnet101\n"), HasSubstr("t.yaml:2:9: model.name: expected one of mlp, resnet18, resnet34, resnet50, vit"));
  CHECK_THAT(err("model:\n  name: vit\n  dropout: 1.0\n"), HasSubstr("t.yaml:3:12: model.dropout: expected a number in [0, 1), got 1"));
  CHECK_THAT(err("train:\n  precision: fp16\n"), HasSubstr("t.yaml:2:14: train.precision: expected one of fp32 (or f32), bf16"));
  CHECK_THAT(err("train:\n  device: tpu\n"), HasSubstr("t.yaml:2:11: train.device: expected cpu, cuda or cuda:N, got tpu"));
  CHECK_THAT(err("train:\n  label_smoothing: 1\n"), HasSubstr("train.label_smoothing: expected a number in [0, 1)"));
  CHECK_THAT(err("train:\n  eval_every: 0\n"), HasSubstr("train.eval_every: expected an integer >= 1, got 0"));
  CHECK_THAT(err("schedule:\n  warmup_start_factor: 2\n"), HasSubstr("schedule.warmup_start_factor: expected a number in [0, 1], got 2"));
  CHECK_THAT(err("data:\n  image_size: 4\n"), HasSubstr("data.image_size: expected an integer >= 8, got 4"));
  CHECK_THAT(err("run:\n  name: a/b\n"), HasSubstr("t.yaml:2:9: run.name: expected a non-empty name of letters, digits"));
  CHECK_THAT(err("data:\n  dataset: cifar10\n  root: /x\n  normalize:\n    mean: [0.5, 0.5, 0.5]\n    std: [0.2]\n"),
             HasSubstr("t.yaml:6:10: data.normalize.std: has 1 values but mean has 3"));
}

TEST_CASE("dataset-dependent defaults fill a short config", "[trainer][config]") {
  const TrainerConfig c = read_trainer_config(ConfigReader::from_string(
      "data:\n  dataset: cifar100\n  root: /x\nmodel:\n  name: vit\noptim:\n  name: adamw\n", "c100.yaml"));
  CHECK(c.run.name == "c100");
  CHECK(c.run.out_dir == "runs/c100");
  CHECK(c.checkpoint.dir == (fs::path("runs/c100") / "checkpoints").string());
  CHECK(c.data.batch_size == 128);
  CHECK(c.data.eval_batch_size == 256);
  CHECK(c.data.num_workers == 2);
  CHECK(c.data.augment == AugmentKind::cifar);
  CHECK(c.data.normalize_mean == std::vector<double>{0.5071, 0.4865, 0.4409});
  CHECK(c.optim.lr == 1e-3);
  CHECK(c.optim.weight_decay == 0.05);
  CHECK(c.model.dim == 384);
  const TrainerConfig f = read_trainer_config(ConfigReader::from_string("model:\n  name: resnet50\n", "f.yaml"));
  CHECK(f.data.dataset == DatasetKind::fashion_mnist);
  CHECK(f.data.root == "/usr/share/datasets/fashion-mnist");
  CHECK(f.data.batch_size == 64);
  CHECK(f.data.augment == AugmentKind::none);
  CHECK(f.optim.lr == 0.05);
  CHECK(f.optim.weight_decay == 0.0);
  CHECK(f.model.stem == "auto");
}
