// Checks between keys that the config alone decides, made when it is read, so that the error names the file, line
// and key: checkpoint.sharded outside fsdp.
#include <string>
#include <utility>
#include <vector>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
using ht::test::error_of;

namespace {

std::pair<TrainerConfig, std::vector<std::string>> read_with_notes(const std::string& yaml,
                                                                   const std::vector<std::string>& overrides = {}) {
  ConfigReader root = ConfigReader::from_string(yaml, "c.yaml", overrides);
  TrainerConfig c = read_trainer_config(root);
  return {c, root.notes()};
}

TrainerConfig read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return read_with_notes(yaml, overrides).first;
}

std::string error_reading(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { read(yaml, overrides); });
}

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("checkpoint.sharded is fsdp's: another value than true under another mode is an error", "[config]") {
  CHECK(error_reading("checkpoint:\n  sharded: false\ndist:\n  mode: ddp\n") ==
        "c.yaml:2:12: checkpoint.sharded: applies to dist.mode fsdp only (no other mode writes shards), got mode ddp");
  CHECK(error_reading("checkpoint:\n  every_steps: 5\n  sharded: false\n") ==
        "c.yaml:3:12: checkpoint.sharded: applies to dist.mode fsdp only (no other mode writes shards), got mode none");
  CHECK(error_reading("", {"checkpoint.sharded=false"}) ==
        "--set checkpoint.sharded=false: checkpoint.sharded: applies to dist.mode fsdp only (no other mode writes "
        "shards), got mode none");
  // true, which a saved config.yaml records, passes and is not recorded again.
  const TrainerConfig ddp = read("checkpoint:\n  sharded: true\ndist:\n  mode: ddp\n");
  CHECK(ddp.dist.mode == dist::DistMode::ddp);
  CHECK_FALSE(holds(ddp.resolved_yaml, "sharded"));
  // Under fsdp it is read, and stays the checkpoint section's last key, before grad_pipeline and dist.
  const TrainerConfig fsdp = read("checkpoint:\n  sharded: false\n  keep_last: 3\ndist:\n  mode: fsdp\n");
  CHECK_FALSE(fsdp.checkpoint.sharded);
  CHECK(fsdp.checkpoint.keep_last == 3);
  CHECK(holds(fsdp.resolved_yaml, "  on_save_failure: stop\n  sharded: false\ngrad_pipeline:\n"));
  CHECK(fsdp.resolved_yaml.find("checkpoint:") < fsdp.resolved_yaml.find("dist:"));
  CHECK(read(fsdp.resolved_yaml).resolved_yaml == fsdp.resolved_yaml);
  CHECK(read("dist:\n  mode: fsdp\n").checkpoint.sharded);
}

TEST_CASE("--set dist.mode away from fsdp drops the file's checkpoint.sharded with a note", "[config]") {
  const std::string fsdp = "checkpoint:\n  every_steps: 10\n  sharded: false\ndist:\n  mode: fsdp\n  prefetch: false\n";
  const auto [c, notes] = read_with_notes(fsdp, {"dist.mode=ddp"});
  CHECK(c.dist.mode == dist::DistMode::ddp);
  CHECK(c.checkpoint.sharded);
  CHECK(c.checkpoint.every_steps == 10);
  CHECK_FALSE(holds(c.resolved_yaml, "sharded"));
  REQUIRE(notes.size() == 2);
  CHECK(notes[0] == "--set dist.mode=ddp: dropped the file's checkpoint.sharded (c.yaml:3:3): it applies to the file's "
                    "own dist.mode settings only");
  CHECK_THAT(notes[1], HasSubstr("dropped the file's dist.prefetch (c.yaml:6:3)"));
  // A --set that keeps fsdp keeps the file's value.
  CHECK_FALSE(read(fsdp, {"dist.timeout_s=10"}).checkpoint.sharded);
  // One that makes the key apply is no switch away from it.
  CHECK_FALSE(read("checkpoint:\n  sharded: false\n", {"dist.mode=fsdp"}).checkpoint.sharded);
}
