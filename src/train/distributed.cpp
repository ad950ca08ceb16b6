// The trainer's side of data parallelism (distributed.h).
#include "distributed.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#ifdef HADATRAIN_CUDA
#include <cuda_runtime_api.h>

#include "hadatrain/cuda/check.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/pinned_host.h"
#endif
#include "hadatrain/core/error.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {
namespace {

// `values` added over the ranks, in place (f64, one all-reduce on the communicator's device).
void sum_over(dist::Communicator& comm, std::vector<double>& values) {
  if (values.empty()) return;
  Tensor t = from_vector(values, {static_cast<int64_t>(values.size())}, {DType::f64, Device::cpu()}).to(comm.device());
  comm.all_reduce(t, dist::ReduceOp::sum)->synchronize();
  values = t.to(Device::cpu()).to_vector<double>();
}

// Every rank's `value` (a small integer), on every rank: a slot per rank, added over the ranks.
std::vector<int> every_ranks(dist::Communicator& comm, int value) {
  std::vector<double> slots(static_cast<std::size_t>(comm.size()), 0.0);
  slots[static_cast<std::size_t>(comm.rank())] = value;
  sum_over(comm, slots);
  return {slots.begin(), slots.end()};
}

// Returns when no rank has an `error`; else throws on every rank: this rank's error, or which ranks could not
// `what` (their own logs say why).
void throw_unless_every_rank_ok(dist::Communicator& comm, const std::string& error, const char* what) {
  const std::vector<int> failed = every_ranks(comm, error.empty() ? 0 : 1);
  std::vector<int> ranks;
  for (std::size_t r = 0; r < failed.size(); ++r)
    if (failed[r] != 0) ranks.push_back(static_cast<int>(r));
  if (ranks.empty()) return;
  if (!error.empty()) throw Error(error);
  throw Error(fmt::format("rank(s) {} could not {}", fmt::join(ranks, ", "), what));
}

// The resolved config as (dotted key, value) pairs in document order: a section's entries by key, a list of plain
// values as one value in flow style ([16, 16]), a list holding sections by index (grad_pipeline.rules.0.pattern).
void flatten_config(const YAML::Node& node, const std::string& path, std::vector<std::pair<std::string, std::string>>& out) {
  const auto at = [&](const std::string& key) { return path.empty() ? key : path + "." + key; };
  if (node.IsMap()) {
    for (const auto& kv : node) flatten_config(kv.second, at(kv.first.as<std::string>()), out);
    return;
  }
  const bool plain_list = node.IsSequence() && std::all_of(node.begin(), node.end(), [](const YAML::Node& e) {
                            return e.IsScalar() || e.IsNull();
                          });
  if (node.IsSequence() && !plain_list) {
    for (std::size_t i = 0; i < node.size(); ++i) flatten_config(node[i], at(std::to_string(i)), out);
    return;
  }
  YAML::Emitter text;
  text << YAML::Flow << node;
  out.emplace_back(path, text.c_str());
}

}  // namespace

std::string config_difference(const std::string& reference, const std::string& other, int rank) {
  std::vector<std::pair<std::string, std::string>> ref_values, other_values;
  flatten_config(YAML::Load(reference), "", ref_values);
  flatten_config(YAML::Load(other), "", other_values);
  const std::map<std::string, std::string> ref_map(ref_values.begin(), ref_values.end()),
      other_map(other_values.begin(), other_values.end());
  std::vector<std::string> keys;  // rank 0's order, then the keys only the other rank's config has
  for (const auto& [key, value] : ref_values) keys.push_back(key);
  for (const auto& [key, value] : other_values)
    if (!ref_map.count(key)) keys.push_back(key);
  const auto value = [](const std::map<std::string, std::string>& values, const std::string& key) {
    const auto it = values.find(key);
    return it == values.end() ? std::nullopt : std::optional(it->second);
  };
  const auto shown = [](const std::optional<std::string>& v) {
    if (!v) return std::string("no such key");
    return v->size() <= 80 ? *v : v->substr(0, 77) + "...";
  };
  std::vector<std::string> lines;
  for (const std::string& key : keys)
    if (const auto a = value(ref_map, key), b = value(other_map, key); a != b)
      lines.push_back(fmt::format("{}: rank {} has {}, rank 0 has {}", key, rank, shown(b), shown(a)));
  if (lines.empty()) return fmt::format("rank {}'s resolved config is written differently but no key differs", rank);
  constexpr std::size_t kShown = 8;
  std::string out = fmt::format("{}", fmt::join(lines.begin(), lines.begin() + std::min(lines.size(), kShown), "; "));
  if (lines.size() > kShown) out += fmt::format("; and {} more key(s)", lines.size() - kShown);
  return out;
}

