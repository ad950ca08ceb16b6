// Sharded data parallelism (dist.mode: fsdp), built on the parameter store's materialise seam (Note
// [Materialising parameters] in nn/parameter_store.h). Every parameter is flattened, padded to a multiple
// of the world size N and cut into N equal chunks; rank r keeps chunk r as its fp32 master shard (a frozen
// parameter's in its own dtype), and the optimiser runs over a store of those shards, so master weights,
// gradients and optimiser state take about 1/N of their unsharded memory per rank (Note [Sharded parameters]).
//
// Note [Sharded parameters]
// FsdpPolicy replaces the model store's policy. A layer's materialise(param, dtype) all-gathers the
// parameter's unit (the parameters whose names start with one of FsdpOptions::units; a parameter that
// matches none is in one unit with the other parameters of its module) the first time one of its parameters
// is read in a step: every chunk of every
// parameter of the unit is gathered in one pass (the collectives issued together, then waited), and the
// gathered tensor of this parameter is returned, cast to the compute dtype, with a backward node whose
// input is the shard: in backward the full gradient is weighted by this rank's share of the global batch
// (Note [Data-parallel equivalence] in data_parallel.h), cast to the reduce dtype, reduce-scattered (sum)
// and its chunk accumulated into the shard's gradient. With prefetch on, issuing a unit's gather also
// issues the next unit's, so it is in flight while the current unit computes. The module slots keep no
// values (a zero-element tensor holds each slot's place), so the unsharded copy exists only while gathered.
// end_step() (after the optimiser step) drops the gathered copies, so the next step gathers the new
// weights.
// A frozen parameter (requires_grad false when the store is sharded: train.freeze, a LoRA base) is sharded and
// gathered like the others, in its own dtype (a bf16 frozen matrix, nn::store_frozen_in, travels and is
// gathered as bf16 whatever gather_dtype says, except that int8 / fp8 rows quantise it), but its shard stays
// frozen: its reads make no gather node, so it gets no gradient, no reduce-scatter and no optimiser state.
//
// Note [Resharding after forward]
// With reshard_after_forward off, a unit's gathered tensors stay alive from its forward to end_step(): the
// layers' saved tensors hold them, so during a step up to the whole model is gathered on every rank. With it
// on (the default, as FSDP2's fully_shard):
//   - Forward: the first read of a unit other than the current one ends the current unit's forward and frees
//     the memory of its gathered tensors (and of their casts to compute dtypes): their storages stay, shared
//     by whatever the layers saved for backward, but hold no bytes. The units are recorded in the order the
//     forward enters them (a unit read again later, e.g. a tied embedding read by the head, is entered again
//     and gathered again). The last unit of the forward stays gathered: backward starts with it.
//   - Backward: a gather node (the backward of one materialise) runs after every op that read its tensor
//     (they are its inputs' consumers in the graph); when a parameter's last gather node has run, its memory
//     is freed again. The unit the forward entered before unit u is gathered again into the same storages
//     (and waited for) when the gather node of u's first-read parameter runs: that parameter's layer ran
//     first in u's forward, so its backward ends u's; with prefetch, that gather is issued earlier, when u's
//     first gather node runs. This relies on the engine running a layer's weight-gradient node before the
//     layer that produced its activation: the engine's ready stack (last in, first out) runs the nodes an op's
//     backward makes ready in reverse edge order, and ops list their activation input before their weight.
//     The reshard test checks the bits against keeping the weights.
//   - Activation checkpointing: the checkpointed forward (grad mode off) frees as above and records no
//     first-read parameter; the recompute in backward reads the unit again, which gathers it at once, and
//     the unit below it is gathered when the recompute's first gather node runs.
//   - Frozen parameters have no gather node to drive this. A unit whose forward read only frozen parameters
//     with grad mode on (a frozen norm, embedding or head) is not freed in forward: its readers may have saved
//     its weights for their input gradients. A unit the forward leaves by such a read is freed only when a
//     later read makes a gather node; that node's entry gathers it again in backward (gather_ahead goes on
//     below entries of frozen-only units), and with no such read (the forward's top units are frozen) it stays
//     gathered. A unit's frozen parameters are freed when the backward reaches a gather node of an entry
//     below every entry of the unit (the readers above have given their input gradients, which that node's
//     layer needed). The LoRA test (test_dist_lora) checks the bits against keeping the weights, and that a
//     decoder block's bytes stay free at the peak.
//   - The graph's gather nodes are counted; when the last is destroyed (the graph is gone), the next read
//     starts a new forward (gradient accumulation's next micro-step).
// gathered_bytes() / gathered_bytes_peak() measure it: the bytes of gathered tensors (and casts) that hold
// memory now, and the high-water mark over every allocation since reset_gathered_peak().
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/dist/communicator.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/nn/parameter_store.h"

