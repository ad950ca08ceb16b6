// SIGKILL between any two of a run's writes, then a resume: a run with step evaluations (train.eval_every_steps)
// whose step checkpoints can become `best`, with epoch checkpoints (the same step written again after the epoch's
// evaluation) and keep_last pruning, writes per step a metrics record, a checkpoint folder, `latest` and `best`.
// A child process runs it and kills itself (SIGKILL, through io::set_write_fault_hook) just before the k-th write
// to a new file or the k-th metrics record, for every k until the run finishes; then the run is resumed (or
// started again when no checkpoint was complete yet). Every such run must end as the uninterrupted one:
// the same final weights, the same train and eval records once each, `best` naming the same complete checkpoint
// (docs/checkpoints.md, "Atomicity guarantees").
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/catch.h"
#include "fault_runs.h"

#include "hadatrain/core/logging.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;
using test::fault_config;
using test::read_metrics;

namespace {

// 8 steps (2 epochs of 4); a step evaluation and a step checkpoint every 2 steps, so each can become best; an
// epoch checkpoint at steps 4 and 8 (written again after the evaluation); keep_last 2 prunes around `best`.
// lr 0.5 moves the test accuracy, so `best` moves and stays behind.
// A train record every 2 steps (and at step 1) keeps the number of kill points down.
const std::vector<std::string> kSets = {"optim.lr=0.5", "train.eval_every_steps=2", "checkpoint.every_epochs=1",
                                        "checkpoint.keep_last=2", "train.log_every=2"};

TrainerConfig config_of(const std::string& name, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = kSets;
  sets.insert(sets.end(), extra.begin(), extra.end());
  return fault_config(name, sets);
}

nlohmann::json stable(nlohmann::json r) {
  for (const char* k : {"img_per_s", "data_wait", "host_peak_mb", "epoch_seconds", "gpu_peak_mb"}) r.erase(k);
  return r;
}

std::string pointer_of(const fs::path& root, const char* name) {
  return fs::exists(root / name) ? test::read_text(root / name) : std::string("(none)");
}

// Where a child is killed: before its k-th write point, or, on a file system without RENAME_EXCHANGE
// (io::ReplaceTestHooks), between the two renames of its k-th replacement of a checkpoint of the same step.
enum class KillAt { write_point, between_renames };

// Runs the run in a child that kills itself at its k-th kill point (1-based): a write to another file than the
// write before it, or a metrics record (KillAt::write_point); a same-step replacement (KillAt::between_renames).
// Returns true when the child was killed, false when the run finished first.
bool run_killed_at(const TrainerConfig& cfg, int k, KillAt at) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto seen = std::make_shared<int>(0);
    auto last = std::make_shared<fs::path>();
    if (at == KillAt::between_renames)
      io::set_replace_test_hooks({.exchange = io::ExchangeSupport::refused, .between_renames = [=](const fs::path&) {
                                    if (++*seen == k) ::kill(::getpid(), SIGKILL);
                                  }});
    else
      io::set_write_fault_hook([=](const fs::path& target, std::size_t) -> std::optional<io::WriteFault> {
        // The files of a step_<N>.tmp folder are one point: a kill between them leaves the same ignored leftover.
        const fs::path key = target.parent_path().extension() == ".tmp" ? target.parent_path() : target;
        const bool point = key != *last || target.filename() == "metrics.jsonl";
        *last = key;
        if (point && ++*seen == k) ::kill(::getpid(), SIGKILL);
        return std::nullopt;
      });
    try {
      run_training(cfg);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFEXITED(status)) {
    REQUIRE(WEXITSTATUS(status) == 0);  // a run that failed on its own is a failure
    return false;
  }
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  return true;
}