TrainerConfig rank_config(const TrainerConfig& cfg, const DistributedRun* dist_run) {
  TrainerConfig c = cfg;
  if (!dist_run) return c;
  if (c.train.device.is_cuda() && dist_run->launched()) c.train.device = Device::cuda(dist_run->local_rank());
  if (dist_run->rank() == 0) return c;
  c.run.out_dir = (std::filesystem::path(cfg.run.out_dir) / fmt::format("rank{}", dist_run->rank())).string();
  // Every rank calls the checkpointer at the same steps (fsdp: it gathers with rank 0; ddp: it holds the same
  // replica): rank 0 writes, and all learn how the save went (DistributedRun::rank_role).
  return c;
}

namespace {

// Connects this process to the job's ranks (one process per GPU: with a launcher, rank r of a node uses its GPU
// LOCAL_RANK) and checks that every rank resolved the same config: rank 0's run.out_dir and the rest of the config
// must be every rank's (Note [Comparing the ranks' configs] in src/dist/rendezvous.cpp).
dist::ProcessGroup join_ranks(const TrainerConfig& cfg, const dist::DistEnv& env) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
  Device device = cfg.train.device;
  if (device.is_cuda() && env.source != "none") device = Device::cuda(env.local_rank);
  dist::ProcessGroup pg =
      dist::init_process_group(env, {.engine = cfg.dist.engine, .device = device, .timeout = timeout});
  dist::check_same_on_all_ranks(*pg.store, env, "resolved config", cfg.resolved_yaml, config_difference);
  return pg;
}

}  // namespace

std::unique_ptr<DistributedRun> DistributedRun::start(const TrainerConfig& cfg) {
  dist::DistEnv env = dist::dist_env_from_environment();
  if (env.source == "none") env.master_port = 0;  // one process: its own store on a free port
  if (cfg.dist.mode == dist::DistMode::none) {
    HT_CHECK(env.world_size == 1,
             "this process is rank {} of {} ({} variables) but dist.mode is none: every rank would train alone; set "
             "dist.mode: ddp or fsdp",
             env.rank, env.world_size, env.source);
    return nullptr;
  }
  dist::ProcessGroup pg = join_ranks(cfg, env);
  spdlog::info("dist: rank {} of {} ({} variables, {} engine on {}), dist.mode {}; global batch {} cut over the ranks",
               env.rank, env.world_size, env.source, pg.comm->engine(), to_string(pg.comm->device()),
               dist::dist_mode_name(cfg.dist.mode), cfg.data.batch_size);
  return std::unique_ptr<DistributedRun>(new DistributedRun(std::move(pg), cfg.dist));
}

std::unique_ptr<DistributedRun> DistributedRun::start_evaluation(const TrainerConfig& cfg, const std::string& evaluated) {
  const dist::DistEnv env = dist::dist_env_from_environment();
  if (env.world_size == 1) return nullptr;
  dist::ProcessGroup pg = join_ranks(cfg, env);
  dist::check_same_on_all_ranks(*pg.store, env, "checkpoint to evaluate", evaluated);
  spdlog::info("dist: rank {} of {} ({} variables, {} engine on {}): evaluating this rank's rows of every test batch; "
               "rank 0 reports the whole test set's figures",
               env.rank, env.world_size, env.source, pg.comm->engine(), to_string(pg.comm->device()));
  return std::unique_ptr<DistributedRun>(new DistributedRun(std::move(pg), cfg.dist));
}

