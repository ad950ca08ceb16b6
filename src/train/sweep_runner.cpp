// Running a sweep plan (train/sweep.h): each run is a child process of the same binary (`hadatrain train`
// with the run's --set overrides), its output in <run dir>/sweep.log; up to `parallel` at once within a stage,
// stages one after another. Then the tables, the accuracy records and the curves.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "hadatrain/core/error.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/train/sweep.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;
constexpr const char* kDoneFile = "sweep_done.json";

std::vector<std::string> command_of(const SweepRun& run, const std::string& exe, bool resume) {
  std::vector<std::string> argv{exe, "train", "--config", run.config};
  for (const std::string& o : run.overrides) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  if (resume) argv.push_back("--resume=latest");
  return argv;
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    const bool plain = a.find_first_of(" '\"$\\*?[]{}()<>|&;") == std::string::npos && !a.empty();
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return s;
}

pid_t spawn(const std::vector<std::string>& argv, const fs::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  HT_CHECK(pid >= 0, "sweep: fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(args[0], args.data());
    std::fprintf(stderr, "sweep: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

std::string git_commit() {
  if (const char* c = std::getenv("HADATRAIN_COMMIT"); c && *c) return c;
  std::string out;
  if (FILE* p = popen("git describe --always --dirty 2>/dev/null", "r")) {
    char buf[128];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// Accuracy records (docs/results/README.md) of the finished runs, with the pipeline and seed their saved
// config.yaml names. `machine` is $HADATRAIN_MACHINE (e.g. "1x NVIDIA H200 (driver ..., CUDA 13.0), 16 CPU cores"),
// else the CPU core count; `commit` is $HADATRAIN_COMMIT, else `git describe --always --dirty`.
std::string accuracy_records(const SweepPlan& plan, const std::vector<SweepRow>& rows) {
  const std::string machine = std::getenv("HADATRAIN_MACHINE") ? std::getenv("HADATRAIN_MACHINE")
                                                                : fmt::format("{} CPU cores", std::thread::hardware_concurrency());
  const std::string commit = git_commit(), date = today();
  // Rows of one stage that differ in more than pipeline and seed (e.g. from scratch vs fine-tuned) are told
  // apart by the grid values other than those two, added to the recipe.
  auto variant = [](const SweepRow& r) {
    std::string v;
    for (const auto& [k, val] : r.values)
      if (k != "grad_pipeline.default.name" && k != "run.seed" && k != "config") v += (v.empty() ? "" : ", ") + k + "=" + val;
    return v;
  };
  auto recipe = [&](const SweepRow& r) {
    const std::string v = variant(r);
    return fmt::format("{}: {}{}", plan.recipe, r.stage, v.empty() ? "" : " (" + v + ")");
  };
  std::map<std::string, double> exact;  // "<recipe>|<seed>" -> exact top-1
  for (const SweepRow& r : rows)
    if (r.final_top1 && r.pipeline == "exact") exact[recipe(r) + "|" + std::to_string(r.seed)] = *r.final_top1;
  std::string out;
  for (const SweepRow& r : rows) {
    if (r.pipeline.empty() || !r.final_top1 || r.status != "done") continue;
    nlohmann::ordered_json j;
    j["area"] = "accuracy";
    j["recipe"] = recipe(r);
    j["pipeline"] = r.pipeline;
    j["seed"] = r.seed;
    j["top1"] = std::round(*r.final_top1 * 100.0) / 100.0;
    if (const auto it = exact.find(recipe(r) + "|" + std::to_string(r.seed)); it != exact.end() && r.pipeline != "exact")
      j["exact_top1"] = std::round(it->second * 100.0) / 100.0;
    j["date"] = date;
    j["commit"] = commit;
    j["machine"] = machine;
    j["command"] = fmt::format("hadatrain sweep --plan {}", plan.source);
    j["metrics"] = (plan.out_dir / r.run / "metrics.jsonl").string();  // move it under docs/runs/ to publish it
    out += j.dump() + "\n";
  }
  return out;
}

fs::path plot_script(const std::string& exe) {
  for (const fs::path& p : {fs::path("tools/plot_metrics.py"), fs::path(exe).parent_path() / "../../tools/plot_metrics.py"}) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
  }
  return {};
}

void plot_stages(const SweepPlan& plan, const std::string& exe) {
  const fs::path script = plot_script(exe);
  if (script.empty() || access("/usr/bin/python3", X_OK) != 0) {
    spdlog::warn("sweep: no curves (tools/plot_metrics.py or /usr/bin/python3 not found)");
    return;
  }
  for (const std::string& stage : plan.stages) {
    // The options and every --label first, then "--" and the runs: argparse takes the positional runs in one
    // piece only, so runs interleaved with labels would not parse.
    std::vector<std::string> argv{"/usr/bin/python3", script.string(), "--out", (plan.out_dir / (stage + ".png")).string()};
    std::vector<std::string> runs;
    for (const SweepRun& r : plan.runs) {
      std::error_code ec;
      if (r.stage != stage || !fs::exists(r.dir / "metrics.jsonl", ec)) continue;
      argv.push_back("--label");
      argv.push_back(r.name);
      runs.push_back((r.dir / "metrics.jsonl").string());
    }
    if (runs.empty()) continue;
    argv.push_back("--");
    argv.insert(argv.end(), runs.begin(), runs.end());
    const fs::path log = plan.out_dir / "plot.log";
    const pid_t pid = spawn(argv, log);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) spdlog::info("sweep: curves of stage {} in {}", stage, argv[3]);
    else
      spdlog::warn("sweep: no curves for stage {}: {} {} (it needs python3 with matplotlib; its output is in {})", stage,
                   script.string(), WIFEXITED(status) ? fmt::format("exited with {}", WEXITSTATUS(status)) : "was killed",
                   log.string());
  }
}

}  // namespace

int run_sweep(const SweepPlan& plan, const SweepOptions& o) {
  const std::string exe = o.executable.empty() ? fs::read_symlink("/proc/self/exe").string() : o.executable;
  if (!o.dry_run) io::create_output_directory(plan.out_dir, "sweep out_dir");
  std::map<std::string, std::string> status;  // run name -> done / failed (exit N) / skipped
  for (const std::string& stage : plan.stages) {
    std::vector<const SweepRun*> todo;
    for (const SweepRun& r : plan.runs) {
      if (r.stage != stage || !r.selected) continue;
      std::error_code ec;
      if (fs::exists(r.dir / kDoneFile, ec)) {
        spdlog::info("sweep: {} finished earlier; skipped", r.name);
        status[r.name] = "done";
        continue;
      }
      todo.push_back(&r);
    }
    std::map<pid_t, const SweepRun*> running;
    std::size_t next = 0;
    while (next < todo.size() || !running.empty()) {
      while (next < todo.size() && static_cast<int>(running.size()) < plan.parallel) {
        const SweepRun& r = *todo[next++];
        const bool resume = o.resume && io::latest_checkpoint_step(r.dir / "checkpoints").has_value();
        const auto argv = command_of(r, exe, resume);
        spdlog::info("sweep: {} {}: {}", resume ? "resuming" : "starting", r.name, shell_line(argv));
        if (o.dry_run) {
          status[r.name] = "not run";
          continue;
        }
        io::create_output_directory(r.dir, "sweep run " + r.name);
        running.emplace(spawn(argv, r.dir / "sweep.log"), &r);
      }
      if (running.empty()) break;
      int st = 0;
      const pid_t pid = waitpid(-1, &st, 0);
      if (pid < 0) {
        if (errno == EINTR) continue;
        HT_FAIL("sweep: waitpid failed: {}", std::strerror(errno));
      }
      const auto it = running.find(pid);
      if (it == running.end()) continue;
      const SweepRun& r = *it->second;
      running.erase(it);
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        io::write_file_atomic(r.dir / kDoneFile, nlohmann::json{{"run", r.name}, {"date", today()}}.dump() + "\n");
        status[r.name] = "done";
        spdlog::info("sweep: {} done", r.name);
      } else {
        const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        status[r.name] = fmt::format("failed (exit {})", code);
        spdlog::error("sweep: {} failed with exit {}; its output: {}", r.name, code, (r.dir / "sweep.log").string());
      }
    }
  }
  std::vector<SweepRow> rows;
  int failed = 0;
  for (const SweepRun& r : plan.runs) {
    if (!r.selected) continue;
    const std::string s = status.count(r.name) ? status[r.name] : "not run";
    failed += s.rfind("failed", 0) == 0 ? 1 : 0;
    rows.push_back(read_sweep_row(r, s));
  }
  if (o.dry_run) return 0;
  io::write_file_atomic(plan.out_dir / "results.md", sweep_markdown(plan, rows));
  io::write_file_atomic(plan.out_dir / "results.csv", sweep_csv(plan, rows));
  io::write_file_atomic(plan.out_dir / "accuracy.jsonl", accuracy_records(plan, rows));
  spdlog::info("sweep: {} run(s), {} failed; tables {} and {}, results-page records {}", rows.size(), failed,
               (plan.out_dir / "results.md").string(), (plan.out_dir / "results.csv").string(),
               (plan.out_dir / "accuracy.jsonl").string());
  plot_stages(plan, exe);
  return failed;
}

}  // namespace ht::train
