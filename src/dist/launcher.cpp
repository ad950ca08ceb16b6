// The one-node launcher (dist/launcher.h): fork and exec per local rank, signal forwarding, fail-all.
#include "hadatrain/dist/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

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

// SIGINT and SIGTERM set g_forward_signal while the launcher runs; the dispositions before it come back when it
// returns or throws.
class SignalHandlers {
 public:
  SignalHandlers() {
    struct sigaction sa {};
    sa.sa_handler = on_launch_signal;
    sigemptyset(&sa.sa_mask);
    g_forward_signal.store(0);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalHandlers() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// The ranks started so far and what became of them: the fail-all and signal rules of dist/launcher.h.
class Ranks {
 public:
  explicit Ranks(const LaunchOptions& o) : o_(o) {}

  void add(pid_t pid) {
    index_[pid] = pids_.size();
    pids_.push_back(pid);
    running_.push_back(true);
    ++left_;
  }
  std::size_t started() const { return pids_.size(); }
  std::size_t left() const { return left_; }
  int result() const { return result_; }
  // A rank failed or the start was stopped: start no more ranks.
  bool stopping() const { return failed_ || start_stopped_; }

  // A signal the launcher received while every rank runs: passed on to each.
  void forward(int sig) {
    forwarded_ = sig;
    signal_running(sig);
  }
  // A signal received before every rank was started (dist/launcher.h): the launch ends with 128 + sig whatever
  // the ranks' codes, and the started ranks get the signal now and SIGKILL after the grace period.
  void stop_start(int sig) {
    spdlog::warn("launch: signal {} before every rank was started ({} of {} started); stopping them", sig,
                 pids_.size(), o_.nproc_per_node);
    result_ = 128 + sig;
    stop_started(sig);
  }
  // A fork that failed: the launch throws once the started ranks, stopped like a failed rank's peers, have ended.
  void stop_for_fork_failure() { stop_started(SIGTERM); }

  // Reaps every rank that has ended; returns whether one had.
  bool reap() {
    bool any = false;
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      const auto it = index_.find(pid);
      if (it == index_.end() || !running_[it->second]) continue;
      running_[it->second] = false;
      --left_;
      any = true;
      on_exit(it->second, status);
    }
    return any;
  }
  // SIGKILL to the ranks still running once the grace period of a stop has passed (once).
  void kill_if_due() {
    if (killed_ || kill_at_ == std::chrono::steady_clock::time_point{} ||
        std::chrono::steady_clock::now() < kill_at_)
      return;
    signal_running(SIGKILL);
    killed_ = true;
  }

 private:
  // No more ranks start; the started ones get `sig` now and SIGKILL after the grace period.
  void stop_started(int sig) {
    start_stopped_ = true;
    kill_at_ = std::chrono::steady_clock::now() + o_.grace;
    signal_running(sig);
  }
  void signal_running(int sig) {
    for (std::size_t i = 0; i < pids_.size(); ++i)
      if (running_[i]) ::kill(-pids_[i], sig);
  }
  void on_exit(std::size_t i, int status) {
    const int code = exit_code_of(status);
    const int rank = o_.node_rank * o_.nproc_per_node + static_cast<int>(i);
    if (start_stopped_) return;  // the launch's code is already decided
    if (forwarded_ != 0 && code == 128 + forwarded_ && !failed_) {
      // A rank that stopped on the forwarded signal (hadatrain train: after the step the ranks agreed on, its
      // checkpoint written) is not a failure: the others stop on the same signal, and a second one would end
      // them at once (hadatrain train's second-signal rule), before they have reported their stop.
      if (result_ == 0) result_ = code;
      spdlog::info("launch: rank {} stopped on the forwarded signal {}", rank, forwarded_);
      return;
    }
    if (code != 0 && !failed_) {  // the first failure: its code is the launch's
      result_ = code;
      failed_ = true;
      kill_at_ = std::chrono::steady_clock::now() + o_.grace;
      spdlog::error("launch: rank {} {} {}{}", rank, WIFEXITED(status) ? "exited with code" : "was killed by signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                    left_ == 0 ? "" : fmt::format("; stopping the other {} rank(s) on this node", left_));
      signal_running(SIGTERM);
    }
  }

  const LaunchOptions& o_;
  std::vector<pid_t> pids_;
  std::vector<bool> running_;
  std::unordered_map<pid_t, std::size_t> index_;
  std::size_t left_ = 0;
  int result_ = 0;
  bool failed_ = false, start_stopped_ = false, killed_ = false;
  int forwarded_ = 0;  // the last signal forwarded to the ranks
  std::chrono::steady_clock::time_point kill_at_{};  // SIGKILL to the rest from then on; unset: no stop yet
};

}  // namespace

int max_local_ranks() {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::clamp<long>(cpus, 1024, INT_MAX));
}