std::vector<std::string> fsdp_auto_units(const nn::ParameterStore& store) {
  std::vector<std::string> units;
  for (const nn::ParamRef& ref : store.params()) {
    std::size_t start = 0;
    while (start < ref.name.size()) {
      const std::size_t dot = ref.name.find('.', start);
      if (dot == std::string::npos) break;  // the leaf name ("weight") never names a unit
      const std::string part = ref.name.substr(start, dot - start);
      const bool number = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
      const bool word_digits = part.size() > 1 && ::isdigit(static_cast<unsigned char>(part.back())) &&
                               ::isalpha(static_cast<unsigned char>(part.front()));
      if (number || word_digits) {
        const std::string prefix = ref.name.substr(0, dot + 1);
        if (std::find(units.begin(), units.end(), prefix) == units.end()) units.push_back(prefix);
        break;
      }
      start = dot + 1;
    }
  }
  return units;
}

std::shared_ptr<nn::ParameterStore> DistributedRun::shard(std::shared_ptr<nn::ParameterStore> model_store,
                                                          int64_t grad_accum_steps) {
  HT_ASSERT(sharded() && !fsdp_, "DistributedRun::shard outside dist.mode fsdp or twice");
  const std::vector<std::string> units = options_.fsdp_units.empty() ? fsdp_auto_units(*model_store) : options_.fsdp_units;
  fsdp_ = std::make_unique<dist::FullyShardedModel>(
      *pg_.comm, model_store,
      dist::FsdpOptions{.units = units,
                        .reduce_dtype = options_.reduce_dtype,
                        .prefetch = options_.prefetch,
                        .reshard_after_forward = options_.reshard_after_forward,
                        .gather_dtype = options_.gather_dtype,
                        .reduce_quant = options_.reduce_quant,
                        .reduce_quant_block = options_.reduce_quant_block,
                        .reduce_quant_error_every = options_.reduce_quant_error_every});
  fsdp_->set_defer_reduce(grad_accum_steps > 1);
  int64_t whole = 0, mine = 0;
  for (const auto& p : fsdp_->params()) whole += p.numel, mine += p.chunk;
  spdlog::info("dist: fsdp over {} rank(s): {} unit(s) ({}), {} of {} parameter elements per rank (fp32 master, "
               "gradients and optimiser state sharded), reduce-scatter in {}, prefetch {}, reshard_after_forward {}{}",
               world_size(), fsdp_->units(), options_.fsdp_units.empty() ? "automatic" : "dist.fsdp_units", mine, whole,
               options_.reduce_dtype == DType::bf16 ? "bf16" : "fp32", options_.prefetch ? "on" : "off",
               options_.reshard_after_forward ? "on" : "off",
               grad_accum_steps > 1 ? "; gradient accumulation communicates on the last micro-step" : "");
  if (options_.gather_dtype != dist::GatherDType::f32 || options_.reduce_quant != dist::ReduceQuant::none)
    spdlog::info("dist: weights all-gathered in {} ({} parameter(s) as rotated 8-bit rows), gradients reduce-scattered "
                 "{}{}",
                 dist::gather_dtype_name(options_.gather_dtype), fsdp_->row_quantized_params(),
                 options_.reduce_quant == dist::ReduceQuant::none ? "unquantised"
                                                                 : fmt::format("as {} blocks of {}",
                                                                               dist::reduce_quant_name(options_.reduce_quant),
                                                                               options_.reduce_quant_block),
                 options_.reduce_quant == dist::ReduceQuant::none || options_.reduce_quant_error_every == 0
                     ? ""
                     : fmt::format(" (error against f32 measured every {} steps)", options_.reduce_quant_error_every));
  return fsdp_->shard_store();
}

