// The trainer's side of data parallelism (dist.mode: ddp or fsdp; docs/distributed.md): joins the job's
// ranks from the launcher's variables, checks that every rank resolved the same config, starts every rank
// from rank 0's weights, hands each rank its slice of a global batch and, after backward, sums the gradients
// (and the logged loss) over the ranks: all-reduced (ddp) or reduce-scattered into this rank's shards
// (fsdp, dist/fsdp.h). Internal to src/train.
#pragma once
#include <memory>

#include "hadatrain/data/loader.h"
#include "hadatrain/dist/data_parallel.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/dist/options.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/nn/parameter_store.h"
#include "checkpointer.h"

namespace ht::train {

struct TrainerConfig;
class Task;

class DistributedRun {
 public:
  // Null for a one-process run (dist.mode none and no launcher variables, or WORLD_SIZE 1 with mode none).
  // dist.mode none under a launcher with WORLD_SIZE > 1 is an error (every rank would train alone).
  static std::unique_ptr<DistributedRun> start(const TrainerConfig& cfg);
  // `hadatrain eval` under a launcher (Note [Sharded evaluation]): null for one process (WORLD_SIZE 1); else joins
  // the ranks whatever dist.mode says (each rank holds the whole model; evaluation uses can_shard_evaluation,
  // broadcast_buffers and sum_over_ranks only) and checks that every rank resolved the same config and evaluates
  // the same `evaluated` (the checkpoint argument and which weights).
  static std::unique_ptr<DistributedRun> start_evaluation(const TrainerConfig& cfg, const std::string& evaluated);

  int rank() const { return pg_.env.rank; }
  int local_rank() const { return pg_.env.local_rank; }
  bool launched() const { return pg_.env.source != "none"; }
  int world_size() const { return pg_.env.world_size; }
  bool sharded() const { return options_.mode == dist::DistMode::fsdp; }
  // fsdp: shards the model's store (FullyShardedModel; every rank takes rank 0's parameters) and returns
  // the store of this rank's master shards, for the optimiser. `grad_accum_steps` > 1: gradients are
  // accumulated locally and reduce-scattered once, in after_backward.
  std::shared_ptr<nn::ParameterStore> shard(std::shared_ptr<nn::ParameterStore> model_store, int64_t grad_accum_steps);
  // After the model and optimiser exist: ddp: every rank takes rank 0's parameters and buffers.
  void attach(nn::ParameterStore& store);
  // fsdp: the clipping by the gradient norm over every rank's shards (returns that norm); after the
  // optimiser step, end_step drops the gathered weights. Null for ddp.
  dist::FullyShardedModel* fsdp() const { return fsdp_.get(); }
  // fsdp: the checkpointer's view of the sharded model (checkpointer.h): whole tensors gathered from every
  // rank for a plain checkpoint that rank 0 writes (any world size resumes it), cut into this rank's shards
  // on resume. `model` keeps the buffers, which are not sharded (frozen parameters are sharded too).
  // `shard_files` (checkpoint.sharded): every rank writes its own shards instead (nothing is gathered).
  ShardedState sharded_state(nn::Module& model, bool shard_files) const;
  // This rank's part in a checkpoint save (checkpointer.h): rank 0 writes; every rank learns every rank's outcome.
  RankRole rank_role() const;
  // This rank's rows of a global batch; remembers its share for after_backward: its slice's loss weight
  // (Task::loss_weight: images, or tokens with a label) over the whole batch's, which every rank computes
  // from the global batch it holds, so no collective is needed. A batch the loader made as this rank's slice
  // (Batch::global_rows, for a task whose rows are its units) is returned as it is, its share its rows' share.
  data::Batch slice(const data::Batch& batch, const Task& task);
  // The micro-batches every rank runs in the step of the last slice() with train.grad_accum_steps `k`:
  // min(k, floor(G/N)) for a global batch of G rows, the rows of the smallest slice (Note [Micro-batches on every
  // rank] in step_runner.h).
  int64_t micro_batches(int64_t k) const;
  // ddp: before the step's last backward, so that the buckets are all-reduced as backward fills them (Note
  // [Reduction during backward] in dist/data_parallel.cpp; dist.reduce_in_backward false: after it). Nothing
  // under fsdp, which reduce-scatters each gradient as backward produces it.
  void before_last_backward();
  // The gradients summed over ranks (weighted by the shares: Note [Data-parallel equivalence]); returns the
  // global batch's loss from this rank's `loss` (its slice's mean loss, no history).
  Tensor after_backward(const Tensor& loss);
  // Bytes on the wire (dist/communicator.h, Note [Bytes on the wire]): end_step() adds what this rank's
  // collectives sent since slice() began the step to the window; take_comm_bytes(steps) returns the window's
  // per-step means for metrics.jsonl (comm_bytes: sent by this rank over all kinds; comm_bytes_<kind>: per
  // collective kind) and starts a new window. Collectives between steps (evaluation, checkpoints, agreed_stop)
  // are not in it. Under fsdp with dist.reduce_quant it also returns reduce_quant_rel_error, the quantised
  // reduce-scatter's relative L2 error against f32 on the window's last measured step
  // (dist.reduce_quant_error_every), when a step of the window measured it.
  void end_step();
  std::vector<std::pair<std::string, double>> take_comm_bytes(int64_t steps);