int launch(const LaunchOptions& o) {
  HT_CHECK(!o.argv.empty(), "launch: no program to run (give it after --)");
  HT_CHECK(o.nproc_per_node >= 1 && o.nproc_per_node <= max_local_ranks(),
           "launch: --nproc-per-node {} is not from 1 to {} (the larger of 1024 and this machine's CPUs)",
           o.nproc_per_node, max_local_ranks());
  HT_CHECK(o.nnodes >= 1, "launch: --nnodes {} must be at least 1", o.nnodes);
  HT_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank {} is not from 0 to --nnodes - 1 = {}",
           o.node_rank, o.nnodes - 1);
  HT_CHECK(static_cast<int64_t>(o.nnodes) * o.nproc_per_node <= INT_MAX,
           "launch: --nnodes {} x --nproc-per-node {} is more than {} ranks (RANK and WORLD_SIZE are ints)", o.nnodes,
           o.nproc_per_node, INT_MAX);
  HT_CHECK(o.master_port >= 0 && o.master_port <= 65535,
           "launch: --master-port {} is not a TCP port (1 to 65535, or 0 for a free one)", o.master_port);
  HT_CHECK(o.nnodes == 1 || (o.master_port != 0 && !o.master_addr.empty()),
           "launch: several nodes need --master-addr and --master-port (the same on every node; got {} and {})",
           o.master_addr.empty() ? "none" : o.master_addr, o.master_port);
  const int port = o.master_port != 0 ? o.master_port : pick_free_port();
  const std::string master_addr = o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
  const int world = o.nnodes * o.nproc_per_node;

  const SignalHandlers handlers;
  std::vector<char*> args;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  // SIGINT and SIGTERM wait (blocked) across each fork: a child resets them to their defaults before it unblocks
  // them, so a signal sent to its group at once ends it rather than reaching the launcher's handler in the child,
  // and one sent to the launcher meanwhile is handled after the fork, with the new rank counted.
  sigset_t stop_signals, mask_before;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  Ranks ranks(o);
  std::string fork_error;  // why a fork failed, thrown once the ranks started before it have ended
  [[maybe_unused]] const pid_t launcher = ::getpid();  // the ranks' parent (the parent-death signal below)
  for (int local = 0; local < o.nproc_per_node; ++local) {
    if (const int sig = g_forward_signal.exchange(0); sig != 0) ranks.stop_start(sig);
    ranks.reap();
    if (ranks.stopping()) break;
    ::pthread_sigmask(SIG_BLOCK, &stop_signals, &mask_before);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: stopping a rank stops what it started too
#ifdef __linux__
      // A launcher that dies without stopping the ranks (SIGKILL) stops them still (dist/launcher.h); one that died
      // before this call is no longer the parent.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);
#endif
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::pthread_sigmask(SIG_SETMASK, &mask_before, nullptr);
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
    if (pid < 0) fork_error = fmt::format("launch: fork of local rank {} failed: {}", local, std::strerror(errno));
    if (pid > 0) {
      ::setpgid(pid, pid);  // also here, so a signal sent right after the fork reaches the group
      ranks.add(pid);
    }
    ::pthread_sigmask(SIG_SETMASK, &mask_before, nullptr);
    if (pid < 0) {
      spdlog::error("{}; stopping the {} rank(s) started", fork_error, ranks.started());
      ranks.stop_for_fork_failure();
      break;
    }
  }
  if (!ranks.stopping())
    spdlog::info("launch: {} rank(s) of {} started on this node (MASTER_ADDR {} MASTER_PORT {})", ranks.started(),
                 world, master_addr, port);

  while (ranks.left() > 0) {
    if (const int sig = g_forward_signal.exchange(0); sig != 0) ranks.forward(sig);
    if (ranks.reap()) continue;
    ranks.kill_if_due();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  HT_CHECK(fork_error.empty(), "{} (the {} rank(s) started before it were stopped)", fork_error, ranks.started());
  return ranks.result();
}

}  // namespace ht::dist
