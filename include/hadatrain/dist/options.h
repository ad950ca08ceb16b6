// The `dist:` section of a training config: how a run spreads over the ranks its launcher started
// (docs/distributed.md lists every key).
#pragma once
#include <string>

#include "hadatrain/core/config_reader.h"

namespace ht::dist {

// none: one process (WORLD_SIZE must be 1 or unset); ddp: replicated data parallelism (data_parallel.h).
enum class DistMode { none, ddp };

struct DistOptions {
  DistMode mode = DistMode::none;
  std::string engine;       // gloo | nccl; empty: nccl for train.device cuda, gloo for cpu
  double timeout_s = 300;   // a collective or rendezvous wait longer than this is an error
  double bucket_mb = 25;    // ddp: gradient all-reduce bucket size
};

DistOptions read_dist_options(ConfigReader r);
const char* dist_mode_name(DistMode m);

}  // namespace ht::dist
