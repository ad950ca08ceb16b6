// The one-node launcher behind `hadatrain launch`: starts nproc_per_node copies of a program with the
// variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the
// programs meet through dist/rendezvous.h as they would under torchrun. Each child leads its own process
// group, and signals go to the group (a rank's own subprocesses stop with it). It forwards SIGINT and
// SIGTERM to every child; when one child fails (a non-zero exit or a signal) it stops the others (SIGTERM, SIGKILL
// after a grace period) and returns the failed child's code, so no rank is left waiting for a dead peer.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace ht::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;       // several nodes: one launch per node, each with its node_rank and the same master
  int node_rank = 0;
  std::string master_addr;  // rank 0's host; empty: 127.0.0.1 (one node only: several must name it)
  int master_port = 0;  // 0: a free port of this machine (one node only)
  std::vector<std::string> argv;  // the program and its arguments, run once per local rank
  std::chrono::milliseconds grace{std::chrono::seconds(10)};  // SIGTERM to SIGKILL when stopping the others
};

// Runs the ranks to the end; returns 0 when all exited 0, else the first failure's exit code (128 + the
// signal for a child killed by one).
int launch(const LaunchOptions& options);

}  // namespace ht::dist