  // Evaluation (Note [Sharded evaluation]): whether a test set of `rows` rows in batches of `batch_size` can be
  // cut over the ranks batch by batch (every batch has a row for every rank); broadcast_buffers gives every rank
  // rank 0's buffers (batch norm's running statistics, which each rank updated from its own rows);
  // sum_over_ranks adds `values` over the ranks in place.
  bool can_shard_evaluation(int64_t rows, int64_t batch_size) const;
  void broadcast_buffers(nn::Module& model);
  void sum_over_ranks(std::vector<double>& values);

  // Note [Agreeing on a stop]: called by every rank after every step with its own stop request (the signal, 0 for
  // none); returns the largest request of any rank at the previous step, the same on every rank, so that all stop
  // (and save) after the same step. settle_stop() waits for the last poll's collective (the end of the step loop).
  int agreed_stop(int request);
  void settle_stop();

 private:
  DistributedRun(dist::ProcessGroup pg, dist::DistOptions options) : pg_(std::move(pg)), options_(options) {}
  dist::ProcessGroup pg_;
  dist::DistOptions options_;
  std::unique_ptr<dist::GradientReducer> reducer_;
  std::unique_ptr<dist::FullyShardedModel> fsdp_;
  double share_ = 1.0;
  int64_t global_rows_ = 0;  // the last slice()'s global batch
  dist::CommBytes step_start_, window_;
  int64_t reported_error_steps_ = 0;  // fsdp's reduce_error_steps() at the last take_comm_bytes
  Tensor stop_flag_;                     // the last agreed_stop's request, becoming the max over the ranks
  std::unique_ptr<dist::Work> stop_work_;
  // On a CUDA communicator: stop_flag_ copied to pinned host memory on the current stream, and an event after it
  // (Note [Agreeing on a stop]); null on Gloo.
  struct StopCopy;
  std::shared_ptr<StopCopy> stop_copy_;
  int wait_stop();  // the last agreed_stop's result, once its collective and copy have run
};

// dist.fsdp_units empty: one unit per transformer block or ResNet stage, from the parameter names: the
// prefix through the first name part that is a number ("model.layers.3.") or a word ending in digits
// ("layer2."); a parameter with neither shares a unit with the other parameters of its module
// (dist::FullyShardedModel).
std::vector<std::string> fsdp_auto_units(const nn::ParameterStore& store);

// This rank's view of the run's config: on rank 0 (or without dist_run) the config itself; on rank r > 0
// run.out_dir becomes <run.out_dir>/rank<r> (its own log and metrics, the global batch's losses like rank
// 0's), it writes no checkpoints (rank 0's hold the same weights) and resumes from rank 0's checkpoint.dir;
// on CUDA under a launcher, train.device is the GPU LOCAL_RANK.
TrainerConfig rank_config(const TrainerConfig& cfg, const DistributedRun* dist_run);

// What differs between two ranks' resolved configs (YAML text): each key whose value differs, "optim.lr: rank 1
// has 0.2, rank 0 has 0.1", joined by "; " (at most 8, then how many more); a key only one config holds is "no such
// key" in the other. `rank` is the rank of `other`.
std::string config_difference(const std::string& reference, const std::string& other, int rank);

}  // namespace ht::train
