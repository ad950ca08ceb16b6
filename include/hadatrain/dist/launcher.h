// The one-node launcher behind `hadatrain launch`: starts nproc_per_node copies of a program with the
// variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the
// programs meet through dist/rendezvous.h as they would under torchrun. Each child leads its own process
// group, and signals go to the group (a rank's own subprocesses stop with it). It forwards SIGINT and
// SIGTERM to every child; when one child fails (a non-zero exit or a signal) it stops the others (SIGTERM, SIGKILL
// after a grace period) and returns the failed child's code, so no rank is left waiting for a dead peer.
//
// While it starts the ranks it reaps, between two forks, the ranks that have ended and looks for a stop. A rank
// that fails then stops the start and the started ranks as above; SIGINT or SIGTERM received before every
// rank is started stops the start too: no rank of an incomplete job can pass the rendezvous, so the started ranks
// get the signal (SIGKILL after the grace period) and the launch returns 128 + the signal. The launcher reaps with
// waitpid(-1): the process that calls it has no other children to wait for while it runs.
//
// A launcher that ends without stopping its ranks (SIGKILL, the out-of-memory killer) does not leave them
// training on their own: on Linux every rank gets SIGTERM when the thread that started it ends (the parent-death
// signal), which hadatrain train takes as a stop request (all ranks stop after the same step and save). So call
// launch() from a thread that lives until it returns (the main thread in `hadatrain launch`).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace ht::dist {

struct LaunchOptions {
  int nproc_per_node = 1;  // 1 .. max_local_ranks()
  int nnodes = 1;       // several nodes: one launch per node, each with its node_rank and the same master
  int node_rank = 0;    // 0 .. nnodes - 1
  std::string master_addr;  // rank 0's host; empty: 127.0.0.1 (one node only: several must name it)
  int master_port = 0;  // a TCP port, 1 .. 65535; 0: a free port of this machine (one node only)
  std::vector<std::string> argv;  // the program and its arguments, run once per local rank
  std::chrono::milliseconds grace{std::chrono::seconds(10)};  // SIGTERM to SIGKILL when stopping the others
};

// The most ranks one launch starts on its node: the larger of 1024 and this machine's online CPUs. A rank is a
// process per GPU, or per core for a CPU job; a count past both is a typo (it would fork thousands of processes).
int max_local_ranks();

// Runs the ranks to the end; returns 0 when all exited 0, else the first failure's exit code (128 + the
// signal for a child killed by one), or 128 + the signal that stopped the start (above). Throws ht::Error for
// options outside the ranges above or a job of more than INT_MAX ranks (RANK and WORLD_SIZE are ints), and when a
// fork fails (after stopping the ranks already started).
int launch(const LaunchOptions& options);

}  // namespace ht::dist