namespace ht::dist {

struct FsdpOptions {
  std::vector<std::string> units;  // name prefixes ("layer1.", "blocks.3."): one all-gather per unit
  DType reduce_dtype = DType::f32;  // the gradient reduce-scatter's dtype (f32 or bf16)
  bool prefetch = true;             // issue the next unit's all-gather with the current one's
  // Free a unit's gathered weights after its forward and gather them again in backward (Note [Resharding
  // after forward]); off: they stay gathered until end_step().
  bool reshard_after_forward = true;
  // Low-precision communication (docs/distributed.md; Note [Low-precision FSDP gathers] in src/dist/fsdp_lowp.h):
  // what the shards travel as in the all-gathers (int8 / fp8: HQ-FSDP's rotated 8-bit rows for the weights of
  // the units), and the quantised gradient reduce-scatter instead of reduce_dtype's (block-wise codes, one f32
  // scale per reduce_quant_block values; its error against f32 measured every reduce_quant_error_every steps,
  // 0: never).
  GatherDType gather_dtype = GatherDType::f32;
  ReduceQuant reduce_quant = ReduceQuant::none;
  int64_t reduce_quant_block = 256;
  int64_t reduce_quant_error_every = 100;
};

class FsdpPolicy;
class FsdpLowPrecision;

// The sharded state of a model. Build it after the model (its weights are rank 0's afterwards), then build
// the optimiser over shard_store().
class FullyShardedModel {
 public:
  FullyShardedModel(Communicator& comm, std::shared_ptr<nn::ParameterStore> model_store, FsdpOptions options);
  ~FullyShardedModel();

  // The store of the master shards (names and decay flags as the model's): give it to the optimiser.
  std::shared_ptr<nn::ParameterStore> shard_store() const { return shards_; }
  // This rank's weight in the gradient sum of the next backward (its share of the global batch; 1/N default).
  void set_share(double share);
  // After the optimiser step: drops the gathered weights (the next forward gathers the updated shards).
  void end_step();
  // Gradient accumulation without communication on early micro-steps (FSDP's no_sync): while on, a backward
  // adds each parameter's share-weighted full gradient to a local f32 buffer (the unsharded gradient's
  // memory, per rank, until the step's reduce) and gives the shard a zero gradient; reduce_deferred() then
  // reduce-scatters every buffer once into the shards' gradients and frees the buffers.
  void set_defer_reduce(bool on) { defer_ = on; }
  void reduce_deferred();
  // Clips the shards' gradients by the norm over all ranks (every rank computes the same norm); returns it.
  double clip_grad_norm(double max_norm);
  // The whole model's parameters (gathered, master dtype) by name, on every rank: a plain checkpoint.
  std::map<std::string, Tensor> full_state() const;
  // Loads whole parameters (as full_state gives, from a run with any world size) into this rank's shards.
  void load_full_state(const std::map<std::string, Tensor>& state);
  // The optimiser state of the shard store gathered whole, by "<param name>.<slot>" (as
  // ParameterStore::state_tensors names it), and its inverse; slots not created yet are left out.
  std::map<std::string, Tensor> full_optimizer_state() const;
  void load_full_optimizer_state(const std::map<std::string, Tensor>& state);
  // Whole optimiser state (as full_optimizer_state gives) cut into this rank's chunks, by the same names,
  // for Optimizer::load_state_tensors; no collective.
  std::map<std::string, Tensor> shard_optimizer_state(const std::map<std::string, Tensor>& state) const;