ShardedState DistributedRun::sharded_state(nn::Module& model, bool shard_files) const {
  HT_ASSERT(fsdp_, "DistributedRun::sharded_state outside dist.mode fsdp");
  dist::FullyShardedModel* f = fsdp_.get();
  ShardedState s;
  s.model = [f, &model] {
    std::map<std::string, Tensor> out = model.state_dict();  // buffers and the sharded parameters' empty slots
    for (auto& [name, t] : f->full_state()) out[name] = t;
    return out;
  };
  s.optimizer = [f] { return f->full_optimizer_state(); };
  s.load_model = [f, &model](const std::map<std::string, Tensor>& whole) {
    std::map<std::string, Tensor> sharded, rest;
    for (const auto& [name, t] : whole) {
      const bool is_shard = std::any_of(f->params().begin(), f->params().end(),
                                        [&](const dist::FullyShardedModel::Param& p) { return p.name == name; });
      (is_shard ? sharded : rest).emplace(name, t);
    }
    f->load_full_state(sharded);  // names every parameter the checkpoint lacks
    model.load_state_dict(rest, nn::StrictLoad::no);
  };
  s.shard_optimizer = [f](const std::map<std::string, Tensor>& whole) { return f->shard_optimizer_state(whole); };
  if (!shard_files) return s;
  dist::Communicator* comm = pg_.comm.get();
  s.write_shards = [f, comm](const std::filesystem::path& dir, int64_t step) {
    // In place of barriers, every rank learns whether every rank got through, so that a rank that fails throws
    // here with all the others rather than leaving them in a collective it never joins.
    std::string error;
    if (comm->rank() == 0) {  // a fresh folder: shards of an interrupted save of this step go
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      std::filesystem::create_directories(dir, ec);
      if (ec) error = fmt::format("cannot create {} for the ranks' shards: {}", dir.string(), ec.message());
    }
    throw_unless_every_rank_ok(*comm, error, "make the shard folder");
    try {
      f->save_sharded(dir, step);  // this rank's file, written atomically (temporary file, fsync, rename)
    } catch (const Error& e) {
      error = e.what();
    }
    throw_unless_every_rank_ok(*comm, error, "write its shard");  // every rank's file is durable
    std::vector<std::filesystem::path> files;
    for (int r = 0; r < comm->size(); ++r)
      files.push_back(dir / fmt::format("shard-{}-of-{}.safetensors", r, comm->size()));
    return files;
  };
  s.unsharded = [f, &model] {
    std::map<std::string, Tensor> out = model.state_dict();  // buffers and the sharded parameters' empty slots
    for (const auto& p : f->params()) out.erase(p.name);
    return out;
  };
  return s;
}

void DistributedRun::attach(nn::ParameterStore& store) {
  if (fsdp_) return;  // FullyShardedModel started every rank from rank 0's parameters
  reducer_ = std::make_unique<dist::GradientReducer>(*pg_.comm, store,
                                                     dist::GradientReducerOptions{.bucket_mb = options_.bucket_mb});
  reducer_->broadcast_state(0);
  spdlog::info("dist: gradients all-reduced in {} bucket(s) of at most {:g} MiB {} the backward: {:.2f} MB into the "
               "all-reduce per step per rank", reducer_->buckets(), options_.bucket_mb,
               options_.reduce_in_backward ? "during" : "after", static_cast<double>(reducer_->bucket_bytes()) / 1e6);
}