// The whole run once; then, for every kill point k, a run killed there and resumed, compared with the whole run.
// Returns the number of kills.
int check_every_kill(const std::string& tag, const std::vector<std::string>& extra, int64_t steps,
                     KillAt at = KillAt::write_point) {
  const TrainerConfig whole = config_of(tag + "_whole", extra);
  REQUIRE(run_training(whole).steps == steps);
  const test::MetricsFile whole_metrics = read_metrics(fs::path(whole.run.out_dir) / "metrics.jsonl");
  const std::string best = pointer_of(whole.checkpoint.dir, "best");
  const std::vector<int64_t> kept = io::list_checkpoints(whole.checkpoint.dir);
  const io::Checkpoint final_ck = io::load_checkpoint_dir(io::checkpoint_dir(whole.checkpoint.dir, steps));
  INFO("whole run: best " << best << ", evaluations " << nlohmann::json(whole_metrics.of_type("eval")).dump());
  REQUIRE(best != "(none)");

  int kills = 0;
  for (int k = 1;; ++k) {
    const TrainerConfig cfg = config_of(fmt::format("{}_{}", tag, k), extra);
    if (!run_killed_at(cfg, k, at)) break;
    ++kills;
    const std::string named = pointer_of(cfg.checkpoint.dir, "latest");
    const std::optional<int64_t> latest = io::latest_checkpoint_step(cfg.checkpoint.dir);
    const bool any = latest.has_value();
    INFO("killed at kill point " << k << "; resumed: " << any);
    // No completed save is lost: `latest`, once written, resolves to the checkpoint it names.
    if (named != "(none)") CHECK(named == fmt::format("step_{}\n", latest.value_or(-1)));
    REQUIRE(run_training(cfg, any ? ResumeFrom{ResumeFrom::Kind::latest, ""} : ResumeFrom{}).steps == steps);

    const test::MetricsFile m = read_metrics(fs::path(cfg.run.out_dir) / "metrics.jsonl");
    CHECK(m.bad_lines == 0);
    for (const char* type : {"train", "eval"}) {
      const auto got = m.of_type(type), want = whole_metrics.of_type(type);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(type << " record " << i << ": " << got[i].dump() << " vs " << want[i].dump());
        CHECK(stable(got[i]) == stable(want[i]));
      }
    }
    CHECK(pointer_of(cfg.checkpoint.dir, "best") == best);
    CHECK(io::best_checkpoint_step(cfg.checkpoint.dir).has_value());  // a complete folder
    // The whole run's checkpoints are there. A run stopped after its last save's folder, before that save pruned,
    // may keep an older one too (a finished run saves nothing more).
    const std::vector<int64_t> got = io::list_checkpoints(cfg.checkpoint.dir);
    CHECK(std::includes(got.begin(), got.end(), kept.begin(), kept.end()));
    const io::Checkpoint ck = io::load_checkpoint_dir(io::checkpoint_dir(cfg.checkpoint.dir, steps));
    CHECK(ck.state == final_ck.state);
    for (const auto& [tensor, value] : final_ck.model.tensors) {
      INFO("model tensor " << tensor);
      CHECK(test::compare(ck.model.tensors.at(tensor), value, 0, 0).empty());
    }
  }
  return kills;
}

}  // namespace

TEST_CASE("a kill between any two writes of a run with step evaluations, then a resume, ends as the whole run",
          "[fault][checkpoint][eval_steps]") {
  logging::set_level("off");
  // Evaluations at 2, 4, 6, 8 score 0.34, 0.28, 0.44, 0.41: `best` moves to step_6 and stays behind the last
  // checkpoint. Write points: config.yaml, 5 train and 4 eval records, 6 checkpoint folders (step 4 and 8 twice),
  // their `latest` and `best` when marked.
  CHECK(check_every_kill("kbw", {}, 8) >= 20);
}

TEST_CASE("a kill between the last checkpoint of a train.max_steps stop and its rewrite as best, then a resume",
          "[fault][checkpoint][eval_steps]") {
  logging::set_level("off");
  // Stopped at step 6, inside epoch 2: its checkpoint is written before the stop's evaluation, which raises the
  // best score, so it is written again as `best`; a resume finds the run complete.
  CHECK(check_every_kill("kbw_stop", {"train.max_steps=6"}, 6) >= 15);
}

TEST_CASE("a kill inside a same-step replacement, then a resume, ends as the whole run",
          "[fault][checkpoint][eval_steps]") {
  logging::set_level("off");
  // On a file system without RENAME_EXCHANGE, killed between the two renames. keep_last 1: the checkpoint written
  // again is the run's only one besides `best`. The epoch checkpoints of steps 4 and 8 are written again after their
  // evaluations.
  CHECK(check_every_kill("kbr", {"checkpoint.keep_last=1"}, 8, KillAt::between_renames) >= 2);
}
