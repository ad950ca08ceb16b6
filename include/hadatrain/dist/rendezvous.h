// Rendezvous from the launcher's environment: the variables torchrun (and `hadatrain launch`) set — RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT — or, when those are absent, Slurm's — SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, and the first host of SLURM_STEP_NODELIST (else SLURM_NODELIST, else
// SLURM_JOB_NODELIST) as the server unless MASTER_ADDR is set. No variables at all means one process (rank 0
// of 1). A ProcessGroup is that placement, the store every rank reaches and the job's communicator.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "hadatrain/dist/communicator.h"
#include "hadatrain/dist/store.h"

namespace ht::dist {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "none";  // "torchrun" (the torchrun variables), "slurm" or "none"
};

// Reads the placement through `getenv` (the process environment by default). Inconsistent or malformed
// values (RANK >= WORLD_SIZE, a port that is no number) are errors naming the variable.
using GetEnv = std::function<std::optional<std::string>(const std::string&)>;
DistEnv dist_env_from_environment(const GetEnv& getenv = {});

// The first host of a Slurm node list: "gpu[003-004,010],cpu01" -> "gpu003".
std::string first_slurm_host(const std::string& nodelist);

struct ProcessGroupOptions {
  std::string engine;  // "gloo" or "nccl"; empty: nccl for a CUDA device, gloo otherwise
  Device device = Device::cpu();
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

struct ProcessGroup {
  DistEnv env;
  std::unique_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
};

// Connects this process to the job's other ranks: rank 0 serves the store, every rank builds `engine`'s
// communicator over it.
ProcessGroup init_process_group(const DistEnv& env, const ProcessGroupOptions& options);

// Every rank's text (its resolved config, say) compared with rank 0's through the store: an error on every
// rank naming the first rank d whose text differs, what differs and the other ranks that differ too. `what` names
// the text. `describe(rank 0's text, rank d's text, d)` says what differs; without it, both texts in full ("rank 2
// has X but rank 0 has Y"). Digests travel always, the texts only when they differ (Note [Comparing the ranks'
// configs] in src/dist/rendezvous.cpp).
using DescribeDifference = std::function<std::string(const std::string& reference, const std::string& other, int rank)>;
void check_same_on_all_ranks(Store& store, const DistEnv& env, const std::string& what, const std::string& text,
                             const DescribeDifference& describe = {});

}  // namespace ht::dist