data::Batch DistributedRun::slice(const data::Batch& batch, const Task& task) {
  if (batch.global_rows > 0) {  // the loader made this rank's rows only (Note [Sliced batches] in data/loader.cpp)
    HT_ASSERT(task.rows_are_units(), "a sliced batch for a task whose rows weigh differently");
    const data::RowSlice s = data::row_slice(batch.global_rows, rank(), world_size());
    HT_ASSERT(batch.size() == s.rows, "rank {} holds {} rows of a {}-row batch, expected {}", rank(), batch.size(),
              batch.global_rows, s.rows);
    step_start_ = pg_.comm->bytes();
    global_rows_ = batch.global_rows;
    share_ = static_cast<double>(s.rows) / static_cast<double>(batch.global_rows);
    if (fsdp_) fsdp_->set_share(share_);
    return batch;
  }
  const double total = task.loss_weight(batch);
  HT_CHECK(total > 0, "batch {} of epoch {} has no unit its loss is a mean over (every label ignored)",
           batch.position.batch + 1, batch.position.epoch + 1);
  step_start_ = pg_.comm->bytes();
  global_rows_ = batch.size();
  data::Batch mine = data::slice_rows(batch, data::row_slice(batch.size(), rank(), world_size()));
  share_ = task.loss_weight(mine) / total;
  if (fsdp_) fsdp_->set_share(share_);
  return mine;
}

int64_t DistributedRun::micro_batches(int64_t k) const {
  HT_ASSERT(global_rows_ >= world_size(), "micro_batches before slice() or of a batch with fewer rows than ranks");
  return std::min(k, global_rows_ / world_size());
}

void DistributedRun::before_last_backward() {
  if (reducer_ && options_.reduce_in_backward) reducer_->arm(share_);
}

Tensor DistributedRun::after_backward(const Tensor& loss) {
  HT_ASSERT(reducer_ || fsdp_, "DistributedRun::after_backward before attach");
  if (reducer_) reducer_->reduce(share_);
  else fsdp_->reduce_deferred();  // nothing deferred without gradient accumulation
  Tensor global = mul(loss.to(DType::f32), share_);
  pg_.comm->all_reduce(global, dist::ReduceOp::sum)->wait();
  return global;
}

void DistributedRun::end_step() {
  const dist::CommBytes& now = pg_.comm->bytes();
  for (int k = 0; k < dist::kCollectiveKinds; ++k) {
    window_.sent[k] += now.sent[k] - step_start_.sent[k];
    window_.received[k] += now.received[k] - step_start_.received[k];
  }
}

std::vector<std::pair<std::string, double>> DistributedRun::take_comm_bytes(int64_t steps) {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  std::vector<std::pair<std::string, double>> out{{"comm_bytes", static_cast<double>(window_.total_sent()) / n}};
  for (int k = 0; k < dist::kCollectiveKinds; ++k)
    out.emplace_back(fmt::format("comm_bytes_{}", dist::collective_name(static_cast<dist::Collective>(k))),
                     static_cast<double>(window_.sent[k]) / n);
  window_ = dist::CommBytes{};
  if (fsdp_ && fsdp_->reduce_error_steps() != reported_error_steps_) {
    reported_error_steps_ = fsdp_->reduce_error_steps();
    out.emplace_back("reduce_quant_rel_error", fsdp_->reduce_error());
  }
  return out;
}

// Note [Sharded evaluation]
// Each rank evaluates its rows of every test batch (row_slice, as in training; an image loader makes only those
// rows) and the evaluators' sums (loss sum, counts) are added over the ranks, so every rank reports the whole
// test set's result for a world-size share of the work. Every rank runs the same number of forwards (one per
// test batch), which fsdp's gathers need; a test set whose last batch has fewer rows than there are ranks is
// evaluated whole on every rank instead. Before it, every rank takes rank 0's buffers: batch norm's running
// statistics are updated from each rank's own rows in training, so without that the ranks would evaluate
// different models; rank 0's are the checkpoint's. The result equals one process's evaluation of rank 0's model
// up to the order of the sums. `hadatrain eval` under a launcher evaluates the same way (start_evaluation: every
// rank loads the checkpoint whole, whatever dist.mode the config names), and only rank 0 prints and writes the
// result, so N ranks share one evaluation instead of running N identical ones that race for the outputs.
bool DistributedRun::can_shard_evaluation(int64_t rows, int64_t batch_size) const {
  if (rows <= 0 || batch_size <= 0) return false;
  const int64_t last = rows % batch_size == 0 ? batch_size : rows % batch_size;
  return std::min(batch_size, last) >= world_size();
}

