// The `dist:` section of a training config: how a run spreads over the ranks its launcher started
// (docs/distributed.md lists every key).
#pragma once
#include <string>
#include <vector>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/tensor/dtype.h"

namespace ht::dist {

// none: one process (WORLD_SIZE must be 1 or unset); ddp: replicated data parallelism (data_parallel.h);
// fsdp: sharded data parallelism (fsdp.h).
enum class DistMode { none, ddp, fsdp };

struct DistOptions {
  DistMode mode = DistMode::none;
  std::string engine;       // gloo | nccl; empty: nccl for train.device cuda, gloo for cpu
  double timeout_s = 300;   // a collective or rendezvous wait longer than this is an error
  double bucket_mb = 25;    // ddp: gradient all-reduce bucket size
  bool reduce_in_backward = true;  // ddp: all-reduce the buckets during backward (Note [Reduction during backward])
  // fsdp: name prefixes of the units (one all-gather each); empty: automatic (fsdp_auto_units in
  // train/distributed.h: one unit per transformer block or ResNet stage).
  std::vector<std::string> fsdp_units;
  DType reduce_dtype = DType::f32;   // fsdp: the gradient reduce-scatter's dtype (f32 | bf16)
  bool prefetch = true;              // fsdp: issue the next unit's all-gather with the current one's
  bool reshard_after_forward = true;  // fsdp: free a unit's gathered weights after its forward, gather in backward
  // fsdp, low-precision communication (dist/comm_quant.h): what the shards travel as in the all-gathers
  // (fp32 | bf16 | int8 | fp8: HQ-FSDP's rotated 8-bit rows for the units' weights), the quantised gradient
  // reduce-scatter (none | int8 | int4), its values per scale, and the steps between measurements of its error.
  GatherDType gather_dtype = GatherDType::f32;
  ReduceQuant reduce_quant = ReduceQuant::none;
  int64_t reduce_quant_block = 256;
  int64_t reduce_quant_error_every = 100;
};

DistOptions read_dist_options(ConfigReader r);
const char* dist_mode_name(DistMode m);

}  // namespace ht::dist
