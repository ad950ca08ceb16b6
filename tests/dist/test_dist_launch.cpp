// The one-node launcher (dist/launcher.h) with shell commands as ranks: the variables each rank sees, exit
// codes, and that one failed rank stops the others (SIGTERM, then SIGKILL after the grace period) instead of
// leaving them running.
#include <chrono>
#include <fstream>
#include <sstream>

#include "hadatrain/dist/launcher.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using Clock = std::chrono::steady_clock;

namespace {
std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
dist::LaunchOptions sh(int n, const std::string& script) {
  return {.nproc_per_node = n, .argv = {"/bin/sh", "-c", script}, .grace = std::chrono::milliseconds(500)};
}
}  // namespace

TEST_CASE("launch gives each rank torchrun's variables", "[dist]") {
  const auto dir = test::scratch_dir() / "launch_env";
  std::filesystem::create_directories(dir);
  const std::string script =
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR\" > " + dir.string() + "/rank$RANK";
  REQUIRE(dist::launch(sh(3, script)) == 0);
  for (int r = 0; r < 3; ++r)
    CHECK(read_file(dir / ("rank" + std::to_string(r))) == fmt::format("{} 3 {} 3 127.0.0.1\n", r, r));
}

TEST_CASE("launch returns the failed rank's code and stops the others at once", "[dist]") {
  const auto t0 = Clock::now();
  // Rank 1 fails after a moment; the others would sleep for a minute.
  CHECK(dist::launch(sh(3, "if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; sleep 60")) == 3);
  CHECK(Clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("a rank that ignores SIGTERM is killed after the grace period", "[dist]") {
  const auto t0 = Clock::now();
  CHECK(dist::launch(sh(2, "if [ $RANK = 0 ]; then exit 5; fi; trap '' TERM; sleep 60")) == 5);
  CHECK(Clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("launch of a program that does not exist fails with 127", "[dist]") {
  CHECK(dist::launch({.nproc_per_node = 2, .argv = {"/no/such/program"}, .grace = std::chrono::milliseconds(200)}) ==
        127);
}

// Another node cannot reach rank 0 at 127.0.0.1: several nodes must name rank 0's host and port.
TEST_CASE("a launch on several nodes without --master-addr or --master-port is an error", "[dist]") {
  dist::LaunchOptions o = sh(1, "exit 0");
  o.nnodes = 2;
  o.master_port = 29500;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("several nodes need --master-addr and --master-port") &&
                                         HasSubstr("got none and 29500"));
  o.master_addr = "node0";
  o.master_port = 0;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("got node0 and 0"));
}
