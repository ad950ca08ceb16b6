// `hadatrain train` with dist.mode ddp over Gloo, ranks forked with the launcher's variables set: the logged
// losses of 2 and 4 ranks, and of 2 ranks with gradient accumulation, equal one process's with the same global
// batch (Note [Data-parallel equivalence]; within 1e-5 relative: the same products summed in another order),
// every rank logs the same losses, ranks whose configs differ stop at the start naming the keys and values, and a
// checkpoint rank 0 cannot write stops or continues every rank alike.
#include <cerrno>
#include <csignal>
#include <cstdlib>

#include "dist_testing.h"
#include "dist_trainer_testing.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using namespace ht::train;
using ht::test::expect;
namespace fs = std::filesystem;

namespace {

TrainerConfig config(const std::string& name, std::vector<std::string> sets = {}) {
  return test::idx8_config(
      "dist_trainer.yaml",
      "run:\n  seed: 5\n"
      "data:\n  dataset: mnist\n  root: {root}\n  batch_size: 16\n  eval_batch_size: 16\n  num_workers: 0\n"
      "model:\n  name: mlp\n  hidden: [16]\n"
      "optim:\n  name: sgd\n  lr: 0.1\n  momentum: 0.9\n  weight_decay: 0.001\n"
      "train:\n  epochs: 2\n  log_every: 1\n",
      name, std::move(sets));
}

// The train records' losses in step order.
std::vector<double> losses(const fs::path& out_dir) {
  std::vector<double> out;
  for (const auto& [step, loss] : test::train_losses(out_dir)) out.push_back(loss);
  return out;
}

using ht::test::set_rank_env;

void check_ddp_matches_one_process(int world, std::vector<std::string> sets = {}) {
  test::idx8_dataset();  // the scratch folder and dataset are made here, before the fork, once for every rank
  const std::string tag = sets.empty() ? "" : "_accum";
  const std::string ref_name = "ref" + tag, name = fmt::format("ddp{}{}", world, tag);
  const auto ref = ht::test::run_ranks(1, [&](const dist::DistEnv&) { run_training(config(ref_name, sets)); });
  REQUIRE(ht::test::all_passed(ref));
  const auto out = ht::test::run_ranks(world, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    std::vector<std::string> mine = sets;
    for (const char* s : {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=30", "dist.bucket_mb=0.001"})
      mine.emplace_back(s);
    run_training(config(name, mine));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  const auto expected = losses(test::scratch_dir() / ref_name);
  const auto got = losses(test::scratch_dir() / name);
  REQUIRE(expected.size() == 8);  // 2 epochs of 4 steps
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("step " << i + 1 << ": " << world << " ranks " << got[i] << ", one process " << expected[i]);
    CHECK(std::abs(got[i] - expected[i]) <= 1e-5 * std::abs(expected[i]));
  }
  for (int r = 1; r < world; ++r) CHECK(losses(test::scratch_dir() / name / fmt::format("rank{}", r)) == got);
  CHECK_FALSE(fs::exists(test::scratch_dir() / name / "rank1" / "checkpoints"));
}

}  // namespace

TEST_CASE("train with dist.mode ddp on 2 ranks logs one process's losses", "[dist][trainer]") {
  check_ddp_matches_one_process(2);
}

TEST_CASE("train with dist.mode ddp on 4 ranks logs one process's losses", "[dist][trainer]") {
  check_ddp_matches_one_process(4);
}

// The buckets go out during the last micro-batch's backward (Note [Reduction during backward]), with the
// gradients of the earlier micro-batches already accumulated in.
TEST_CASE("train with dist.mode ddp and gradient accumulation on 2 ranks logs one process's losses",
          "[dist][trainer]") {
  check_ddp_matches_one_process(2, {"train.grad_accum_steps=2"});
}

// dist.reduce_in_backward false reduces after the backward: the same buffers summed in the same order, so the
// same losses bit for bit (the switch is there to measure the overlap).
TEST_CASE("train with dist.mode ddp: the reduction during and after backward log the same losses", "[dist][trainer]") {
  test::idx8_dataset();
  for (const std::string during : {"true", "false"}) {
    const auto out = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
      set_rank_env(env);
      run_training(config("in_backward_" + during, {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=30",
                                                     "dist.bucket_mb=0.001", "dist.reduce_in_backward=" + during}));
    });
    INFO("reduce_in_backward " << during << ": exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
  const auto during = losses(test::scratch_dir() / "in_backward_true");
  REQUIRE(during.size() == 8);
  CHECK(losses(test::scratch_dir() / "in_backward_false") == during);
}

// Every rank needs a row of every batch: an epoch's last batch with fewer rows than ranks (49 images in batches of
// 16: 1 row on 2 ranks) is dropped instead of stopping the run at the end of the first epoch; the full batches
// before it are one process's.
TEST_CASE("train with dist.mode ddp drops an epoch's last batch with fewer rows than ranks", "[dist][trainer]") {
  test::idx8_dataset();
  const std::vector<std::string> limit = {"data.train_limit=49"};
  const auto ref = ht::test::run_ranks(1, [&](const dist::DistEnv&) { run_training(config("ref_short", limit)); });
  REQUIRE(ht::test::all_passed(ref));
  const auto out = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    std::vector<std::string> mine = limit;
    for (const char* s : {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=30"}) mine.emplace_back(s);
    run_training(config("ddp_short", mine));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  const auto expected = losses(test::scratch_dir() / "ref_short");
  const auto got = losses(test::scratch_dir() / "ddp_short");
  REQUIRE(expected.size() == 8);  // one process: 2 epochs of 4 steps, the last of 1 image
  REQUIRE(got.size() == 6);       // 2 ranks: 2 epochs of 3 steps
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("step " << i + 1 << ": 2 ranks " << got[i] << ", one process " << expected[i]);
    CHECK(std::abs(got[i] - expected[i]) <= 1e-5 * std::abs(expected[i]));
  }
}

// Under ddp every rank calls the save and rank 0 writes: a checkpoint rank 0 cannot write (a full disk, injected
// for step 2's) makes every rank take the same course. With on_save_failure continue all train on, the next save
// works and rank 1 reports rank 0's checkpoint; with stop all stop, rank 0 naming the disk and rank 1 naming rank
// 0, rather than rank 1 meeting a closed connection (Gloo) or waiting out dist.timeout_s (NCCL) at its next
// collective.
TEST_CASE("a checkpoint rank 0 cannot write stops or continues every ddp rank alike", "[dist][trainer]") {
  test::idx8_dataset();
  auto full_disk_on_rank0 = [](const dist::DistEnv& env) {
    if (env.rank != 0) return;
    io::set_write_fault_hook([](const fs::path& target, std::size_t n) -> std::optional<io::WriteFault> {
      if (target.string().find("step_2.tmp") == std::string::npos) return std::nullopt;
      return io::WriteFault{.bytes_written = n / 2, .error = ENOSPC};
    });
  };
  auto sets = [](std::vector<std::string> extra) {
    for (const char* s : {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=30", "checkpoint.every_steps=2",
                          "train.max_steps=4"})
      extra.emplace_back(s);
    return extra;
  };
  const auto goes_on = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    full_disk_on_rank0(env);
    const TrainResult r = run_training(config("ddp_full_continue", sets({"checkpoint.on_save_failure=continue"})));
    expect(fs::path(r.checkpoint).filename() == "step_4",
           "every rank reports step 4's checkpoint; got " + r.checkpoint);
  });
  INFO("continue: exit codes " << ht::test::exit_codes(goes_on));
  REQUIRE(ht::test::all_passed(goes_on));
  CHECK(io::list_checkpoints(test::scratch_dir() / "ddp_full_continue" / "checkpoints") == std::vector<int64_t>{4});
  CHECK(losses(test::scratch_dir() / "ddp_full_continue").size() == 4);
  CHECK(losses(test::scratch_dir() / "ddp_full_continue" / "rank1").size() == 4);
  CHECK_FALSE(fs::exists(test::scratch_dir() / "ddp_full_continue" / "rank1" / "checkpoints"));

  const auto stops = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    full_disk_on_rank0(env);
    const std::string err = test::error_of([&] { run_training(config("ddp_full_stop", sets({}))); });
    expect(err.find("the checkpoint of step 2") != std::string::npos &&
               err.find("Training stopped") != std::string::npos,
           "the error names the step and the policy; got: " + err);
    expect(env.rank == 0 ? err.find("No space left on device") != std::string::npos
                         : err.find("rank(s) 0 could not write") != std::string::npos,
           "the error says what failed where; got: " + err);
  });
  INFO("stop: exit codes " << ht::test::exit_codes(stops));
  REQUIRE(ht::test::all_passed(stops));
  CHECK(io::list_checkpoints(test::scratch_dir() / "ddp_full_stop" / "checkpoints").empty());
}

