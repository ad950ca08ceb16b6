// The training loop: per step, the learning rate from the schedule, forward (in the configured precision),
// cross-entropy with label smoothing, backward, optional clipping, optimiser step; periodic logs and JSONL
// records, per-epoch evaluation (top-1/top-5), atomic checkpoints and exact resume.
//
// Note [Exact resume]
// A checkpoint holds everything the next step depends on: parameters and buffers (batch-norm statistics),
// optimiser state and step count, the loader position (epoch, batch) — data order and augmentation are pure
// functions of (seed, epoch, index) — the dropout generator's stream counter, and the global step (the
// schedule is a function of it). Resuming rebuilds the run from the config, loads that state and seeks the
// loader, so on the CPU the resumed run computes bit-identical losses (tests/cpu/test_trainer.cpp).
#include "hadatrain/train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "hadatrain/autograd/grad_mode.h"
#ifdef HADATRAIN_CUDA
#include "hadatrain/cuda/allocator.h"
#include "hadatrain/cuda/gemm.h"
#include "hadatrain/cuda/graph.h"
#endif
#include "hadatrain/data/loader.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/train/metrics.h"
#include "trainer_setup.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Peak GPU memory allocated through the caching allocator on `device` (MiB), or a negative value when the
// run is not on CUDA (the field is then left out).
double peak_gpu_mb(Device device) {
#ifdef HADATRAIN_CUDA
  if (device.is_cuda()) return static_cast<double>(cuda::memory_stats(device.index).peak_allocated_bytes) / (1 << 20);
#endif
  (void)device;
  return -1.0;
}

double peak_host_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}


EvalResult evaluate(nn::Module& model, const std::shared_ptr<const data::Dataset>& set, const data::LoaderOptions& o,
                    DType dtype, Device device) {
  NoGradGuard no_grad;
  model.eval();
  data::DataLoader loader(set, o);
  EvalResult r;
  double loss_sum = 0.0;
  while (const auto batch = loader.next()) {
    const Tensor x = batch->images.to(device).to(dtype);  // (B, C, H, W)
    const Tensor y = batch->labels.to(device);            // (B)
    const Tensor logits = model.forward(x);               // (B, classes)
    loss_sum += cross_entropy(logits, y, {.reduction = Reduction::sum}).item();
    const std::vector<float> l = logits.to_vector<float>();
    const std::vector<int64_t> labels = batch->labels.to_vector<int64_t>();
    const int64_t classes = logits.size(1);
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const float* row = l.data() + i * static_cast<std::size_t>(classes);
      const int64_t label = labels[i];
      const float target = row[label];
      // Classes ranked above the target; ties go to the lower class index, as argmax/topk pick them (with
      // "ties count for the target", a model with constant logits would score 100%). A NaN target ranks last.
      int64_t above = std::isnan(target) ? classes : 0;
      for (int64_t c = 0; c < classes && !std::isnan(target); ++c)
        above += row[c] > target || (row[c] == target && c < label) ? 1 : 0;
      r.correct += above == 0 ? 1 : 0;
      r.correct_top5 += above < 5 ? 1 : 0;
    }
    r.total += batch->size();
  }
  model.train();
  r.loss = r.total ? loss_sum / static_cast<double>(r.total) : 0.0;
  return r;
}

