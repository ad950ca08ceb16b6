// SIGKILL at random points of checkpoint writes: a child process saves checkpoints of growing steps into
// one root (keep_last 2, so old ones are pruned while new ones are written) until the parent kills it after
// a random delay; after each kill the checkpoint `latest` resolves to must load and hold exactly what its
// step's save wrote, every complete step_<N> must load, and the next child continues from there. The
// guarantee is io::save_checkpoint's (docs/checkpoints.md, "Atomicity guarantees").
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/logging.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kElements = 64 * 1024;  // 256 KiB of f32 per tensor: a write takes long enough to be hit

// What the save of `step` writes: two tensors whose every element encodes the step, and the step in the state.
io::CheckpointData data_of(int64_t step) {
  io::CheckpointData d;
  d.step = step;
  d.model.emplace_back("w", full({kElements}, static_cast<double>(step), {DType::f32}));
  d.model.emplace_back("b", full({kElements / 4}, static_cast<double>(-step), {DType::f32}));
  d.optimizer = io::TensorList{{"w.momentum", full({kElements}, static_cast<double>(2 * step), {DType::f32})}};
  d.state = {{"step", step}, {"note", "checkpoint " + std::to_string(step)}};
  return d;
}

// Empty when `ck` is exactly what data_of(its step) wrote.
std::string check_content(const io::Checkpoint& ck) {
  const int64_t step = ck.state.at("step").get<int64_t>();
  if (ck.step != step) return "the model file's step differs from state.json's";
  const io::CheckpointData want = data_of(step);
  for (const auto& [name, t] : want.model) {
    const auto it = ck.model.tensors.find(name);
    if (it == ck.model.tensors.end()) return "tensor " + name + " is missing";
    if (!test::compare(it->second, t, 0, 0).empty()) return "tensor " + name + " differs";
  }
  if (!ck.optimizer ||
      !test::compare(ck.optimizer->tensors.at("w.momentum"), want.optimizer->at(0).second, 0, 0).empty())
    return "optimizer tensor differs";
  if (ck.state != want.state) return "state.json differs";
  return "";
}

}  // namespace

TEST_CASE("SIGKILL at random points of checkpoint writes never damages the latest checkpoint", "[fault][checkpoint]") {
  logging::set_level("off");
  test::TempDir tmp("kill_ckpt");
  const fs::path root = tmp.path / "checkpoints";
  std::mt19937 rng(20240611);
  int64_t next = 1, kills_during_a_save = 0;
  for (int round = 0; round < 40; ++round) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the child: save until killed
      try {
        for (int64_t step = next;; ++step) io::save_checkpoint(root, data_of(step), {.keep_last = 2});
      } catch (...) {
      }
      ::_exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(1000, 150000)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));  // it was still saving (a child that failed would exit 3)

    const std::optional<int64_t> latest = io::latest_checkpoint_step(root);
    if (!latest) {
      REQUIRE(next == 1);  // killed before its first save completed
      continue;
    }
    const std::optional<io::Checkpoint> ck = io::load_latest_checkpoint(root);
    REQUIRE(ck.has_value());
    INFO("round " << round << ", latest step " << *latest);
    CHECK(ck->step == *latest);
    CHECK(check_content(*ck).empty());
    for (const int64_t s : io::list_checkpoints(root)) CHECK(check_content(io::load_checkpoint_dir(io::checkpoint_dir(root, s))).empty());
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.path().filename().string().find(".tmp") != std::string::npos) ++kills_during_a_save;
    REQUIRE(*latest >= next - 1);  // no completed save was lost
    next = *latest + 1;
  }
  // The delays must have hit saves in progress (temporaries left behind), or the test proved nothing.
  CHECK(kills_during_a_save > 0);
  CHECK(next > 2);  // saves completed between kills, so kills also hit saves beside a complete latest
}

// On a file system without renameat2(RENAME_EXCHANGE) a checkpoint of the same step is replaced by two renames
// (io::ReplaceTestHooks makes save_checkpoint take them here, and kills the child between them): the checkpoint
// `latest` and `best` name, the run's only one under keep_last 1, comes back with the new contents.
TEST_CASE("SIGKILL between the two renames of a same-step replacement loses nothing", "[fault][checkpoint]") {
  logging::set_level("off");
  test::TempDir tmp("kill_replace");
  const fs::path root = tmp.path / "checkpoints";
  io::CheckpointData again = data_of(3);
  again.state["note"] = "checkpoint 3, written again";
  again.model[0].second = full({kElements}, 33.0, {DType::f32});
  const io::CheckpointSaveOptions opts{.keep_last = 1, .best = io::MarkBest::yes};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      io::set_replace_test_hooks({.exchange = io::ExchangeSupport::refused,
                                  .between_renames = [](const fs::path&) { ::kill(::getpid(), SIGKILL); }});
      io::save_checkpoint(root, data_of(3), opts);
      io::save_checkpoint(root, again, opts);
    } catch (...) {
    }
    ::_exit(3);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE_FALSE(fs::exists(root / "step_3"));  // killed where the replacement leaves no step_3
  REQUIRE(fs::exists(root / "step_3.old.tmp"));

  REQUIRE(io::latest_checkpoint_step(root) == 3);
  CHECK(io::best_checkpoint_step(root) == 3);
  const io::Checkpoint ck = *io::load_latest_checkpoint(root);
  CHECK(ck.state == again.state);
  CHECK(test::compare(ck.model.tensors.at("w"), again.model[0].second, 0, 0).empty());
  CHECK_FALSE(fs::exists(root / "step_3.tmp"));
  CHECK_FALSE(fs::exists(root / "step_3.old.tmp"));
  // The next save prunes around `best` as before.
  io::save_checkpoint(root, data_of(4), {.keep_last = 1});
  CHECK(io::list_checkpoints(root) == std::vector<int64_t>{3, 4});  // step_3 stays as `best`
  CHECK(check_content(*io::load_latest_checkpoint(root)).empty());
}
