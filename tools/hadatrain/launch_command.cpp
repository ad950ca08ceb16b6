// `hadatrain launch`: runs a hadatrain command once per local rank with torchrun's variables
// (dist/launcher.h), e.g. `hadatrain launch --nproc-per-node 2 -- train --config c.yaml`; and
// `hadatrain comm-check`: every collective of the job's communicator run once and its result checked, the
// smallest test that a launch (torchrun, Slurm, hadatrain launch) connects its ranks.
#include <unistd.h>

#include <chrono>
#include <climits>

#include <fmt/ranges.h>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/dist/launcher.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/tensor/factory.h"

namespace ht::cli {
namespace {

// This program's own path, so the children run the same build.
std::string self_path(const char* fallback) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return fallback;
  buf[n] = 0;
  return buf;
}

struct CheckOptions {
  std::string engine;
  std::string device = "cpu";
  int64_t elements = 1 << 20;
  double timeout_s = 60;
};

// comm-check's ranges. --elements: at least one element, so every rank's reduce-scatter chunk has one to check; at
// most 2^40 (4 TiB of f32, past any device's memory), far from overflowing the element and byte counts.
// --timeout-s: whole milliseconds from 1 ms (less is 0 ms, no wait at all) to a day.
constexpr int64_t kMaxCheckElements = int64_t{1} << 40;
constexpr double kMinTimeoutS = 1e-3, kMaxTimeoutS = 86400;

int run_comm_check(const CheckOptions& o) {
  const dist::DistEnv env = dist::dist_env_from_environment();
  // --device is cpu or cuda, and --engine fits it (checked as the command line is read: add_comm_check_command).
  const Device device = o.device == "cuda" ? Device::cuda(env.local_rank) : Device::cpu();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  dist::ProcessGroup pg = dist::init_process_group(env, {.engine = o.engine, .device = device, .timeout = timeout});
  dist::Communicator& c = *pg.comm;
  const int n = c.size(), r = c.rank();
  const int64_t len = (o.elements + n - 1) / n * n;
  // Rank r holds r+1 everywhere: the sum is n(n+1)/2, the max n, rank q's gathered chunk q+1.
  Tensor t = full({len}, r + 1, {DType::f32, device});
  const auto t0 = std::chrono::steady_clock::now();
  c.all_reduce(t, dist::ReduceOp::sum)->synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double sum = n * (n + 1) / 2.0;
  const Tensor host = t.to(Device::cpu());
  for (int64_t i = 0; i < len; i += std::max<int64_t>(1, len / 97))
    HT_CHECK(host.data<float>()[i] == sum, "comm-check: all_reduce gave {} at {}, expected {}", host.data<float>()[i], i, sum);
  Tensor chunk = zeros({len / n}, {DType::f32, device});
  c.reduce_scatter(full({len}, r + 1, {DType::f32, device}), chunk, dist::ReduceOp::max)->synchronize();
  HT_CHECK(chunk.to(Device::cpu()).data<float>()[0] == n, "comm-check: reduce_scatter (max) wrong");
  Tensor gathered = zeros({n * 4}, {DType::bf16, device});
  c.all_gather(full({4}, r + 1, {DType::bf16, device}), gathered)->synchronize();
  const Tensor g = gathered.to(DType::f32).to(Device::cpu());
  for (int q = 0; q < n; ++q) HT_CHECK(g.data<float>()[q * 4] == q + 1, "comm-check: all_gather chunk {} wrong", q);
  // all_to_all: rank r sends r·n + q to rank q (2 values each); rank r receives q·n + r from rank q.
  std::vector<float> sends(2 * n);
  for (int q = 0; q < n; ++q) sends[2 * q] = sends[2 * q + 1] = static_cast<float>(r * n + q);
  Tensor received = zeros({2 * n}, {DType::f32, device});
  c.all_to_all(from_vector(sends, {2 * n}).to(device), received)->synchronize();
  const Tensor a2a = received.to(Device::cpu());
  for (int q = 0; q < n; ++q)
    HT_CHECK(a2a.data<float>()[2 * q + 1] == static_cast<float>(q * n + r), "comm-check: all_to_all chunk from rank {} wrong", q);
  Tensor b = full({3}, r, {DType::f32, device});
  c.broadcast(b, n - 1)->synchronize();
  HT_CHECK(b.to(Device::cpu()).data<float>()[2] == n - 1, "comm-check: broadcast wrong");
  c.barrier();
  // Ring all-reduce bus bandwidth: 2(n-1)/n of the bytes per rank cross a link.
  const double bus = secs > 0 ? 2.0 * (n - 1) / n * len * 4 / secs / 1e9 : 0.0;
  fmt::print("comm-check: rank {} of {} ({} variables, {} on {}): all_reduce, reduce_scatter, all_gather, all_to_all, "
             "broadcast, barrier correct; all_reduce of {} MB in {:.3f} ms ({:.2f} GB/s bus)\n",
             r, n, env.source, c.engine(), to_string(device), len * 4 / 1e6, secs * 1e3, bus);
  return 0;
}

}  // namespace