// A one-line progress bar, redrawn at most every 0.2 s, when stdout is a terminal.
class ProgressBar {
 public:
  ProgressBar() : enabled_(isatty(STDOUT_FILENO) == 1) {}
  void update(int64_t epoch, int64_t epochs, int64_t done, int64_t total, double loss, double ips) {
    if (!enabled_ || (seconds_since(last_) < 0.2 && done != total)) return;
    last_ = Clock::now();
    const int width = 30;
    const int filled = total ? static_cast<int>(width * done / total) : width;
    fmt::print("\r epoch {}/{} [{}{}] {}/{} loss {:.4f} {:.0f} img/s ", epoch, epochs, std::string(filled, '#'),
               std::string(width - filled, '.'), done, total, loss, ips);
    std::fflush(stdout);
    drawn_ = true;
  }
  void clear() {
    if (enabled_ && drawn_) fmt::print("\r{}\r", std::string(100, ' '));
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point last_ = Clock::now();
};

struct CheckpointState {
  int64_t step = 0;
  data::LoaderPosition position;
  double best_top1 = -1.0;
  uint64_t dropout_stream = 0;
};

io::TensorList to_list(const std::map<std::string, Tensor>& m) {
  io::TensorList out;
  for (const auto& [k, v] : m) out.emplace_back(k, v);
  return out;
}


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
                 rebuilt < asked ? " (the others' input is neither kept by another op nor rebuildable)" : "");
  if (active == 0) return;
  spdlog::info("grad pipeline: the first step's {} pipeline layer(s) kept {:.2f} MiB for backward; {} kept nothing of "
               "their own (an input another op keeps, or one rebuilt in backward)",
               active, static_cast<double>(bytes) / (1 << 20), none);
}

#ifdef HADATRAIN_CUDA
// train.cuda_graph: the training step recorded into a CUDA graph after kGraphWarmup eager steps and replayed
// for every batch of the recorded shape (a smaller last batch runs eagerly). The recorded step reads the
// batch from fixed device tensors (x, y: copied into before each replay), the learning rate from the
// optimiser's staged buffer (Optimizer::begin_step) and adds its loss to the run's loss accumulator.
struct GraphedStep {
  static constexpr int kGraphWarmup = 3;  // eager steps first: algorithm choice, optimiser state, workspaces
  explicit GraphedStep(int device) : graph(device) {}
  cuda::StepGraph graph;
  Tensor x, y;
  int eager_steps = 0;
  bool off = false;  // recording was refused: every step eager from then on
};
#endif

}  // namespace

