// metrics.jsonl after faults (docs/checkpoints.md): a cut-off last line (a kill or a full disk in the middle
// of a write) is removed when the run resumes, never written onto; records of steps after the checkpoint are
// dropped and logged again, so every step is logged once; a run stopped by train.max_steps at an epoch's end
// does not evaluate that epoch again when resumed; an epoch split by a resume reports the train_loss of all
// its steps. Each resumed run is compared with the uninterrupted one.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/catch.h"
#include "fault_runs.h"

#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;
using test::fault_config;
using test::read_metrics;

namespace {

const std::vector<int64_t> kAllSteps{1, 2, 3, 4, 5, 6, 7, 8};

// The uninterrupted run's metrics (2 epochs, 8 steps), run once.
const test::MetricsFile& whole_run() {
  static const test::MetricsFile m = [] {
    const TrainerConfig cfg = fault_config("metrics_whole");
    run_training(cfg);
    return read_metrics(fs::path(cfg.run.out_dir) / "metrics.jsonl");
  }();
  return m;
}

// Train records without their timing fields, eval records without theirs: what a resume must reproduce.
nlohmann::json stable(nlohmann::json r) {
  for (const char* k : {"img_per_s", "data_wait", "host_peak_mb", "epoch_seconds", "gpu_peak_mb"}) r.erase(k);
  return r;
}

void check_matches_whole_run(const test::MetricsFile& m) {
  const test::MetricsFile& whole = whole_run();
  for (const char* type : {"train", "eval"}) {
    const auto got = m.of_type(type), want = whole.of_type(type);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO(type << " record " << i << ": " << got[i].dump() << " vs " << want[i].dump());
      CHECK(stable(got[i]) == stable(want[i]));
    }
  }
}

}  // namespace

TEST_CASE("a cut-off last line of metrics.jsonl is removed on resume, not written onto", "[fault][metrics]") {
  logging::set_level("off");
  const TrainerConfig cfg = fault_config("metrics_cut", {"train.max_steps=3"});
  run_training(cfg);
  const fs::path metrics = fs::path(cfg.run.out_dir) / "metrics.jsonl";
  // A kill (or a full disk) in the middle of writing step 4's record.
  std::ofstream(metrics, std::ios::app) << R"({"type": "train", "step": 4, "epoch": 1, "loss": 0.4)";
  REQUIRE_FALSE(read_metrics(metrics).ends_with_newline);

  run_training(fault_config("metrics_cut"), {ResumeFrom::Kind::latest, ""});
  const test::MetricsFile m = read_metrics(metrics);
  CHECK(m.bad_lines == 0);
  CHECK(m.ends_with_newline);
  CHECK(m.steps("train") == kAllSteps);
  // The evaluation at the max_steps stop (step 3) stays; then the epoch ends (4) and the run (8).
  CHECK(m.steps("eval") == std::vector<int64_t>{3, 4, 8});
}

TEST_CASE("after a resume every step is logged once, as in the uninterrupted run", "[fault][metrics]") {
  logging::set_level("off");
  whole_run();
  // A run killed after it logged step 7, whose last checkpoint is step 6: made from a whole run by taking
  // away what came after.
  const TrainerConfig cfg = fault_config("metrics_twice");
  run_training(cfg);
  fs::remove_all(io::checkpoint_dir(cfg.checkpoint.dir, 8));
  REQUIRE(io::latest_checkpoint_step(cfg.checkpoint.dir) == 6);
  const fs::path metrics = fs::path(cfg.run.out_dir) / "metrics.jsonl";
  std::string kept;
  for (const auto& r : read_metrics(metrics).records)
    if (r.at("step").get<int64_t>() <= 7) kept += r.dump() + "\n";
  std::ofstream(metrics, std::ios::trunc) << kept;

  const TrainResult resumed = run_training(fault_config("metrics_twice"), {ResumeFrom::Kind::latest, ""});
  CHECK(resumed.steps == 8);
  const test::MetricsFile m = read_metrics(metrics);
  CHECK(m.bad_lines == 0);
  CHECK(m.steps("train") == kAllSteps);
  CHECK(m.steps("eval") == std::vector<int64_t>{4, 8});
  // Losses, learning rates, test metrics and the train_loss of the epoch the resume split (steps 5-6 before
  // it, 7-8 after).
  check_matches_whole_run(m);
}

TEST_CASE("a run stopped by train.max_steps at an epoch's end does not evaluate that epoch again when resumed",
          "[fault][metrics]") {
  logging::set_level("off");
  whole_run();
  const TrainerConfig first = fault_config("metrics_epoch_end", {"train.max_steps=4"});
  const TrainResult stopped = run_training(first);
  REQUIRE(stopped.steps == 4);
  // The checkpoint of the stop is written after the evaluation and continues at the next epoch.
  const io::Checkpoint ck = *io::load_latest_checkpoint(first.checkpoint.dir);
  CHECK(ck.step == 4);
  CHECK(ck.state.at("epoch").get<int64_t>() == 1);
  CHECK(ck.state.at("batch").get<int64_t>() == 0);

  run_training(fault_config("metrics_epoch_end"), {ResumeFrom::Kind::latest, ""});
  const test::MetricsFile m = read_metrics(fs::path(first.run.out_dir) / "metrics.jsonl");
  CHECK(m.steps("eval") == std::vector<int64_t>{4, 8});
  for (const auto& e : m.of_type("eval")) CHECK(e.at("train_loss").is_number());
  check_matches_whole_run(m);
}
