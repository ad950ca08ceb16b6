// Rendezvous from the environment (dist/rendezvous.h): torchrun's variables or Slurm's, the store on rank 0
// and the job's communicator.
#include "hadatrain/dist/rendezvous.h"

#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"

namespace ht::dist {
namespace {

int parse_int(const std::string& name, const std::string& value) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HT_CHECK(used == value.size() && !value.empty(), "environment variable {}='{}' is not an integer", name, value);
  return v;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets; a bracket holds ranges "003-004,010" of which the
  // first number (with its zero padding) is the first host's suffix.
  int depth = 0;
  std::size_t end = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  const std::size_t open = first.find('[');
  if (open == std::string::npos) return first;
  const std::size_t close = first.find(']', open);
  HT_CHECK(close != std::string::npos, "SLURM_NODELIST '{}': unbalanced '['", nodelist);
  const std::string ranges = first.substr(open + 1, close - open - 1);
  const std::size_t stop = ranges.find_first_of("-,");
  return first.substr(0, open) + ranges.substr(0, stop) + first.substr(close + 1);
}

DistEnv dist_env_from_environment(const GetEnv& getenv_fn) {
  const GetEnv get = getenv_fn ? getenv_fn : [](const std::string& n) -> std::optional<std::string> {
    const char* v = std::getenv(n.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
  DistEnv env;
  auto integer = [&](const std::string& name) { return parse_int(name, *get(name)); };
  if (get("RANK") || get("WORLD_SIZE")) {
    HT_CHECK(get("RANK") && get("WORLD_SIZE"), "{} is set but {} is not: a launcher sets both",
             get("RANK") ? "RANK" : "WORLD_SIZE", get("RANK") ? "WORLD_SIZE" : "RANK");
    env.source = "torchrun";
    env.rank = integer("RANK");
    env.world_size = integer("WORLD_SIZE");
    env.local_rank = get("LOCAL_RANK") ? integer("LOCAL_RANK") : env.rank;
  } else if (get("SLURM_PROCID") && get("SLURM_NTASKS")) {
    env.source = "slurm";
    env.rank = integer("SLURM_PROCID");
    env.world_size = integer("SLURM_NTASKS");
    env.local_rank = get("SLURM_LOCALID") ? integer("SLURM_LOCALID") : 0;
    const auto nodes = get("SLURM_STEP_NODELIST") ? get("SLURM_STEP_NODELIST")
                       : get("SLURM_NODELIST")    ? get("SLURM_NODELIST")
                                                  : get("SLURM_JOB_NODELIST");
    if (nodes && !nodes->empty()) env.master_addr = first_slurm_host(*nodes);
  } else {
    return env;
  }
  if (const auto a = get("MASTER_ADDR")) env.master_addr = *a;
  if (const auto p = get("MASTER_PORT")) env.master_port = integer("MASTER_PORT");
  HT_CHECK(env.world_size >= 1, "WORLD_SIZE {} ({} variables): expected at least 1", env.world_size, env.source);
  HT_CHECK(env.rank >= 0 && env.rank < env.world_size, "RANK {} is not below WORLD_SIZE {} ({} variables)", env.rank,
           env.world_size, env.source);
  HT_CHECK(env.local_rank >= 0, "LOCAL_RANK {} is negative", env.local_rank);
  HT_CHECK(env.master_port > 0 && env.master_port < 65536, "MASTER_PORT {} is not a TCP port", env.master_port);
  return env;
}

ProcessGroup init_process_group(const DistEnv& env, const ProcessGroupOptions& options) {
  ProcessGroup pg;
  pg.env = env;
  pg.store = std::make_unique<TcpStore>(TcpStoreOptions{.host = env.master_addr,
                                                        .port = env.master_port,
                                                        .is_server = env.rank == 0,
                                                        .world_size = env.world_size,
                                                        .timeout = options.timeout});
  const std::string engine = !options.engine.empty() ? options.engine : options.device.is_cuda() ? "nccl" : "gloo";
  pg.comm = make_communicator(*pg.store, {.engine = engine,
                                          .rank = env.rank,
                                          .size = env.world_size,
                                          .device = options.device,
                                          .timeout = options.timeout,
                                          .prefix = "world"});
  return pg;
}

// Note [Comparing the ranks' configs]
// Every rank publishes a 64-bit digest of its text and reads every rank's (N small keys per rank, as before any
// collective exists), so all ranks find the same first rank d that differs from rank 0 and all fail together.
// The texts themselves (a resolved config is a few kB) travel only then: rank 0 and rank d publish theirs and
// every rank reads those two, so a matching job moves digests alone, and a mismatch two texts per rank, not N.
// `describe` turns the two texts into what differs (the config's keys and values, train/distributed.cpp).
void check_same_on_all_ranks(Store& store, const DistEnv& env, const std::string& what, const std::string& text,
                             const DescribeDifference& describe) {
  const std::string key = "check/" + what + "/";
  store.set_string(key + std::to_string(env.rank), fmt::format("{:016x}", Fnv1a().add(text).value()));
  const std::string reference = store.get_string(key + "0");
  std::vector<int> differ;
  for (int r = 1; r < env.world_size; ++r)
    if (store.get_string(key + std::to_string(r)) != reference) differ.push_back(r);
  if (differ.empty()) return;
  const int d = differ[0];
  if (env.rank == 0 || env.rank == d) store.set_string(key + "text/" + std::to_string(env.rank), text);
  const std::string mine0 = env.rank == 0 ? text : store.get_string(key + "text/0");
  const std::string other = env.rank == d ? text : store.get_string(key + "text/" + std::to_string(d));
  const std::string how =
      describe ? describe(mine0, other, d) : fmt::format("rank {} has {} but rank 0 has {}", d, other, mine0);
  const std::string more =
      differ.size() == 1 ? "" : fmt::format(" (rank(s) {} differ from rank 0 too)",
                                            fmt::join(differ.begin() + 1, differ.end(), ", "));
  HT_FAIL("the ranks disagree on the {}: {}{}; every rank must run the same command (check the arguments and --set "
          "overrides of rank {})",
          what, how, more, d);
}

}  // namespace ht::dist
