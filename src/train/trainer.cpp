// The training loop behind `hadatrain train`: per step, the learning rate from the schedule and one step of
// the step runner (the task's loss, backward, clipping, the optimiser); periodic log lines and JSONL records,
// evaluation by the task at epoch ends and every train.eval_every_steps steps, checkpoints and exact resume
// through the checkpointer. The loop knows no task: what a batch holds, what the loss is and what evaluation
// measures are the Task's (train/task.h). run_training wires the parts from a TrainerConfig.
#include "hadatrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#ifdef HADATRAIN_CUDA
#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/cublaslt_gemm.h"
#endif
#include "hadatrain/core/error.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/train/init_from.h"
#include "hadatrain/train/provenance.h"
#include "hadatrain/train/task.h"
#include "batch_source.h"
#include "causal_lm_setup.h"
#include "checkpointer.h"
#include "distributed.h"
#include "ema.h"
#include "evaluation.h"
#include "run_log.h"
#include "step_runner.h"
#include "trainer_setup.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One line per distinct pipeline with the number of layers using it; the layer list at debug level.
void log_pipelines(const std::vector<nn::BoundLayer>& layers) {
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& l : layers) {
    spdlog::debug("grad pipeline: {} {} -> {}", l.type, l.name, l.pipeline);
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == l.pipeline; });
    if (it == counts.end()) counts.emplace_back(l.pipeline, 1);
    else ++it->second;
  }
  for (const auto& [p, n] : counts) spdlog::info("grad pipeline: {} layer(s) {}", n, p);
}

// After the first step: the activation memory the pipeline layers kept for backward (PipelineBinding::
// saved_bytes), and how many kept nothing of their own because their input is kept by another op or rebuilt
// from what its op keeps (HLQ's acbp_share / acbp_rebuild; docs/gradient_pipelines.md).
void log_pipeline_memory(const std::vector<nn::BoundLayer>& layers) {
  int64_t bytes = 0;
  int active = 0, none = 0, asked = 0, rebuilt = 0;
  for (const auto& l : layers) {
    asked += l.binding->recompute_output;
    rebuilt += l.binding->output_rebuilt;
    if (!l.binding->active()) continue;
    ++active;
    bytes += l.binding->saved_bytes;
    if (l.binding->saved_bytes == 0) ++none;
  }
  // recompute_output (Note [Recomputed outputs]): a layer whose input cannot be had again in backward keeps its
  // output as usual; say how many could.
  if (asked > 0)
    spdlog::info("grad pipeline: {} of the {} layer(s) with recompute_output have their output rebuilt in backward "
                 "instead of kept{}",
                 rebuilt, asked,
                 rebuilt < asked ? " (for the others, their pipeline's forward is not the plain product, as halo's, or their "
                                   "input is neither kept by another op nor rebuildable)"
                                 : "");
  if (active == 0) return;
  spdlog::info("grad pipeline: the first step's {} pipeline layer(s) kept {:.2f} MiB for backward; {} kept nothing of "
               "their own (an input another op keeps, or one rebuilt in backward)",
               active, static_cast<double>(bytes) / (1 << 20), none);
}

// After the second step: what the pipeline layers keep between steps (grad::Pipeline::kept_bytes: HALO's codes of
// frozen weights, kept from the second forward that sees a weight unchanged), when any keeps something.
void log_pipeline_kept_memory(const std::vector<nn::BoundLayer>& layers) {
  int64_t bytes = 0;
  int keeping = 0;
  for (const auto& l : layers) {
    if (!l.binding->pipeline) continue;
    const int64_t b = l.binding->pipeline->kept_bytes();
    bytes += b;
    keeping += b > 0;
  }
  if (keeping == 0) return;
  spdlog::info("grad pipeline: {} layer(s) keep {:.2f} MiB between steps, their frozen weights' codes (halo's "
               "cache_frozen_weight; false quantises them in every forward instead)",
               keeping, static_cast<double>(bytes) / (1 << 20));
}

// A new run in a folder that already holds a run's metrics or checkpoints replaces that run's metrics.jsonl and
// config.yaml, and its checkpoints re-point `latest` and `best`; it proceeds, but says so first.
void warn_if_replacing_a_run(const fs::path& out_dir, const fs::path& checkpoint_dir) {
  std::error_code ec;
  const bool metrics = fs::exists(out_dir / "metrics.jsonl", ec);
  const bool checkpoints = !io::list_checkpoints(checkpoint_dir).empty();
  if (!metrics && !checkpoints) return;
  spdlog::warn("{} already holds a run ({}): this new run replaces its metrics.jsonl and config.yaml{}; use --resume "
               "to continue that run, or another run.out_dir to keep it",
               out_dir.string(),
               metrics && checkpoints ? "metrics.jsonl and checkpoints" : metrics ? "metrics.jsonl" : "checkpoints",
               checkpoints ? fmt::format(", and its checkpoints in {} re-point latest and best", checkpoint_dir.string())
                           : "");
}