  // Sharded checkpoint: every rank writes <dir>/shard-<rank>-of-<N>.safetensors atomically (its shards of the
  // parameters and of the optimiser state; metadata: world size, rank, each tensor's shape and elements per
  // rank, and `step` when given).
  void save_sharded(const std::filesystem::path& dir, int64_t step = -1) const;

  struct Param {
    std::string name;
    Shape shape;
    int64_t numel = 0, chunk = 0;  // chunk: elements per rank (numel padded to N * chunk)
    std::size_t unit = 0;
    Tensor shard;                  // (chunk) f32 leaf: the optimiser's parameter
  };
  const std::vector<Param>& params() const { return params_; }
  std::size_t units() const { return unit_count_; }
  // Bytes this rank put into collectives since the last end_step() (all-gather inputs, reduce-scatter inputs).
  int64_t bytes_on_wire() const { return bytes_; }
  // Parameters whose all-gather moves 8-bit rows (gather_dtype int8 / fp8), and the relative L2 error of the
  // quantised reduce-scatter against f32 on the last measured step (-1: none measured yet).
  int64_t row_quantized_params() const;
  double reduce_error() const;
  // How many steps measured that error so far (it changes when a step's end_step() measured one).
  int64_t reduce_error_steps() const;
  // Bytes of gathered parameters (and their casts) holding memory now, and their high-water mark since the
  // last reset_gathered_peak() (Note [Resharding after forward]).
  int64_t gathered_bytes() const;
  int64_t gathered_bytes_peak() const;
  void reset_gathered_peak();

 private:
  friend class FsdpPolicy;
  Communicator& comm_;
  std::shared_ptr<nn::ParameterStore> model_store_;
  std::shared_ptr<nn::ParameterStore> shards_;
  std::shared_ptr<FsdpPolicy> policy_;
  FsdpOptions options_;
  std::vector<Param> params_;
  std::size_t unit_count_ = 0;
  double share_ = 1.0;
  bool defer_ = false;
  std::vector<Tensor> deferred_;  // per parameter: the accumulated full gradient while defer_ is on
  mutable int64_t bytes_ = 0;
  std::unique_ptr<FsdpLowPrecision> lowp_;  // the all-gathers' and reduce-scatters' formats
};

// A sharded checkpoint made whole, in one process (no communicator): the N shard files of `dir` read and
// their chunks joined, parameters and optimiser state by name as full_state() and full_optimizer_state()
// give them; `model` and `optimizer` of the result can be written as a plain checkpoint or loaded by a run
// with any world size. The shard files must be one save's (Note [One save's shards] in
// src/dist/fsdp_checkpoint.cpp): missing ones, those of several world sizes, of different steps or with
// different tensors are errors naming the folder, the files and what differs.
struct ConsolidatedState {
  std::map<std::string, Tensor> model, optimizer;
  int world_size = 0;
  int64_t step = -1;  // the step the shards record (save_sharded's `step`); -1 when they record none
};
ConsolidatedState consolidate_sharded(const std::filesystem::path& dir);

// True when a checkpoint directory holds shard-<rank>-of-<N>.safetensors files (checkpoint.sharded).
bool has_shards(const std::filesystem::path& dir);
// A loaded checkpoint made whole when its directory holds shards: their parameters, frozen ones included, join
// ck.model's tensors (model.safetensors holds the rest: the buffers) and their optimiser state becomes
// ck.optimizer, so that it loads like a plain checkpoint on any world size and in any dist.mode. Shards of
// another step than ck.model's "step" metadata (model.safetensors) are an error naming the folder. A plain
// checkpoint is left as it is.
void consolidate_checkpoint(io::Checkpoint& ck);

}  // namespace ht::dist
