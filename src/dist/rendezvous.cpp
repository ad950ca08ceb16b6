// Rendezvous from the environment (dist/rendezvous.h): torchrun's variables or Slurm's, the store on rank 0
// and the job's communicator.
#include "hadatrain/dist/rendezvous.h"

#include <cstdlib>

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

void check_same_on_all_ranks(Store& store, const DistEnv& env, const std::string& what, const std::string& text) {
  const std::string key = "check/" + what + "/";
  store.set_string(key + std::to_string(env.rank), text);
  const std::string reference = store.get_string(key + "0");
  for (int r = 1; r < env.world_size; ++r) {
    const std::string other = store.get_string(key + std::to_string(r));
    HT_CHECK(other == reference,
             "the ranks disagree on the {}: rank {} has {} but rank 0 has {}; every rank must run the same "
             "config (check the command line and --set overrides of rank {})",
             what, r, other, reference, r);
  }
}

}  // namespace ht::dist