// Note [Finishing a run's last step]
// The run's last step is checkpointed before its evaluation, and after the evaluation that checkpoint is written
// again when the loop in run_training would: an epoch checkpoint (it continues at the next epoch), or a rewrite
// because the evaluation raised a best score (Note [Step evaluations]). A resume that finds the run complete but its
// last checkpoint still at its epoch's last batch under checkpoint.every_epochs, or with scores the evaluation
// (deterministic: the same weights and test rows) raises, found a run stopped between those two writes: the
// checkpoint is written again now, as the loop would have, so its state and `best` end as the uninterrupted run's.
// Returns how to write it, with `s` updated to what it holds, or nullopt when nothing is to be written.
std::optional<io::MarkBest> final_rewrite(const TrainerConfig& cfg, int64_t spe, RunState& s, double score) {
  if (cfg.checkpoint.every_steps <= 0 && cfg.checkpoint.every_epochs <= 0) return std::nullopt;
  const bool stop = cfg.train.max_steps > 0 && s.step >= cfg.train.max_steps;  // the loop's max_steps stop
  const bool before_epoch_end = s.position.batch == spe;                        // not yet moved on to the next epoch
  const bool at_epoch_end = before_epoch_end || s.position.batch == 0;
  const int64_t epoch = before_epoch_end ? s.position.epoch : s.position.epoch - 1;
  const bool epoch_checkpoint_due = cfg.checkpoint.every_epochs > 0 && (epoch + 1) % cfg.checkpoint.every_epochs == 0;
  const bool step_eval = cfg.train.eval_every_steps > 0 && s.step % cfg.train.eval_every_steps == 0;
  const bool step_checkpoint = cfg.checkpoint.every_steps > 0 && s.step % cfg.checkpoint.every_steps == 0;
  const bool with_checkpoint = (epoch_checkpoint_due && at_epoch_end) || (step_eval && step_checkpoint);
  const bool improved = score > s.best_score;
  const bool best_checkpoint = with_checkpoint && score > s.best_checkpoint_score;
  const bool rewrite = ((stop && at_epoch_end) || step_eval) && (improved || best_checkpoint);
  const bool epoch_checkpoint = !stop && epoch_checkpoint_due && before_epoch_end;
  if (!rewrite && !epoch_checkpoint) return std::nullopt;
  if (improved) s.best_score = score;
  if (best_checkpoint) s.best_checkpoint_score = score;
  if (before_epoch_end) s.position = {s.position.epoch + 1, 0}, s.epoch_loss = 0.0, s.epoch_steps = 0;
  if (best_checkpoint && cfg.checkpoint.keep_best) s.best_checkpoint_step = s.step;
  return best_checkpoint ? io::MarkBest::yes : io::MarkBest::no;
}

}  // namespace