TrainResult run_training(const TrainerConfig& cfg, const ResumeFrom& resume) {
  check_device(cfg.train.device);
  const Device device = cfg.train.device;
  const DType dtype = compute_dtype(cfg);

  std::error_code ec;
  fs::create_directories(cfg.run.out_dir, ec);
  HT_CHECK(!ec, "run.out_dir: cannot create {}: {}", cfg.run.out_dir, ec.message());
  io::write_file_atomic(fs::path(cfg.run.out_dir) / "config.yaml",
                        fmt::format("# Resolved config of run {} ({} with defaults and --set overrides applied)\n{}",
                                    cfg.run.name, cfg.source, cfg.resolved_yaml));

  const Datasets ds = make_datasets(cfg);
#ifdef HADATRAIN_CUDA
  // train.cuda_graph (Note [Step graphs]): every device operation of the run goes to the step graph's
  // stream, so eager steps, recorded steps and evaluation stay in one order. Declared before the model and
  // optimiser: the stream must outlive the tensors allocated on it.
  std::optional<GraphedStep> graphed;
  std::optional<cuda::StreamGuard> on_graph_stream;
  if (device.is_cuda() && cfg.train.cuda_graph != "false") {
    graphed.emplace(device.index);
    on_graph_stream.emplace(graphed->graph.stream(), device.index);
  }
#endif
  Generator init_gen(cfg.run.seed);
  auto dropout_gen = std::make_shared<Generator>(cfg.run.seed ^ 0xD50F'0000'0000'0000ull);
  auto model = make_model(cfg, ds, init_gen, dropout_gen);
  model->to(cfg.train.dtype);
  model->to(device);
  auto optimizer = make_optimizer(cfg, *model);
  auto clock = std::make_shared<grad::StepClock>();  // Note [Pipeline noise]: the step keys stochastic rounding
  const std::vector<nn::BoundLayer> bound = nn::bind_pipelines(*model, cfg.grad_pipeline, clock);
  log_pipelines(bound);
  // CUDA: the quantisers read the step from the device (recordable steps); a run without noise writes nothing.
  if (nn::any_draws_noise(bound)) clock->keep_on_device(device);

  data::DataLoader loader(ds.train, loader_options(cfg, ds, Split::train));
  const data::LoaderOptions eval_opts = loader_options(cfg, ds, Split::test);
  const int64_t spe = loader.batches_per_epoch();
  const optim::ScheduleConfig schedule = make_schedule(cfg, spe);

  // Resume (Note [Exact resume]).
  CheckpointState st;
  std::optional<io::Checkpoint> ck;
  if (resume.kind == ResumeFrom::Kind::latest) {
    ck = io::load_latest_checkpoint(cfg.checkpoint.dir);
    HT_CHECK(ck.has_value(), "--resume: no checkpoint found in {}", cfg.checkpoint.dir);
  } else if (resume.kind == ResumeFrom::Kind::path) {
    ck = io::load_checkpoint_dir(resume.path);
  }
  if (ck) {
    model->load_state_dict(ck->model.tensors);
    HT_CHECK(ck->optimizer.has_value(), "--resume: {} has no optimizer.safetensors", ck->dir.string());
    const auto& s = ck->state;
    st.step = s.at("step").get<int64_t>();
    st.position = {s.at("epoch").get<int64_t>(), s.at("batch").get<int64_t>()};
    st.best_top1 = s.at("best_top1").get<double>();
    st.dropout_stream = s.at("dropout_stream").get<uint64_t>();
    optimizer->load_state_tensors(ck->optimizer->tensors, s.at("optimizer_steps").get<int64_t>());
    dropout_gen->set_state(st.dropout_stream);
    loader.seek(st.position);
    spdlog::info("resumed from {} at step {} (epoch {}, batch {})", ck->dir.string(), st.step, st.position.epoch + 1,
                 st.position.batch);
  }
  MetricsLog metrics((fs::path(cfg.run.out_dir) / "metrics.jsonl").string(),
                     ck ? MetricsMode::append : MetricsMode::truncate);

  auto save = [&](data::LoaderPosition pos, bool best) {
    io::CheckpointData d;
    d.step = st.step;
    d.model = to_list(model->state_dict());
    d.optimizer = to_list(optimizer->state_tensors());
    d.state = {{"step", st.step},
               {"epoch", pos.epoch},
               {"batch", pos.batch},
               {"best_top1", st.best_top1},
               {"dropout_stream", dropout_gen->state()},
               {"optimizer", optimizer->name()},
               {"optimizer_steps", optimizer->steps()},
               {"run", cfg.run.name},
               {"seed", cfg.run.seed}};
    const auto dir = io::save_checkpoint(cfg.checkpoint.dir, d,
                                         {.keep_last = cfg.checkpoint.keep_last,
                                          .best = best && cfg.checkpoint.keep_best ? io::MarkBest::yes : io::MarkBest::no});
    spdlog::info("checkpoint written: {}", dir.string());
  };

  spdlog::info("run {}: {} on {} ({} forward), writing {}", cfg.run.name, model_name(cfg.model.name), to_string(device),
               dtype_name(dtype), cfg.run.out_dir);
  spdlog::info("data: {} ({} train / {} test samples, {} classes), batch {}, {} steps per epoch",
               dataset_name(cfg.data.dataset), ds.train->size(), ds.test->size(), ds.num_classes, cfg.data.batch_size,
               spe);
  spdlog::info("model: {} parameters; optim {} lr {:g}", model->num_parameters(), optimizer->name(), cfg.optim.lr);

  TrainResult result;
  result.out_dir = cfg.run.out_dir;
#ifdef HADATRAIN_CUDA
  // train.tf32: f32 products on TF32 tensor cores for this thread (the one that runs forward and backward).
  std::optional<cuda::Tf32Guard> tf32;
  if (cfg.train.tf32 && device.is_cuda()) tf32.emplace(cuda::Tf32::on);
#endif
  ProgressBar bar;
  bool stop = false;
  const int64_t first_step = st.step;  // 0, or the step a resumed run starts from
  CrossEntropyOptions ce_opts;
  ce_opts.label_smoothing = cfg.train.label_smoothing;
  // Targets are checked on the device and read back with the losses (check_deferred_targets below): a step
  // never waits for the device, and it can be recorded into a step graph.
  ce_opts.target_check = TargetCheck::deferred;
  // f64 sum of the losses not read yet; updated in place, so a recorded step graph adds to the same tensor
  // at every replay.
  const Tensor loss_zero = zeros({}, {DType::f64, device});
  const Tensor unread_loss = zeros({}, {DType::f64, device});
  const Tensor last_grad_norm = zeros({}, {DType::f64, device});  // optim.clip_grad_norm: read when logged
  // Clipping on the device (no host read, so a step graph can record it) on CUDA; on the host on the CPU.
  auto clip_gradients = [&] {
    if (cfg.optim.clip_grad_norm <= 0) return;
    if (device.is_cuda()) {
      const Tensor norm = optim::clip_grad_norm_on_device(optimizer->params(), cfg.optim.clip_grad_norm);
      if (norm.defined()) copy_(last_grad_norm, norm);
    } else {
      fill_(last_grad_norm, optim::clip_grad_norm(optimizer->params(), cfg.optim.clip_grad_norm));
    }
  };
  for (int64_t epoch = loader.position().epoch; epoch < cfg.train.epochs && !stop; ++epoch) {
    const auto epoch_start = Clock::now();
    auto window_start = epoch_start;
    double window_loss = 0.0, epoch_loss = 0.0;
    // Note [Deferred loss reads]: reading a step's loss (item()) synchronises the device, so the host could
    // not issue step k+1 while the GPU runs step k. The losses are summed on the device in f64 (the same
    // sequential f64 sum as on the host, so logged values are unchanged) and read only where they are
    // needed: a logged record, a checkpoint (never written after an unseen non-finite loss), the epoch's end.
    int64_t unread_steps = 0;  // steps whose loss is in unread_loss
    double shown_loss = std::nan("");  // the progress bar shows the latest read window mean
    auto read_losses = [&] {
      if (unread_steps == 0) return;
      const double v = unread_loss.item();
      check_deferred_targets(device);
      HT_CHECK(std::isfinite(v),
               "training diverged between steps {} and {} (epoch {}): the loss sum is {}; lower optim.lr",
               st.step - unread_steps + 1, st.step, epoch + 1, v);
      window_loss += v;
      epoch_loss += v;
      copy_(unread_loss, loss_zero);
      unread_steps = 0;
    };
    double window_wait = 0.0;  // seconds of this logging window spent waiting in loader.next() (data_wait)
    int64_t window_steps = 0, window_images = 0, epoch_steps = 0;
    auto timed_next = [&] {
      const auto t0 = Clock::now();
      auto b = loader.next();
      window_wait += seconds_since(t0);
      return b;
    };
    while (const auto batch = timed_next()) {
      const double lr = optim::learning_rate(schedule, st.step);
      clock->set(st.step);  // before the step's device work, on the run's stream
      // The step's device work on a batch already on the device (the optimiser's begin_step is the caller's):
      // eager steps and the recorded graph run the same code.
      auto device_step = [&](const Tensor& x, const Tensor& y) {  // x (B, C, H, W), y (B)
        const Tensor loss = cross_entropy(model->forward(x.to(dtype)), y, ce_opts);
        loss.backward();
        clip_gradients();
        optimizer->apply();
        add_(unread_loss, loss.detach().to(DType::f64));
      };
      bool done = false;
#ifdef HADATRAIN_CUDA
      // Graph-eligible: batches of the recorded shape.
      if (graphed && !graphed->off) {
        GraphedStep& gs = *graphed;
        if (!gs.x.defined() && batch->size() == cfg.data.batch_size) {  // a full batch (not a resumed tail)
          gs.x = empty(batch->images.shape(), {batch->images.dtype(), device});
          gs.y = empty(batch->labels.shape(), {batch->labels.dtype(), device});
        }
        if (gs.x.defined() && gs.x.shape() == batch->images.shape() && gs.y.shape() == batch->labels.shape()) {
          copy_(gs.x, batch->images);
          copy_(gs.y, batch->labels);
          optimizer->begin_step(lr);
          auto body = [&] {
            device_step(gs.x, gs.y);
            optimizer->zero_grad();  // a recorded step frees the gradients it allocated
          };
          if (gs.graph.ready()) {
            gs.graph.replay();
          } else if (gs.eager_steps < GraphedStep::kGraphWarmup) {
            optimizer->zero_grad();
            body();
            ++gs.eager_steps;
          } else {
            const uint64_t dropout_state = dropout_gen->state();
            // The graph allocates its own memory (graph allocation nodes): hand the eager steps' cached,
            // unused blocks back to the driver first, so a model that fills most of the device still fits.
            cuda::empty_cache(device.index);
            const std::string why = gs.graph.record(body);
            if (why.empty()) {
              spdlog::info("train.cuda_graph: step recorded into a CUDA graph at step {} (batch {}, {} nodes)",
                           st.step + 1, to_string(gs.x.shape()), gs.graph.nodes());
              gs.graph.replay();
            } else {
              HT_CHECK(cfg.train.cuda_graph != "true", "train.cuda_graph is true, but {}", why);
              spdlog::info("train.cuda_graph: steps run without a graph: {}", why);
              dropout_gen->set_state(dropout_state);  // the refused recording drew nothing that ran
              gs.off = true;
              optimizer->zero_grad();  // gradients made while recording point to the discarded graph's memory
              body();
            }
          }
          done = true;
        }
      }
#endif
      if (!done) {
        optimizer->zero_grad();
        optimizer->begin_step(lr);
        device_step(batch->images.to(device), batch->labels.to(device));
      }
      ++st.step;
      if (st.step == first_step + 1) log_pipeline_memory(bound);
      ++epoch_steps;
      ++unread_steps;
      ++window_steps;
      window_images += batch->size();
      const double ips = static_cast<double>(window_images) / std::max(seconds_since(window_start), 1e-9);
      if (st.step == 1 || st.step % cfg.train.log_every == 0) {
        bar.clear();
        read_losses();
        const double mean_loss = window_loss / static_cast<double>(window_steps);
        shown_loss = mean_loss;
        // The share of the window the loop waited for batches: near 0 when the loader keeps up, near 1 when
        // training is starved for data (more data.num_workers, or a faster data path).
        const double data_wait = std::clamp(window_wait / std::max(seconds_since(window_start), 1e-9), 0.0, 1.0);
        spdlog::info("epoch {}/{} step {} ({}/{}) loss {:.4f} lr {:.4g} {:.0f} img/s data_wait {:.2f}", epoch + 1,
                     cfg.train.epochs, st.step, batch->position.batch + 1, spe, mean_loss, lr, ips, data_wait);
        MetricsRecord rec("train");
        rec.add("step", st.step).add("epoch", epoch + 1).add("loss", mean_loss).add("lr", lr).add("img_per_s", ips);
        rec.add("data_wait", data_wait);
        rec.add("host_peak_mb", peak_host_mb());
        if (const double gpu = peak_gpu_mb(device); gpu >= 0) rec.add("gpu_peak_mb", gpu);
        if (cfg.optim.clip_grad_norm > 0) rec.add("grad_norm", last_grad_norm.item());
        metrics.write(rec);
        window_loss = 0.0;
        window_steps = window_images = 0;
        window_wait = 0.0;
        window_start = Clock::now();
      }
      bar.update(epoch + 1, cfg.train.epochs, batch->position.batch + 1, spe, shown_loss, ips);
      const bool last_step = cfg.train.max_steps > 0 && st.step >= cfg.train.max_steps;
      if ((cfg.checkpoint.every_steps > 0 && st.step % cfg.checkpoint.every_steps == 0) ||
          (last_step && (cfg.checkpoint.every_steps > 0 || cfg.checkpoint.every_epochs > 0))) {
        read_losses();
        save(loader.position(), false);
      }
      if (last_step) {
        stop = true;
        break;
      }
    }
    bar.clear();
    read_losses();
    const bool epoch_done = !stop;  // a max_steps stop still evaluates, so short runs report accuracy
    const double secs = seconds_since(epoch_start);
    const bool do_eval = (epoch + 1) % cfg.train.eval_every == 0 || epoch + 1 == cfg.train.epochs || stop;
    if (do_eval) {
      const EvalResult ev = evaluate(*model, ds.test, eval_opts, dtype, device);
      const bool improved = ev.top1() > st.best_top1;
      if (improved) st.best_top1 = ev.top1();
      result.last_eval = ev;
      // NaN (written as null) when this process ran no step of the epoch (a resume at its last batch).
      const double train_loss = epoch_steps ? epoch_loss / static_cast<double>(epoch_steps) : std::nan("");
      spdlog::info("epoch {}/{} done in {:.1f} s: train loss {:.4f}, test loss {:.4f}, top-1 {:.2f}%, top-5 {:.2f}%",
                   epoch + 1, cfg.train.epochs, secs, train_loss, ev.loss, 100 * ev.top1(), 100 * ev.top5());
      metrics.write(MetricsRecord("eval")
                        .add("step", st.step)
                        .add("epoch", epoch + 1)
                        .add("train_loss", train_loss)
                        .add("test_loss", ev.loss)
                        .add("test_acc", ev.top1())
                        .add("test_top5", ev.top5())
                        .add("test_correct", ev.correct)
                        .add("test_total", ev.total)
                        .add("epoch_seconds", secs)
                        .add("host_peak_mb", peak_host_mb()));
      if (epoch_done && cfg.checkpoint.every_epochs > 0 && (epoch + 1) % cfg.checkpoint.every_epochs == 0)
        save(loader.position(), improved);
    } else if (epoch_done && cfg.checkpoint.every_epochs > 0 && (epoch + 1) % cfg.checkpoint.every_epochs == 0) {
      save(loader.position(), false);
    }
  }
  result.steps = st.step;
  result.best_top1 = std::max(0.0, st.best_top1);
  return result;
}

EvalResult run_evaluation(const TrainerConfig& cfg, const std::string& checkpoint_dir) {
  check_device(cfg.train.device);
  const Datasets ds = make_datasets(cfg);
  Generator init_gen(cfg.run.seed);
  auto model = make_model(cfg, ds, init_gen, std::make_shared<Generator>(0));
  model->to(cfg.train.dtype);
  std::optional<io::Checkpoint> ck;
  std::error_code ec;
  if (fs::exists(fs::path(checkpoint_dir) / "model.safetensors", ec)) ck = io::load_checkpoint_dir(checkpoint_dir);
  else ck = io::load_latest_checkpoint(checkpoint_dir);
  HT_CHECK(ck.has_value(), "--checkpoint: no checkpoint found in {}", checkpoint_dir);
  model->load_state_dict(ck->model.tensors);
  model->to(cfg.train.device);
  spdlog::info("evaluating {} (step {}) on {} test samples", ck->dir.string(), ck->step, ds.test->size());
  return evaluate(*model, ds.test, loader_options(cfg, ds, Split::test), compute_dtype(cfg), cfg.train.device);
}

}  // namespace ht::train
