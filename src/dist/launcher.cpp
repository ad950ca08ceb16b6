// The one-node launcher (dist/launcher.h): fork and exec per local rank, signal forwarding, fail-all.
#include "hadatrain/dist/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "hadatrain/core/error.h"

namespace ht::dist {
namespace {

std::atomic<int> g_forward_signal{0};
extern "C" void on_launch_signal(int sig) { g_forward_signal.store(sig); }

int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  HT_CHECK(fd >= 0, "launch: cannot create a socket to find a free port: {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  HT_CHECK(ok, "launch: cannot find a free port (bind or getsockname: {}); give --master-port", std::strerror(err));
  return ntohs(addr.sin_port);
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

int launch(const LaunchOptions& o) {
  HT_CHECK(!o.argv.empty(), "launch: no program to run (give it after --)");
  HT_CHECK(o.nproc_per_node >= 1, "launch: --nproc-per-node {} must be at least 1", o.nproc_per_node);
  HT_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank {} is not below --nnodes {}",
           o.node_rank, o.nnodes);
  HT_CHECK(o.nnodes == 1 || (o.master_port != 0 && !o.master_addr.empty()),
           "launch: several nodes need --master-addr and --master-port (the same on every node; got {} and {})",
           o.master_addr.empty() ? "none" : o.master_addr, o.master_port);
  const int port = o.master_port != 0 ? o.master_port : pick_free_port();
  const std::string master_addr = o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
  const int world = o.nnodes * o.nproc_per_node;

  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  g_forward_signal.store(0);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  std::vector<char*> args;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int local = 0; local < o.nproc_per_node; ++local) {
    const pid_t pid = ::fork();
    HT_CHECK(pid >= 0, "launch: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: stopping a rank stops what it started too
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      const int rank = o.node_rank * o.nproc_per_node + local;
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "launch: rank %d: cannot run %s: %s\n", rank, args[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so a signal sent right after the fork reaches the group
    pids.push_back(pid);
  }
  spdlog::info("launch: {} rank(s) of {} started on this node (MASTER_ADDR {} MASTER_PORT {})", pids.size(), world,
               master_addr, port);

  std::vector<bool> running(pids.size(), true);
  std::size_t left = pids.size();
  int result = 0;
  bool failed = false, killed = false;
  int forwarded = 0;  // the last signal forwarded to the ranks
  std::chrono::steady_clock::time_point kill_at{};
  while (left > 0) {
    if (const int sig = g_forward_signal.exchange(0); sig != 0) {
      forwarded = sig;
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (running[i]) ::kill(-pids[i], sig);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != pid || !running[i]) continue;
        running[i] = false;
        --left;
        const int code = exit_code_of(status);
        const int rank = o.node_rank * o.nproc_per_node + static_cast<int>(i);
        if (forwarded != 0 && code == 128 + forwarded && !failed) {
          // A rank that stopped on the forwarded signal (hadatrain train: after the step the ranks agreed on, its
          // checkpoint written) is not a failure: the others stop on the same signal, and a second one would end
          // them at once (hadatrain train's second-signal rule), before they have reported their stop.
          if (result == 0) result = code;
          spdlog::info("launch: rank {} stopped on the forwarded signal {}", rank, forwarded);
          continue;
        }
        if (code != 0 && !failed) {  // the first failure: its code is the launch's
          result = code;
          failed = true;
          kill_at = std::chrono::steady_clock::now() + o.grace;
          spdlog::error("launch: rank {} {} {}; stopping the other {} rank(s) on this node", rank,
                        WIFEXITED(status) ? "exited with code" : "was killed by signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), left);
          for (std::size_t j = 0; j < pids.size(); ++j)
            if (running[j]) ::kill(-pids[j], SIGTERM);
        }
      }
      continue;
    }
    if (failed && !killed && std::chrono::steady_clock::now() > kill_at) {
      for (std::size_t j = 0; j < pids.size(); ++j)
        if (running[j]) ::kill(-pids[j], SIGKILL);
      killed = true;  // once; the loop reaps them
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace ht::dist