TrainResult run_training(const TrainerConfig& run_cfg, const ResumeFrom& resume, const std::atomic<int>* stop_request) {
  // dist.mode ddp (docs/distributed.md): joins the other ranks; cfg is this rank's view (rank_config).
  const std::unique_ptr<DistributedRun> dist_run = DistributedRun::start(run_cfg);
  const TrainerConfig rank_cfg = rank_config(run_cfg, dist_run.get());
  // Pretrained weights only for a new run: a resumed one loads its checkpoint's weights instead (Checkpointer::
  // resume fails when there is none). A llama reads model.init_from itself, when it is built: its architecture
  // comes from there. model.init_from is resolved once, for the model and the record of what the run started from
  // (Note [model.init_from resolved once] in trainer_setup.cpp): a llama's now, since its positions are data.seq_len's
  // default; another model's after its data, so that a missing dataset is reported before missing weights.
  const InitWeights weights =
      resume.kind == ResumeFrom::Kind::none ? InitWeights::read : InitWeights::replaced_by_checkpoint;
  std::optional<InitFromSource> init_from;
  if (rank_cfg.model.name == ModelKind::llama) init_from = resolve_init_from(rank_cfg, weights);
  // data.seq_len left to model.init_from's positions is decided now, before the data's rows.
  const TrainerConfig cfg = with_source_seq_len(rank_cfg, init_from ? &*init_from : nullptr);
  check_device(cfg.train.device);
  // The run's folder is created after setup (below); one that cannot be is reported before the setup's work.
  io::check_output_path(cfg.run.out_dir, io::OutputKind::directory, "run.out_dir");
  const Device device = cfg.train.device;
  const DType dtype = compute_dtype(cfg);

  const Datasets ds = make_datasets(cfg);
  if (cfg.model.name != ModelKind::llama) init_from = resolve_init_from(cfg, weights);
  // A data-parallel step is not recorded into a CUDA graph (its collectives run on the communicator's stream).
  const GraphMode graph_mode = dist_run ? GraphMode::off : graph_mode_from_name(cfg.train.cuda_graph);
  // Before the model and optimiser: the step stream must outlive the tensors allocated on it.
  StepStream step_stream(device, graph_mode);
  Generator init_gen(cfg.run.seed);
  auto dropout_gen = std::make_shared<Generator>(cfg.run.seed ^ 0xD50F'0000'0000'0000ull);
  auto model = make_model(cfg, ds, init_gen, dropout_gen,
                          {.weights = weights, .init_from = init_from ? &*init_from : nullptr});
  model->to(cfg.train.dtype);
  // bf16: a frozen LLaMA base held in bf16, rounded on the host (causal_lm_setup.h). Also under dist.mode:
  // DDP reduces only trainable parameters and FSDP gathers a frozen bf16 shard as it is (docs/distributed.md).
  store_frozen_in_compute_dtype(cfg, *model);
  model->to(device);
  const int64_t num_parameters = model->num_parameters();  // before fsdp empties the model's slots
  // dist.mode fsdp: the optimiser steps this rank's master shards (dist/fsdp.h).
  auto optimizer = make_optimizer(cfg, *model, dist_run && dist_run->sharded() ? StoreWrap([&](auto store) {
    return dist_run->shard(std::move(store), cfg.train.grad_accum_steps);
  }) : StoreWrap());
  if (dist_run) dist_run->attach(optimizer->store());  // every rank starts from rank 0's weights
  // config `ema` (Note [Weight EMA] in ema.h): from the weights every rank now holds; a resume replaces it.
  std::optional<WeightEma> ema;
  if (cfg.ema) ema.emplace(*model, *cfg.ema);
  auto clock = std::make_shared<grad::StepClock>();  // Note [Pipeline noise]: the step keys stochastic rounding
  const std::vector<nn::BoundLayer> bound = nn::bind_pipelines(*model, cfg.grad_pipeline, clock);
  log_pipelines(bound);
  // CUDA: the quantisers' noise and the dropout masks read the step from the device, so steps with either can be
  // recorded into a step graph. A run with neither writes nothing per step: the word is made for noise now, and for
  // dropout after the first step that drew from the generator (below; the step graph is recorded later).
  const bool device_clock = device.is_cuda();
  if (device_clock && nn::any_draws_noise(bound)) clock->keep_on_device(device);
  dropout_gen->key_by_step(clock.get());  // Note [Step-keyed streams]: the k-th draw of step s
  const std::unique_ptr<Task> task = make_task(cfg, *model);

  // Data parallelism over images: each rank makes only its rows of every global batch (Note [Sliced batches]).
  // Every rank needs a row of every batch, so an epoch's last batch with fewer rows than ranks is dropped.
  const bool sliced = dist_run && task->rows_are_units();
  const int world = dist_run ? dist_run->world_size() : 1;
  const std::unique_ptr<BatchSource> train_batches =
      make_loader(cfg, ds, Split::train, sliced ? dist_run->rank() : 0, sliced ? world : 1, world);
  if (sliced)
    spdlog::info("dist: this rank reads and decodes only its {} of each global batch's {} images",
                 data::row_slice(cfg.data.batch_size, dist_run->rank(), world).rows, cfg.data.batch_size);
  BatchSource& loader = *train_batches;
  const int64_t spe = loader.batches_per_epoch();
  if (const int64_t left = loader.samples_per_epoch() - spe * cfg.data.batch_size; left > 0)
    spdlog::info("dist: each epoch's last batch, {} row(s), is dropped: every one of the {} ranks needs a row",
                 left, world);
  const optim::ScheduleConfig schedule = make_schedule(cfg, spe);

  // dist.mode fsdp: every rank writes its shards (checkpoint.sharded), or the whole tensors are gathered from
  // them and rank 0 writes.
  std::optional<ShardedState> sharded_state;
  if (dist_run && dist_run->fsdp()) sharded_state = dist_run->sharded_state(*model, cfg.checkpoint.sharded);
  // What a new run started from, recorded by the rank that writes checkpoints; a resumed run carries its checkpoint's
  // record (Note [Provenance of a fine-tuned run] in provenance.cpp).
  io::Metadata model_metadata = lm_checkpoint_metadata(cfg, ds, *model);
  if (init_from && resume.kind == ResumeFrom::Kind::none && (!dist_run || dist_run->rank() == 0)) {
    if (init_from_record_digests(*init_from))
      spdlog::info("model.init_from: recording the SHA-256 of the files of {} in the run's checkpoints",
                   init_from->path.string());
    model_metadata[kInitFromKey] = init_from_record(*init_from).dump();
  }
  Checkpointer checkpointer({.dir = cfg.checkpoint.dir,
                             .keep_last = cfg.checkpoint.keep_last,
                             .keep_best = cfg.checkpoint.keep_best,
                             .run_name = cfg.run.name,
                             .seed = cfg.run.seed,
                             .batch_size = cfg.data.batch_size,
                             .train_rows = ds.text_train ? ds.text_train->size() : ds.train->size(),
                             .train_digest = ds.text_train ? std::optional(ds.text_train->digest()) : std::nullopt,
                             .score_name = task->score_name(),
                             .model_metadata = std::move(model_metadata),
                             .continue_on_save_failure = cfg.checkpoint.continue_on_save_failure},
                            {.model = model.get(),
                             .optimizer = optimizer.get(),
                             .dropout_gen = dropout_gen.get(),
                             .sharded = sharded_state ? &*sharded_state : nullptr,
                             .role = dist_run ? dist_run->rank_role() : RankRole{},
                             .ema = ema ? &*ema : nullptr});
  RunState st;
  st.best_score = st.best_checkpoint_score = task->initial_score();
  const std::optional<RunState> resumed = checkpointer.resume(resume);
  if (resumed) {
    st = *resumed;
    loader.seek(st.position);
  }
  const int64_t planned = cfg.train.epochs * spe;
  const int64_t end_step = cfg.train.max_steps > 0 ? std::min(cfg.train.max_steps, planned) : planned;
  TrainResult result;
  result.out_dir = cfg.run.out_dir;
  if (dist_run) result.rank = dist_run->rank();
  if (resumed && (st.step >= end_step || st.position.epoch >= cfg.train.epochs)) {
    // Nothing left to train: report the checkpoint's weights evaluated, and write nothing (the run's folder,
    // config.yaml and metrics.jsonl stay as the finished run left them), unless the run was stopped between its
    // last checkpoint and what follows its final evaluation (final_rewrite).
    spdlog::info("the checkpoint {} is at step {}, the end of this run (train.epochs {}, train.max_steps {}): "
                 "nothing to train; evaluating its weights",
                 checkpointer.resumed_from().string(), st.step, cfg.train.epochs, cfg.train.max_steps);
    result.last_eval = evaluate_test_set(*model, *task, cfg, ds, device, dist_run.get());
    // A run killed during its final evaluation left a checkpoint of its last step and no record of that
    // evaluation: the record is appended now, the one thing such a resume writes.
    const std::string metrics = (fs::path(cfg.run.out_dir) / "metrics.jsonl").string();
    if (std::error_code ec; fs::exists(metrics, ec) && !metrics_has_eval_at(metrics, st.step)) {
      RunLog log({.metrics_path = metrics,
                  .mode = MetricsMode::append,
                  .resume_step = st.step,
                  .evaluates_at_resume_step = true,
                  .unit = task->unit(),
                  .device = device,
                  .epochs = cfg.train.epochs,
                  .steps_per_epoch = spe,
                  .total_steps = end_step});
      // The epoch of the last step: a checkpoint that ends its epoch continues at the next one.
      const int64_t epoch = std::min(st.position.batch == 0 ? st.position.epoch - 1 : st.position.epoch,
                                     cfg.train.epochs - 1);
      log.eval({.step = st.step,
                .epoch = std::max<int64_t>(epoch, 0),
                .batch = st.position.batch == 0 ? spe : st.position.batch,
                .seconds = 0.0,
                .train_loss = st.epoch_steps ? st.epoch_loss / static_cast<double>(st.epoch_steps) : std::nan(""),
                .point = EvalPoint::epoch_end},
               result.last_eval);
      spdlog::info("{} had no record of the evaluation at step {} (the run stopped during it): recorded", metrics,
                   st.step);
    }
    if (const std::optional<io::MarkBest> mark = final_rewrite(cfg, spe, st, result.last_eval.score)) {
      spdlog::info("the checkpoint of step {} was written before the run's final evaluation (the run stopped after "
                   "it): written again with that evaluation's scores (Note [Finishing a run's last step])",
                   st.step);
      checkpointer.save(st, *mark);
    }
    result.steps = st.step;
    result.already_complete = true;
    result.checkpoint = checkpointer.resumed_from().string();
    if (st.best_score > task->initial_score()) result.best_score = st.best_score;
    return result;
  }
  if (!resumed) warn_if_replacing_a_run(cfg.run.out_dir, checkpointer.dir());
  const bool checkpointing = cfg.checkpoint.every_steps > 0 || cfg.checkpoint.every_epochs > 0;
  // An unusable checkpoint.dir is reported now, before any step, not at the first save, by the ranks that write
  // into it (rank 0; every rank with sharded checkpoint files).
  if (checkpointing && (!dist_run || dist_run->rank() == 0 || (sharded_state && cfg.checkpoint.sharded)))
    check_checkpoint_dir_usable(checkpointer.dir());
  // The run's folder and its config.yaml only now, after a resume has succeeded: a failed one leaves none.
  io::create_output_directory(cfg.run.out_dir, "run.out_dir");
  io::write_file_atomic(fs::path(cfg.run.out_dir) / "config.yaml",
                        fmt::format("# Resolved config of run {} ({} with defaults and --set overrides applied)\n{}",
                                    cfg.run.name, cfg.source, cfg.resolved_yaml));
  RunLog run_log({.metrics_path = (fs::path(cfg.run.out_dir) / "metrics.jsonl").string(),
              .mode = resumed ? MetricsMode::append : MetricsMode::truncate,
              .resume_step = st.step,
              .evaluates_at_resume_step = resumed && st.position.batch == spe,
              .unit = task->unit(),
              .device = device,
              .epochs = cfg.train.epochs,
              .steps_per_epoch = spe,
              .total_steps = end_step});

  spdlog::info("run {}: {} on {} ({} forward), writing {}", cfg.run.name, model_name(cfg.model.name), to_string(device),
               dtype_name(dtype), cfg.run.out_dir);
  spdlog::info("data: {}, batch {}, {} steps per epoch", describe_data(cfg, ds), cfg.data.batch_size, spe);
  spdlog::info("model: {} parameters; optim {} lr {:g}", num_parameters, optimizer->name(), cfg.optim.lr);

#ifdef HADATRAIN_CUDA
  // train.tf32: f32 products on TF32 tensor cores for this thread (the one that runs forward and backward).
  std::optional<cuda::Tf32Guard> tf32;
  if (cfg.train.tf32 && device.is_cuda()) tf32.emplace(cuda::Tf32::on);
#endif
  StepRunner runner(step_stream, device, graph_mode,
                    {.model = model.get(),
                     .optimizer = optimizer.get(),
                     .task = task.get(),
                     .dropout_gen = dropout_gen.get(),
                     .clip_grad_norm = cfg.optim.clip_grad_norm,
                     .batch_size = cfg.data.batch_size,
                     .grad_accum_steps = cfg.train.grad_accum_steps,
                     .before_last_backward = dist_run ? [&] { dist_run->before_last_backward(); }
                                                      : std::function<void()>(),
                     .after_backward = dist_run ? [&](const Tensor& loss) { return dist_run->after_backward(loss); }
                                                : std::function<Tensor(const Tensor&)>(),
                     .micro_batches = dist_run ? [&](int64_t k) { return dist_run->micro_batches(k); }
                                               : std::function<int64_t(int64_t)>(),
                     .clip_global = dist_run && dist_run->fsdp()
                                        ? [&](double max_norm) { return dist_run->fsdp()->clip_grad_norm(max_norm); }
                                        : std::function<double(double)>(),
                     .after_step = dist_run && dist_run->fsdp() ? [&] { dist_run->fsdp()->end_step(); }
                                                                : std::function<void()>()});
  // The step of the last checkpoint this process wrote, or of the one it resumed from (a checkpoint at an epoch's last
  // step, written before the epoch's evaluation, that the evaluation may have to write again: below).
  int64_t saved_step = resumed ? st.step : -1;
  // `epoch_end_done`: the epoch's evaluation is done or follows at once (a train.max_steps stop), so a
  // checkpoint at the epoch's last batch continues at the next epoch and a resume does not evaluate it again.
  auto save = [&](io::MarkBest best, bool epoch_end_done = false) {
    st.position = loader.position();
    if (epoch_end_done && st.position.batch == spe) st.position = {st.position.epoch + 1, 0};
    RunState saved = st;
    if (saved.position.batch == 0) saved.epoch_loss = 0.0, saved.epoch_steps = 0;  // a new epoch: nothing of it ran
    if (best == io::MarkBest::yes && cfg.checkpoint.keep_best) saved.best_checkpoint_step = st.step;
    const std::filesystem::path dir = checkpointer.save(saved, best);
    if (dir.empty()) return;  // checkpoint.on_save_failure=continue: the failure was logged
    result.checkpoint = dir.string();
    saved_step = st.step;
    st.best_checkpoint_step = saved.best_checkpoint_step;
  };
  // Note [Step evaluations]
  // train.eval_every_steps N evaluates after every step that N divides, the steps counted from the run's start as
  // max_steps counts them, so a resumed run evaluates where the uninterrupted one did. A step inside an epoch is
  // evaluated in the loop, after the step and before its checkpoint: that checkpoint holds the evaluation's scores,
  // and a resume from it continues at the next step without evaluating again. A step that ends an epoch or the run
  // is evaluated at the epoch's end, once, whatever train.eval_every says of that epoch; a checkpoint of that step
  // written before the evaluation (checkpoint.every_steps, a max_steps stop) is written again after it when the
  // evaluation raised a best score, so that it too holds the scores. `best` can name a checkpoint written at an
  // evaluation: an epoch checkpoint (checkpoint.every_epochs) at an evaluated epoch's end, or a step checkpoint
  // (checkpoint.every_steps) at a step N divides; it names the one with the best score among those.
  const int64_t eval_steps = cfg.train.eval_every_steps;
  auto step_eval_due = [&](int64_t step) { return eval_steps > 0 && step % eval_steps == 0; };
  auto step_checkpoint_due = [&](int64_t step) {
    return cfg.checkpoint.every_steps > 0 && step % cfg.checkpoint.every_steps == 0;
  };
  if (eval_steps > 0 && cfg.checkpoint.every_steps > 0 && cfg.checkpoint.every_epochs == 0 && cfg.checkpoint.keep_best &&
      std::lcm(eval_steps, cfg.checkpoint.every_steps) > end_step)
    spdlog::warn("no checkpoint of this run can become best: a step checkpoint can at a step that both "
                 "train.eval_every_steps {} and checkpoint.every_steps {} divide, and the first such step, {}, is after "
                 "the run's last, {}; make every_steps a multiple of eval_every_steps",
                 eval_steps, cfg.checkpoint.every_steps, std::lcm(eval_steps, cfg.checkpoint.every_steps), end_step);
  // What an evaluation changed: the best score (`improved`), and the best score of the evaluations with a
  // checkpoint (`best_checkpoint`: that checkpoint is written with MarkBest::yes).
  struct Scored {
    bool improved = false, best_checkpoint = false;
  };
  // One evaluation (and the weight average's), its scores and its record. `with_checkpoint`: a checkpoint of this
  // step that can become `best` is written after it.
  auto evaluate_now = [&](const EvalAt& at, bool with_checkpoint) {
    const EvalResult ev = evaluate_test_set(*model, *task, cfg, ds, device, dist_run.get());
    Scored sc;
    sc.improved = ev.score > st.best_score;  // `best` follows the weights, not their average
    if (sc.improved) st.best_score = ev.score;
    sc.best_checkpoint = with_checkpoint && ev.score > st.best_checkpoint_score;
    if (sc.best_checkpoint) st.best_checkpoint_score = ev.score;
    result.last_eval = ev;
    if (ema && cfg.ema->evaluate)
      result.last_average_eval =
          ema->with_average([&] { return evaluate_test_set(*model, *task, cfg, ds, device, dist_run.get()); });
    run_log.eval(at, ev, result.last_average_eval ? &*result.last_average_eval : nullptr);
    return sc;
  };
  bool stop = false;
  const int64_t first_step = st.step;  // 0, or the step a resumed run starts from
  double shown_loss = std::nan("");  // the progress line shows the latest logged window mean
#ifdef HADATRAIN_CUDA
  // gpu_peak_mb is training's peak: what the set-up allocated and freed before the first step (a model built
  // whole before it was sharded, a checkpoint read) does not count; what it still holds does.
  if (device.is_cuda()) cuda::reset_peak(device.index);
#endif
  for (int64_t epoch = loader.position().epoch; epoch < cfg.train.epochs && !stop; ++epoch) {
    const auto epoch_start = Clock::now();
    // The throughput window (units, data wait, time) starts again with each epoch, after the evaluation before
    // it; the loss window (st.window_loss over st.window_steps) runs from one train record to the next across
    // epochs and, in a checkpoint, across a resume, so every step is in exactly one record's mean.
    auto window_start = epoch_start;
    double evaluating = 0.0;  // seconds of this epoch spent in step evaluations (not in epoch_seconds)
    // The epoch's loss sum and step count live in st (a checkpoint keeps them); a resumed epoch continues them.
    if (loader.position().batch == 0) st.epoch_loss = 0.0, st.epoch_steps = 0;
    // Note [Deferred loss reads]: reading a step's loss (item()) synchronises the device, so the host could
    // not issue step k+1 while the GPU runs step k. The losses are summed on the device in f64 (the same
    // sequential f64 sum as on the host, so logged values are unchanged) and read only where they are
    // needed: a logged record, a checkpoint (never written after an unseen non-finite loss), the epoch's end.
    int64_t unread_steps = 0;  // steps whose loss the runner has not handed over yet
    auto read_losses = [&] {
      if (unread_steps == 0) return;
      const LossSum losses = runner.take_loss_sum();
      const double v = losses.sum;
      if (!std::isfinite(v)) {
        // The runner counts the finite steps before the first non-finite loss on the device (no read per step).
        const int64_t bad = st.step - unread_steps + 1 + losses.finite_steps;
        throw Error(fmt::format("training diverged at step {} (epoch {}): the loss is {}; training stopped and no "
                                "checkpoint of step {} or later was written ({}); lower optim.lr",
                                bad, epoch + 1, std::isnan(v) ? "NaN" : v > 0 ? "+infinity" : "-infinity",
                                bad, checkpointing ? checkpointer.last_good_checkpoint() : "checkpointing is off"));
      }
      st.window_loss += v;
      st.epoch_loss += v;
      unread_steps = 0;
    };
    double window_wait = 0.0;  // seconds of this logging window spent waiting in loader.next() (data_wait)
    int64_t window_steps = 0, window_units = 0;  // steps and units this process ran in the throughput window
    auto timed_next = [&] {
      const auto t0 = Clock::now();
      auto b = loader.next();
      window_wait += seconds_since(t0);
      return b;
    };
    while (const auto batch = timed_next()) {
      const double lr = optim::learning_rate(schedule, st.step);
      clock->set(st.step);  // before the step's device work, on the run's stream
      runner.run(dist_run ? dist_run->slice(*batch, *task) : *batch, lr, st.step);
      // The keyed generator's state is its draws in this step: a step with dropout or drop path (the same masks
      // with the step in the stream or in the word).
      if (device_clock && !clock->word.defined() && dropout_gen->state() > 0) clock->keep_on_device(device);
      if (dist_run) dist_run->end_step();  // the step's bytes on the wire join the logging window's
      ++st.step;
      if (ema) ema->after_step(st.step, st.step <= schedule.warmup_steps);  // the step just run had a warm-up lr
      if (st.step == first_step + 1) {
        nn::log_fallbacks(bound);  // the layers whose pipeline fell back, now that their shapes are known
        log_pipeline_memory(bound);
      }
      if (st.step == first_step + 2) log_pipeline_kept_memory(bound);
      ++st.epoch_steps;
      ++unread_steps;
      // On the CPU a non-finite loss is seen at its step (reading it costs nothing); on CUDA at the next read.
      if (runner.saw_non_finite_loss()) read_losses();
      ++window_steps;
      ++st.window_steps;
      window_units += batch->global_rows > 0 ? batch->global_rows : task->units(*batch);  // the global batch's
      const double throughput = static_cast<double>(window_units) / std::max(seconds_since(window_start), 1e-9);
      if (st.step == 1 || st.step % cfg.train.log_every == 0) {
        run_log.clear_progress();
        read_losses();
        // Measured after the loss read, which waits for the window's device work: on CUDA the steps are only
        // queued when they return (a recorded step graph queues many ahead), so a rate taken before the read
        // would be the host's issue rate, not the training rate.
        const double window_rate = static_cast<double>(window_units) / std::max(seconds_since(window_start), 1e-9);
        const double mean_loss = st.window_loss / static_cast<double>(st.window_steps);
        shown_loss = mean_loss;
        // The share of the window the loop waited for batches: near 0 when the loader keeps up, near 1 when
        // training is starved for data (more data.num_workers, or a faster data path).
        const double data_wait = std::clamp(window_wait / std::max(seconds_since(window_start), 1e-9), 0.0, 1.0);
        TrainWindow w{.step = st.step,
                      .epoch = epoch,
                      .batch = batch->position.batch + 1,
                      .loss = mean_loss,
                      .lr = lr,
                      .throughput = window_rate,
                      .data_wait = data_wait,
                      .grad_norm = std::nullopt,
                      .mfu = std::nullopt,
                      .extra = {}};
        if (cfg.optim.clip_grad_norm > 0) w.grad_norm = runner.grad_norm();
        if (dist_run) w.extra = dist_run->take_comm_bytes(window_steps);
        // Model FLOPs utilisation: achieved training FLOP/s over train.peak_tflops (CUDA only: a CPU has no
        // such peak).
        if (device.is_cuda() && task->flops_per_unit() > 0)
          w.mfu = window_rate * task->flops_per_unit() / (cfg.train.peak_tflops * 1e12);
        run_log.train(w);
        st.window_loss = 0.0;
        st.window_steps = 0;
        window_steps = window_units = 0;
        window_wait = 0.0;
        window_start = Clock::now();
      }
      run_log.progress(st.step, epoch, batch->position.batch + 1, shown_loss, throughput);
      const bool last_step = cfg.train.max_steps > 0 && st.step >= cfg.train.max_steps;
      // Note [Step evaluations]: a step inside the epoch, before its checkpoint.
      io::MarkBest step_best = io::MarkBest::no;
      if (step_eval_due(st.step) && !last_step && batch->position.batch + 1 < spe) {
        run_log.clear_progress();
        read_losses();
        const auto eval_start = Clock::now();
        const Scored sc = evaluate_now({.step = st.step,
                                        .epoch = epoch,
                                        .batch = batch->position.batch + 1,
                                        .seconds = 0.0,
                                        .train_loss = st.epoch_loss / static_cast<double>(st.epoch_steps),
                                        .point = EvalPoint::mid_epoch},
                                       step_checkpoint_due(st.step));
        if (sc.best_checkpoint) step_best = io::MarkBest::yes;
        const auto spent = Clock::now() - eval_start;
        window_start += spent;  // the throughput window and the epoch's time leave the evaluation out
        evaluating += std::chrono::duration<double>(spent).count();
      }
      // A train.max_steps stop at an epoch's last batch: the evaluation that follows ends the epoch, so its
      // checkpoint continues at the next epoch (a resume does not evaluate that epoch again). It is written
      // before that evaluation, like every step checkpoint, so the resumed run continues exactly.
      if (step_checkpoint_due(st.step) || (last_step && checkpointing)) {
        read_losses();
        save(step_best, last_step);
      }
      if (last_step) {
        stop = true;
        break;
      }
      // A stop request (SIGINT/SIGTERM in the CLI), seen between steps: this step is done; keep it in a
      // checkpoint when checkpointing is on, and return without evaluating. Under dist the ranks agree on the step
      // first (Note [Agreeing on a stop] in src/train/distributed.cpp) and save it together.
      // A request that comes with the run's last step lets the run end as it would have (its evaluation and epoch
      // checkpoint follow): a checkpoint of this step alone would leave a resume nothing to train and no way to log
      // that evaluation.
      const int request = stop_request ? stop_request->load(std::memory_order_relaxed) : 0;
      const int stop_by = dist_run ? dist_run->agreed_stop(request) : request;
      if (stop_by != 0 && st.step >= end_step)
        spdlog::info("a stop request came with the run's last step ({}): finishing its evaluation", st.step);
      if (stop_by != 0 && st.step < end_step) {
        run_log.clear_progress();
        read_losses();
        result.stopped_by = stop_by;
        if (checkpointing && saved_step != st.step) save(io::MarkBest::no);
        stop = true;
        break;
      }
    }
    run_log.clear_progress();
    if (result.stopped_by != 0) break;
    read_losses();
    const bool epoch_done = !stop;  // a max_steps stop still evaluates, so short runs report a result
    const double secs = seconds_since(epoch_start) - evaluating;
    const bool step_eval = step_eval_due(st.step);  // Note [Step evaluations]: this step's, done here
    const bool do_eval = (epoch + 1) % cfg.train.eval_every == 0 || epoch + 1 == cfg.train.epochs || stop || step_eval;
    const bool epoch_checkpoint_due = cfg.checkpoint.every_epochs > 0 && (epoch + 1) % cfg.checkpoint.every_epochs == 0;
    const bool epoch_checkpoint = epoch_done && epoch_checkpoint_due;
    // The epoch ran to its end (the loader then stands at the next epoch), or a max_steps stop came at its last step.
    const bool at_epoch_end = epoch_done || loader.position().batch == spe;
    // A checkpoint of this step written before this evaluation: a step checkpoint or a train.max_steps stop's (above),
    // or the checkpoint this run resumed from.
    const bool checkpoint_before_eval = checkpointing && saved_step == st.step;
    if (do_eval) {
      // Over all the epoch's steps, those before a resume included (the checkpoint keeps their sum).
      const double train_loss =
          st.epoch_steps ? st.epoch_loss / static_cast<double>(st.epoch_steps) : std::nan("");
      // `best` names the best-scoring checkpoint among those written at an evaluation: this epoch's (also when a
      // max_steps stop at its last step wrote it), or a step checkpoint at a step evaluation.
      const bool with_checkpoint =
          (epoch_checkpoint_due && at_epoch_end) || (step_eval && step_checkpoint_due(st.step));
      const Scored sc = evaluate_now({.step = st.step,
                                      .epoch = epoch,
                                      .batch = at_epoch_end ? spe : loader.position().batch,
                                      .seconds = secs,
                                      .train_loss = train_loss,
                                      .point = EvalPoint::epoch_end},
                                     with_checkpoint);
      // The checkpoint written before the evaluation is written again when it must hold the evaluation's scores: a
      // run resumed from it does not evaluate this step again (at an epoch's end it continues at the next epoch).
      const bool rewrite = checkpoint_before_eval && ((stop && at_epoch_end) || step_eval) &&
                           (sc.improved || sc.best_checkpoint);
      if (epoch_checkpoint || rewrite) save(sc.best_checkpoint ? io::MarkBest::yes : io::MarkBest::no, true);
    } else if (epoch_checkpoint) {
      save(io::MarkBest::no);
    }
  }
  if (dist_run) dist_run->settle_stop();
  result.steps = st.step;
  if (st.best_score > task->initial_score()) result.best_score = st.best_score;
  return result;
}

}  // namespace ht::train