// Note [Checks before the ranks start]
// What every rank would fail on at its start is found by the launcher, once, before it starts any: a usage error in
// the ranks' command line (parsed as a rank parses it: exit code 2, as the rank's would be), and then what the
// command's check_launch finds (train and eval: the config file loaded and validated with its --set overrides, as
// the command loads it; train: dist.mode none in a job of several ranks). Such an error is reported as the rank
// would report it ("error: ...", exit code 1), followed by the command and "no rank was started", instead of once
// per rank after every rank has started. A command without a check_launch (comm-check, version, ...) starts as
// before. What the check cannot see (a missing dataset, a checkpoint that does not load, another node's
// command) still fails in the ranks, and the launcher stops them all (dist/launcher.h).
Command add_launch_command(CLI::App& app,
                           std::function<LaunchCheck(const std::vector<std::string>&)> parse_rank_command) {
  struct State {
    dist::LaunchOptions options;
    std::vector<std::string> rest;
    LaunchCheck check;  // the ranks' command's check_launch
  };
  auto s = std::make_shared<State>();
  Command c;
  c.app = app.add_subcommand("launch",
                             "Run a hadatrain command once per rank on this node with torchrun's variables "
                             "(e.g. launch --nproc-per-node 2 -- train --config c.yaml)");
  const int max_ranks = dist::max_local_ranks();
  c.app->add_option("--nproc-per-node", s->options.nproc_per_node,
                    fmt::format("Ranks (processes) on this node, 1 .. {} (the larger of 1024 and this machine's CPUs)",
                                max_ranks))
      ->required();
  c.app->add_option("--nnodes", s->options.nnodes, "Nodes in the job (one launch per node)");
  c.app->add_option("--node-rank", s->options.node_rank, "This node's index, 0 .. nnodes-1");
  c.app->add_option("--master-addr", s->options.master_addr,
                    "Rank 0's host (MASTER_ADDR); default 127.0.0.1, required with --nnodes > 1");
  c.app->add_option("--master-port", s->options.master_port,
                    "Rank 0's store port (MASTER_PORT), 1 .. 65535; 0: a free port (one node only)");
  c.app->add_option("command", s->rest, "The hadatrain command and its arguments, after --")->required();
  c.app->positionals_at_end();
  // The ranges of dist/launcher.h, as usage errors before anything starts; then a usage error in the ranks' command
  // stops the launch here, once, instead of in every rank it would start.
  c.app->parse_complete_callback([s, max_ranks, parse = std::move(parse_rank_command)] {
    const dist::LaunchOptions& o = s->options;
    check_option_range("--nproc-per-node", o.nproc_per_node, 1, max_ranks,
                       "the larger of 1024 and this machine's CPUs");
    check_option_range("--nnodes", o.nnodes, 1, INT_MAX / o.nproc_per_node,
                       fmt::format("--nnodes x --nproc-per-node {} is at most {} ranks", o.nproc_per_node, INT_MAX));
    check_option_range("--node-rank", o.node_rank, 0, o.nnodes - 1, fmt::format("--nnodes {}", o.nnodes));
    check_option_range("--master-port", o.master_port, 0, 65535, "0: a free port");
    if (o.nnodes > 1 && (o.master_port == 0 || o.master_addr.empty()))
      throw CLI::ValidationError("--nnodes " + std::to_string(o.nnodes),
                                 fmt::format("several nodes need --master-addr and --master-port, the same on every "
                                             "node (got {} and {})",
                                             o.master_addr.empty() ? "none" : o.master_addr, o.master_port));
    s->check = parse(s->rest);
  });
  c.run = [s, argv0 = std::string("hadatrain")] {
    dist::LaunchOptions o = s->options;
    if (s->check) {  // Note [Checks before the ranks start]
      // Quietly: what loading the config logs (a --set's dropped keys) rank 0 logs again once it runs.
      const spdlog::level::level_enum level = spdlog::get_level();
      spdlog::set_level(spdlog::level::err);
      try {
        s->check(o.nproc_per_node * o.nnodes);
      } catch (const Error& e) {
        throw Error(fmt::format("{} (in the command each rank runs: {}; no rank was started)", e.what(),
                                fmt::join(s->rest, " ")));
      }
      spdlog::set_level(level);
    }
    o.argv = {self_path(argv0.c_str())};
    o.argv.insert(o.argv.end(), s->rest.begin(), s->rest.end());
    return dist::launch(o);
  };
  return c;
}

Command add_comm_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  Command c;
  c.app = app.add_subcommand("comm-check",
                             "Connect to the job's ranks (torchrun/Slurm/launch variables) and check every collective");
  c.app->add_option("--engine", o->engine, "gloo or nccl (default: nccl on cuda, gloo on cpu)")
      ->check(choice_check({"gloo", "nccl"}));
  c.app->add_option("--device", o->device, "cpu, or cuda (the device LOCAL_RANK)")
      ->check(choice_check({"cpu", "cuda"}))
      ->capture_default_str();
  c.app->add_option("--elements", o->elements, "f32 elements of the timed all-reduce")
      ->check(integer_check(1, kMaxCheckElements))
      ->capture_default_str();
  c.app->add_option("--timeout-s", o->timeout_s, "Seconds before a missing rank is an error")
      ->check(number_check(fmt::format("a number from {} to {}", kMinTimeoutS, kMaxTimeoutS),
                           [](double t) { return t >= kMinTimeoutS && t <= kMaxTimeoutS; }))
      ->capture_default_str();
  // Gloo moves CPU tensors and NCCL CUDA tensors (dist/communicator.h): another pairing is a usage error too.
  c.app->parse_complete_callback([o] {
    if (o->engine == "gloo" && o->device != "cpu")
      throw CLI::ValidationError("--engine gloo", "Gloo moves CPU tensors, got --device " + o->device +
                                                      " (use --device cpu, or --engine nccl on CUDA)");
    if (o->engine == "nccl" && o->device != "cuda")
      throw CLI::ValidationError("--engine nccl", "NCCL moves CUDA tensors, got --device " + o->device +
                                                      " (use --device cuda, or --engine gloo on the CPU)");
  });
  c.run = [o] { return run_comm_check(*o); };
  return c;
}

}  // namespace ht::cli
