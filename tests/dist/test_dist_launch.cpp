// The one-node launcher (dist/launcher.h) with shell commands as ranks: the variables each rank sees, exit
// codes, that one failed rank stops the others (SIGTERM, then SIGKILL after the grace period) instead of
// leaving them running, that a stop signal or a failure while the ranks are being started stops the start, that
// the ranks of a launcher killed by SIGKILL get SIGTERM, and
// the options' ranges.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

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

// The processes whose parent is this one (zombies included), from /proc.
std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> kids;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses, so read after the last ')'.
    const std::string stat = read_file(e.path() / "stat");
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;  // the process ended while being read
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid()) kids.push_back(std::stoi(name));
  }
  return kids;
}

struct LaunchRun {
  int status = 0;              // the launcher process's wait status
  Clock::duration took{};      // from its fork to its end
  std::string log;             // its standard output and error
  std::vector<pid_t> left;     // processes it left behind (killed and reaped since)
};

// Runs dist::launch(o) in a child process, its output going to `log`, with this process as the child subreaper (so
// a rank the launcher leaves behind is reparented here and counted in `left`). A launcher still running after
// `limit` is killed.
LaunchRun run_launcher(const dist::LaunchOptions& o, const std::filesystem::path& log, std::chrono::seconds limit) {
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  LaunchRun run;
  const auto t0 = Clock::now();
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    int code = 99;
    try {
      code = dist::launch(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "launch threw: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  while (::waitpid(launcher, &run.status, WNOHANG) == 0) {
    if (Clock::now() - t0 > limit) {
      ::kill(launcher, SIGKILL);
      ::waitpid(launcher, &run.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  run.took = Clock::now() - t0;
  run.left = children_of_this_process();
  for (const pid_t p : run.left) ::kill(-p, SIGKILL), ::kill(p, SIGKILL);
  for (const pid_t p : run.left) ::waitpid(p, nullptr, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  run.log = read_file(log);
  return run;
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

// Rank 0 sends SIGTERM to the launcher (its parent) as soon as it runs, while the later ranks are still being forked;
// each rank would sleep for a minute. The launcher stops forking, passes the signal to the ranks it started and exits
// with 143 at once, leaving no process behind.
TEST_CASE("a stop signal while the ranks are being started stops the start and the started ranks", "[dist]") {
  const auto dir = test::scratch_dir() / "launch_stop_start";
  std::filesystem::create_directories(dir);
  const int n = dist::max_local_ranks();
  const LaunchRun run = run_launcher(
      sh(n, "if [ $LOCAL_RANK = 0 ]; then kill -TERM $PPID; fi; exec sleep 60"), dir / "log", std::chrono::seconds(30));
  INFO("launcher log:\n" << run.log);
  CHECK((WIFEXITED(run.status) && WEXITSTATUS(run.status) == 128 + SIGTERM));
  CHECK(run.took < std::chrono::seconds(10));
  std::smatch m;
  const std::regex stopped("signal 15 before every rank was started \\(([0-9]+) of ([0-9]+) started\\)");
  REQUIRE(std::regex_search(run.log, m, stopped));
  CHECK(std::stoi(m[1].str()) < n);
  CHECK(std::stoi(m[2].str()) == n);
  CHECK(run.left.empty());
}

// Rank 0 fails at once while the later ranks are being forked: the launcher reaps it between two forks, starts no
// more ranks, stops the started ones and returns rank 0's code.
TEST_CASE("a rank that fails while the ranks are being started stops the start", "[dist]") {
  const auto dir = test::scratch_dir() / "launch_fail_start";
  std::filesystem::create_directories(dir);
  const int n = dist::max_local_ranks();
  const LaunchRun run = run_launcher(sh(n, "if [ $LOCAL_RANK = 0 ]; then exit 3; fi; exec sleep 60"), dir / "log",
                                     std::chrono::seconds(30));
  INFO("launcher log:\n" << run.log);
  CHECK((WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3));
  CHECK(run.took < std::chrono::seconds(10));
  CHECK_THAT(run.log, HasSubstr("launch: rank 0 exited with code 3; stopping the other"));
  CHECK_THAT(run.log, !HasSubstr("started on this node"));  // the start never completed
  CHECK(run.left.empty());
}

// A launch of one rank that fails reports the failure without "stopping the other 0 rank(s)".
TEST_CASE("a single rank that fails is reported alone", "[dist]") {
  const auto dir = test::scratch_dir() / "launch_fail_one";
  std::filesystem::create_directories(dir);
  const LaunchRun run = run_launcher(sh(1, "exit 4"), dir / "log", std::chrono::seconds(30));
  INFO("launcher log:\n" << run.log);
  CHECK((WIFEXITED(run.status) && WEXITSTATUS(run.status) == 4));
  CHECK_THAT(run.log, HasSubstr("launch: rank 0 exited with code 4"));
  CHECK_THAT(run.log, !HasSubstr("stopping the other"));
}

// The launcher is killed (SIGKILL: no signal to forward, no stop of its ranks) while its ranks run; each rank would
// sleep for a minute. The ranks get SIGTERM from the kernel (the parent-death signal) and end at once instead of
// running on without it.
TEST_CASE("the ranks of a launcher killed by SIGKILL get SIGTERM", "[dist]") {
  const auto dir = test::scratch_dir() / "launch_killed";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);  // the orphaned ranks become this process's children
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    const int fd = ::open((dir / "log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    int code = 99;
    try {
      code = dist::launch(sh(2, "echo $$ > " + dir.string() + "/pid$RANK.tmp && mv " + dir.string() + "/pid$RANK.tmp " +
                                    dir.string() + "/pid$RANK && exec sleep 60"));
    } catch (const std::exception&) {
    }
    ::_exit(code);
  }
  std::vector<pid_t> ranks;
  const auto t0 = Clock::now();
  for (int r = 0; r < 2; ++r) {
    const auto file = dir / ("pid" + std::to_string(r));
    while (!std::filesystem::exists(file) && Clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(std::filesystem::exists(file));
    ranks.push_back(std::stoi(read_file(file)));
  }
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  const auto killed = Clock::now();
  for (const pid_t rank : ranks) {
    int status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(rank, &status, WNOHANG)) == 0 && Clock::now() - killed < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (done == 0) {  // still running: the failure; end it here
      ::kill(-rank, SIGKILL);
      ::waitpid(rank, &status, 0);
    }
    INFO("rank pid " << rank);
    CHECK(done == rank);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM));
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_CASE("the launcher's options are checked against their ranges before any rank starts", "[dist]") {
  dist::LaunchOptions o = sh(1, "exit 0");
  o.nproc_per_node = dist::max_local_ranks() + 1;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr(fmt::format("--nproc-per-node {} is not from 1 to {}",
                                                           o.nproc_per_node, dist::max_local_ranks())));
  o.nproc_per_node = 0;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("--nproc-per-node 0 is not from 1 to"));
  o.nproc_per_node = 2;
  o.master_port = 70000;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("--master-port 70000 is not a TCP port"));
  o.master_port = -5;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("--master-port -5 is not a TCP port"));
  o.master_port = 0;
  o.node_rank = -1;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("--node-rank -1 is not from 0 to --nnodes - 1 = 0"));
  o.node_rank = 0;
  o.nnodes = INT_MAX;
  o.master_addr = "node0";
  o.master_port = 29500;
  CHECK_THROWS_WITH(dist::launch(o), HasSubstr("is more than 2147483647 ranks"));
  CHECK(dist::max_local_ranks() >= 1024);
  CHECK(dist::max_local_ranks() >= ::sysconf(_SC_NPROCESSORS_ONLN));
}
