// run_ranks and its helpers (dist_testing.h).
#include "dist_testing.h"
#include "dist_trainer_testing.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/dist/data_parallel.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/trainer.h"
#include "support/testing.h"

namespace ht::test {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

void expect(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

std::vector<RankOutcome> run_ranks(int n, const std::function<void(const dist::DistEnv&)>& body,
                                   std::chrono::seconds limit) {
  const int port = free_port();
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(dist::DistEnv{.rank = r, .world_size = n, .local_rank = r, .master_addr = "127.0.0.1",
                           .master_port = port, .source = "test"});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> out(n);
  std::vector<bool> done(n, false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        out[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        std::fprintf(stderr, "rank %d: still running after %lld s: killed\n", r, static_cast<long long>(limit.count()));
        out[r].exit_code = 124;
        done[r] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

std::string exit_codes(const std::vector<RankOutcome>& outcomes) {
  std::string s;
  for (const auto& o : outcomes) s += (s.empty() ? "" : " ") + std::to_string(o.exit_code);
  return s;
}

bool all_passed(const std::vector<RankOutcome>& outcomes) {
  for (const auto& o : outcomes)
    if (o.exit_code != 0) return false;
  return true;
}

train::TrainerConfig idx8_config(const std::string& file, const std::string& yaml, const std::string& run_name,
                                 std::vector<std::string> sets) {
  const std::filesystem::path path = scratch_dir() / file;
  const std::filesystem::path tmp = scratch_dir() / (file + ".tmp" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp);
    out << fmt::format(fmt::runtime(yaml), fmt::arg("root", idx8_dataset().string()));
    HT_CHECK(out.good(), "cannot write {}", tmp.string());
  }
  std::filesystem::rename(tmp, path);
  sets.push_back("run.out_dir=" + (scratch_dir() / run_name).string());
  return train::load_trainer_config(path.string(), sets);
}

std::vector<RankOutcome> run_stop_seen_by_rank0(const std::function<train::TrainerConfig()>& config, int signal) {
  return run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    const std::atomic<int> stop{env.rank == 0 ? signal : 0};
    const train::TrainResult r = train::run_training(config(), {}, &stop);
    expect(r.stopped_by == signal && r.steps == 2 && std::filesystem::path(r.checkpoint).filename() == "step_2",
           fmt::format("stopped by {} after {} steps, checkpoint {}", r.stopped_by, r.steps, r.checkpoint));
  });
}

RuleBatch rule_batch(Generator& gen, int64_t batch, int64_t seq, int64_t vocab) {
  const std::vector<double> draws =
      uniform({batch, seq}, 0, static_cast<double>(vocab), gen).to(DType::f64).to_vector<double>();
  std::vector<int64_t> ids, targets;
  for (double d : draws) {
    ids.push_back(static_cast<int64_t>(d));
    targets.push_back((7 * ids.back() + 3) % vocab);
  }
  return {from_vector(ids, {batch, seq}, {DType::i64}), from_vector(targets, {batch, seq}, {DType::i64})};
}

void set_rank_env(const dist::DistEnv& env) {
  ::setenv("RANK", std::to_string(env.rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(env.world_size).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(env.local_rank).c_str(), 1);
  ::setenv("MASTER_ADDR", env.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(env.master_port).c_str(), 1);
}

double keep_rank_rows(RuleBatch& batch, const dist::Communicator* comm) {
  if (comm == nullptr) return 1.0;
  const int64_t rows = batch.ids.size(0);
  const auto s = data::row_slice(rows, comm->rank(), comm->size());
  batch.ids = batch.ids.narrow(0, s.start, s.rows);
  batch.targets = batch.targets.narrow(0, s.start, s.rows);
  return static_cast<double>(s.rows) / static_cast<double>(rows);
}

}  // namespace ht::test
