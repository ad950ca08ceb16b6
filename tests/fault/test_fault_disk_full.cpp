// A full disk, injected (io::set_write_fault_hook: the writes of a chosen file store part of their bytes and
// fail with ENOSPC, as a full disk does): a checkpoint that cannot be written stops the run naming the last
// good checkpoint, unless checkpoint.on_save_failure is continue; no temporary is left; metrics.jsonl keeps
// whole records; the run resumes from the last good checkpoint and logs each step once.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/spdlog.h>

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

// Installs a hook for the scope: after `skip` writes to files whose path contains `marker`, every further
// write to them stores half its bytes and fails with ENOSPC.
struct DiskFull {
  explicit DiskFull(std::string marker, int skip = 0) {
    auto left = std::make_shared<int>(skip);
    io::set_write_fault_hook([marker, left](const fs::path& target, std::size_t n) -> std::optional<io::WriteFault> {
      if (target.string().find(marker) == std::string::npos) return std::nullopt;
      if (*left > 0) {
        --*left;
        return std::nullopt;
      }
      return io::WriteFault{n / 2, ENOSPC};
    });
  }
  ~DiskFull() { io::set_write_fault_hook({}); }
  DiskFull(const DiskFull&) = delete;
  DiskFull& operator=(const DiskFull&) = delete;
};

bool has_temporaries(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("a checkpoint that cannot be written stops the run, naming the last good checkpoint", "[fault][checkpoint]") {
  logging::set_level("off");
  const TrainerConfig cfg = fault_config("disk_full_stop");
  std::string err;
  {
    const DiskFull full("step_4.tmp");  // the disk fills up while step 4's checkpoint is written
    err = test::error_of([&] { run_training(cfg); });
  }
  INFO(err);
  CHECK(err.find("the checkpoint of step 4 could not be written: ") != std::string::npos);
  CHECK(err.find(std::strerror(ENOSPC)) != std::string::npos);
  CHECK(err.find("the last good checkpoint is " + io::checkpoint_dir(cfg.checkpoint.dir, 2).string()) !=
        std::string::npos);
  CHECK(err.find("checkpoint.on_save_failure=continue") != std::string::npos);
  CHECK(io::list_checkpoints(cfg.checkpoint.dir) == std::vector<int64_t>{2});
  CHECK(io::latest_checkpoint_step(cfg.checkpoint.dir) == 2);
  CHECK_FALSE(has_temporaries(cfg.checkpoint.dir));

  // With space again, --resume continues from step 2 and logs each step once.
  const TrainResult resumed = run_training(cfg, {ResumeFrom::Kind::latest, ""});
  CHECK(resumed.steps == 8);
  const test::MetricsFile m = read_metrics(fs::path(cfg.run.out_dir) / "metrics.jsonl");
  CHECK(m.bad_lines == 0);
  CHECK(m.steps("train") == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("with checkpoint.on_save_failure=continue a failed save is a warning and training goes on",
          "[fault][checkpoint]") {
  const TrainerConfig cfg = fault_config("disk_full_continue", {"checkpoint.on_save_failure=continue"});
  TrainResult r;
  std::string log;
  {
    const test::LogCapture capture(SPDLOG_LEVEL_WARN);
    const DiskFull full("step_4.tmp");
    r = run_training(cfg);
    log = capture.str();
  }
  INFO(log);
  CHECK(r.steps == 8);
  CHECK(io::list_checkpoints(cfg.checkpoint.dir) == std::vector<int64_t>{2, 6, 8});
  CHECK(r.checkpoint == io::checkpoint_dir(cfg.checkpoint.dir, 8).string());
  CHECK(log.find("the checkpoint of step 4 could not be written") != std::string::npos);
  CHECK(log.find("training goes on") != std::string::npos);
  CHECK_FALSE(has_temporaries(cfg.checkpoint.dir));
  CHECK_THROWS_WITH(test::fault_config("disk_full_bad", {"checkpoint.on_save_failure=retry"}),
                    HasSubstr("checkpoint.on_save_failure"));
}

TEST_CASE("a metrics record that cannot be written is cut off again: the file keeps whole records",
          "[fault][metrics]") {
  logging::set_level("off");
  const TrainerConfig cfg = fault_config("disk_full_metrics");
  std::string err;
  {
    const DiskFull full("metrics.jsonl", 2);  // the third record does not fit
    err = test::error_of([&] { run_training(cfg); });
  }
  INFO(err);
  CHECK(err.find("metrics.jsonl: writing a metrics record failed: " + std::string(std::strerror(ENOSPC))) !=
        std::string::npos);
  const test::MetricsFile m = read_metrics(fs::path(cfg.run.out_dir) / "metrics.jsonl");
  CHECK(m.ends_with_newline);
  CHECK(m.bad_lines == 0);
  CHECK(m.steps("train") == std::vector<int64_t>{1, 2});  // the third record's half was removed
}