// Note [Agreeing on a stop]: a stop request that only rank 0 sees (from before the first step; ranks may see one at
// different steps) stops both ranks after the same step, the second, which they save together: both return with
// the signal, rank 0's checkpoint holds step 2 and each rank logged two steps. Saving at the step where rank 0 saw
// it, without the agreement, aborts (rank 0's outcome exchange meets rank 1's gradient reduction).
TEST_CASE("under ddp a stop request one rank sees stops every rank after the same step", "[dist][trainer]") {
  test::idx8_dataset();
  const auto out = ht::test::run_stop_seen_by_rank0(
      [] {
        return config("ddp_stop",
                      {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=20", "checkpoint.every_steps=100"});
      },
      SIGTERM);
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  CHECK(io::list_checkpoints(test::scratch_dir() / "ddp_stop" / "checkpoints") == std::vector<int64_t>{2});
  CHECK(losses(test::scratch_dir() / "ddp_stop").size() == 2);
  CHECK(losses(test::scratch_dir() / "ddp_stop" / "rank1").size() == 2);
}

// Note [Comparing the ranks' configs]: the error names each key that differs with both ranks' values, a list as
// one value, a key only one rank's config reads (SGD's momentum against AdamW) as "no such key" on the other.
TEST_CASE("ranks with different configs stop at the start naming the keys and values", "[dist][trainer]") {
  test::idx8_dataset();
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    set_rank_env(env);
    std::vector<std::string> sets = {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=10"};
    if (env.rank == 1)
      for (const char* s : {"optim.lr=0.2", "model.hidden=[16, 8]", "optim.name=adamw"}) sets.emplace_back(s);
    const std::string err = test::error_of([&] { run_training(config("mismatch", sets)); });
    for (const char* part : {"the ranks disagree on the resolved config: ", "model.hidden: rank 1 has [16, 8], rank 0 has [16]",
                             "optim.name: rank 1 has adamw, rank 0 has sgd", "optim.lr: rank 1 has 0.2, rank 0 has 0.1",
                             "optim.momentum: rank 1 has no such key, rank 0 has 0.9",
                             "optim.beta1: rank 1 has 0.9, rank 0 has no such key",
                             "; every rank must run the same command (check the arguments and --set overrides of rank 1)"})
      expect(err.find(part) != std::string::npos, fmt::format("the error should say '{}'; it says: {}", part, err));
    expect(err.find("run.seed") == std::string::npos, "keys that agree are not named; got: " + err);
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

// Note [Sharded evaluation]: `hadatrain eval` under a launcher (run_evaluation with the launcher's variables, any
// dist.mode): every rank evaluates its rows of each test batch and gets the whole test set's figures, one process's
// (the counts exactly, the loss within 1e-6 relative: the same sums in another order; a rank that evaluated every
// row would count them N times), and knows its rank, so that rank 0 alone reports. Ranks asked to evaluate
// different checkpoints stop naming both.
TEST_CASE("eval under a launcher shares one evaluation over the ranks", "[dist][trainer]") {
  test::idx8_dataset();
  const auto trained = ht::test::run_ranks(1, [](const dist::DistEnv&) {
    run_training(config("eval_ranks", {"checkpoint.every_epochs=1", "checkpoint.keep_last=0"}));
  });
  REQUIRE(ht::test::all_passed(trained));
  const fs::path root = test::scratch_dir() / "eval_ranks" / "checkpoints";
  const CheckpointEvaluation one = run_evaluation(config("eval_ranks"), root.string());
  REQUIRE(one.total == test::kIdx8Test);
  const std::vector<std::string> sets = {"dist.engine=gloo", "dist.timeout_s=20"};
  for (const int world : {2, 3}) {
    const auto out = ht::test::run_ranks(world, [&](const dist::DistEnv& env) {
      set_rank_env(env);
      const CheckpointEvaluation r = run_evaluation(config("eval_ranks", sets), root.string());
      expect(r.rank == env.rank && r.world_size == world, fmt::format("rank {} of {}", r.rank, r.world_size));
      expect(r.total == one.total && r.count("correct") == one.count("correct"),
             fmt::format("{} correct of {}, one process {} of {}", r.count("correct"), r.total, one.count("correct"),
                         one.total));
      expect(std::abs(r.loss - one.loss) <= 1e-6 * std::abs(one.loss),
             fmt::format("loss {} against one process's {}", r.loss, one.loss));
      expect(r.step == one.step && r.checkpoint == one.checkpoint, "the same checkpoint");
    });
    INFO(world << " ranks: exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
  const auto mismatch = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    const std::string step4 = (root / "step_4").string();
    const std::string err =
        test::error_of([&] { run_evaluation(config("eval_ranks", sets), env.rank == 1 ? step4 : root.string()); });
    const std::string want = fmt::format("the ranks disagree on the checkpoint to evaluate: rank 1 has {} but rank 0 has {}",
                                         step4, root.string());
    expect(err.find(want) != std::string::npos, "the error should say '" + want + "'; it says: " + err);
  });
  INFO("exit codes " << ht::test::exit_codes(mismatch));
  REQUIRE(ht::test::all_passed(mismatch));
}

TEST_CASE("a launched rank with dist.mode none is an error", "[dist][trainer]") {
  test::idx8_dataset();
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    set_rank_env(env);
    const std::string err = test::error_of([&] { run_training(config("none_mode")); });
    expect(err.find("but dist.mode is none: every rank would train alone") != std::string::npos, "got: " + err);
  });
  REQUIRE(ht::test::all_passed(out));
}

// The weight average (config ema) under ddp: every rank averages the same reduced weights, so rank 0's checkpointed
// average equals one process's within the losses' tolerance, and its evaluation is logged beside the weights'.
TEST_CASE("train with dist.mode ddp keeps one process's weight average", "[dist][trainer][ema]") {
  test::idx8_dataset();
  const std::vector<std::string> sets = {"ema.decay=0.8", "checkpoint.every_epochs=1", "checkpoint.keep_last=0"};
  const auto ref = ht::test::run_ranks(1, [&](const dist::DistEnv&) { run_training(config("ref_ema", sets)); });
  REQUIRE(ht::test::all_passed(ref));
  const auto out = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    std::vector<std::string> mine = sets;
    for (const char* s : {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=30", "dist.bucket_mb=0.001"})
      mine.emplace_back(s);
    run_training(config("ddp2_ema", mine));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  const io::Checkpoint a = io::load_checkpoint_dir(io::checkpoint_dir(test::scratch_dir() / "ref_ema" / "checkpoints", 8));
  const io::Checkpoint b = io::load_checkpoint_dir(io::checkpoint_dir(test::scratch_dir() / "ddp2_ema" / "checkpoints", 8));
  REQUIRE(a.ema.has_value());
  REQUIRE(b.ema.has_value());
  CHECK(b.state.at("ema_updates") == a.state.at("ema_updates"));
  for (const auto& [name, t] : a.ema->tensors) {
    INFO(name);
    CHECK(test::compare(b.ema->at(name), t, 1e-5, 1e-7) == "");
  }
}
