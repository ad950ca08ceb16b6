// The trainer's side of data parallelism (distributed.h).
#include "distributed.h"

#include <filesystem>

#include <spdlog/spdlog.h>

#include "hadatrain/core/error.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {

std::string stable_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

TrainerConfig rank_config(const TrainerConfig& cfg, const DistributedRun* dist_run) {
  TrainerConfig c = cfg;
  if (!dist_run) return c;
  if (c.train.device.is_cuda() && dist_run->launched()) c.train.device = Device::cuda(dist_run->local_rank());
  if (dist_run->rank() == 0) return c;
  c.run.out_dir = (std::filesystem::path(cfg.run.out_dir) / fmt::format("rank{}", dist_run->rank())).string();
  c.checkpoint.every_epochs = 0;
  c.checkpoint.every_steps = 0;
  return c;
}

std::unique_ptr<DistributedRun> DistributedRun::start(const TrainerConfig& cfg) {
  dist::DistEnv env = dist::dist_env_from_environment();
  if (env.source == "none") env.master_port = 0;  // one process: its own store on a free port
  if (cfg.dist.mode == dist::DistMode::none) {
    HT_CHECK(env.world_size == 1,
             "this process is rank {} of {} ({} variables) but dist.mode is none: every rank would train alone; set "
             "dist.mode: ddp",
             env.rank, env.world_size, env.source);
    return nullptr;
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
  Device device = cfg.train.device;
  // One process per GPU: with a launcher, rank r of this node uses GPU LOCAL_RANK.
  if (device.is_cuda() && env.source != "none") device = Device::cuda(env.local_rank);
  dist::ProcessGroup pg =
      dist::init_process_group(env, {.engine = cfg.dist.engine, .device = device, .timeout = timeout});
  // Rank 0's run.out_dir and the rest of the config must be every rank's: compare the resolved config.
  dist::check_same_on_all_ranks(*pg.store, env, "resolved config hash", stable_hash(cfg.resolved_yaml));
  spdlog::info("dist: rank {} of {} ({} variables, {} engine on {}), dist.mode {}; global batch {} cut over the ranks",
               env.rank, env.world_size, env.source, pg.comm->engine(), to_string(device),
               dist::dist_mode_name(cfg.dist.mode), cfg.data.batch_size);
  return std::unique_ptr<DistributedRun>(new DistributedRun(std::move(pg), cfg.dist));
}

void DistributedRun::attach(nn::ParameterStore& store) {
  reducer_ = std::make_unique<dist::GradientReducer>(*pg_.comm, store,
                                                     dist::GradientReducerOptions{.bucket_mb = options_.bucket_mb});
  reducer_->broadcast_state(0);
  int64_t bytes = 0;
  for (const auto& p : store.params()) bytes += static_cast<int64_t>(p.param->nbytes());
  spdlog::info("dist: gradients all-reduced in {} bucket(s) of at most {:g} MiB: {:.2f} MB into the all-reduce per "
               "step per rank", reducer_->buckets(), options_.bucket_mb, static_cast<double>(bytes) / 1e6);
}

data::Batch DistributedRun::slice(const data::Batch& batch, const Task& task) {
  const double total = task.loss_weight(batch);
  HT_CHECK(total > 0, "batch {} of epoch {} has no unit its loss is a mean over (every label ignored)",
           batch.position.batch + 1, batch.position.epoch + 1);
  data::Batch mine = dist::slice_batch(batch, dist::rank_slice(batch.size(), rank(), world_size()));
  share_ = task.loss_weight(mine) / total;
  return mine;
}

Tensor DistributedRun::after_backward(const Tensor& loss) {
  HT_ASSERT(reducer_, "DistributedRun::after_backward before attach");
  reducer_->reduce(share_);
  Tensor global = mul(loss.to(DType::f32), share_);
  pg_.comm->all_reduce(global, dist::ReduceOp::sum)->wait();
  return global;
}

}  // namespace ht::train