void DistributedRun::broadcast_buffers(nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> buffers;
  for (const auto& [name, t] : model.named_buffers()) buffers.emplace_back(name, *t);
  dist::broadcast_tensors(*pg_.comm, buffers, 0);
}

// Note [Agreeing on a stop]
// A stop request (SIGINT/SIGTERM, forwarded by the launcher to every rank) reaches the ranks at different moments,
// and a step boundary is not the same instant on every rank, so a rank that stopped at the step where it saw the
// request would leave the others in a collective it never joins (and a save there would pair its collectives with
// another rank's gradient reduction). So after every step each rank issues an all-reduce (max) of its request, one
// f32, and reads the one it issued after the previous step: every rank reads the same value at the same step, and
// all stop after the step that follows the first request seen, then save together. The read waits only for the
// previous step's collectives: on a CUDA communicator the current stream waits for the all-reduce, the value is
// copied to pinned host memory behind it and an event recorded after the copy, and the next poll waits for that
// event alone, not for the step queued since (reading the tensor would wait for the whole current stream and take
// away the host's step ahead, Note [Deferred loss reads] in trainer.cpp). A request seen too late to be agreed on
// before the run's last step is not acted on: the run ends there.
struct DistributedRun::StopCopy {
#ifdef HADATRAIN_CUDA
  Tensor host;  // one pinned f32
  cuda::Event ready;
#endif
};

// The last poll's all-reduced flag, once its collective (bounded by dist.timeout_s) and, on CUDA, the copy behind it
// have run.
int DistributedRun::wait_stop() {
  stop_work_->synchronize();
#ifdef HADATRAIN_CUDA
  if (stop_copy_) {
    stop_copy_->ready.synchronize();
    return static_cast<int>(stop_copy_->host.data<float>()[0]);
  }
#endif
  return static_cast<int>(stop_flag_.item());
}

int DistributedRun::agreed_stop(int request) {
  const int agreed = stop_work_ ? wait_stop() : 0;
  const Device device = pg_.comm->device();
  stop_flag_ = full({1}, static_cast<double>(request), {DType::f32, device});
  stop_work_ = pg_.comm->all_reduce(stop_flag_, dist::ReduceOp::max);
#ifdef HADATRAIN_CUDA
  if (device.is_cuda()) {
    const cuda::DeviceGuard on_device(device.index);
    if (!stop_copy_) {
      stop_copy_ = std::make_shared<StopCopy>();
      stop_copy_->host = empty_pinned({1}, DType::f32, device);
    }
    stop_work_->wait();  // the current stream waits for the all-reduce (no host block)
    const cudaStream_t stream = cuda::current_stream(device.index);
    HT_CUDA_CHECK(cudaMemcpyAsync(stop_copy_->host.data_ptr(), stop_flag_.data_ptr(), sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
    cuda::record_pinned_use(stop_copy_->host.data_ptr(), stream);  // not reused before the copy has run
    stop_copy_->ready.record(stream);
  }
#endif
  return agreed;
}

void DistributedRun::settle_stop() {
  if (stop_work_) (void)wait_stop();
  stop_work_.reset();
}

RankRole DistributedRun::rank_role() const {
  dist::Communicator* comm = pg_.comm.get();
  return {.writer = rank() == 0, .outcomes = [comm](int outcome) { return every_ranks(*comm, outcome); }};
}

void DistributedRun::sum_over_ranks(std::vector<double>& values) { sum_over(*pg_.comm, values); }

}  // namespace ht::train
