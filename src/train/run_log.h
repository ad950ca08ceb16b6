// The run's output: the train and eval log lines, their JSONL records (metrics.jsonl, train/metrics.h) and,
// when stderr is a terminal, a progress line redrawn in place (step, epoch fraction, loss, throughput, time
// left). Internal to src/train; the loop hands it numbers, it knows no task.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/tensor/device.h"
#include "hadatrain/train/metrics.h"
#include "hadatrain/train/task.h"

namespace ht::train {

struct RunLogOptions {
  std::string metrics_path;   // <out_dir>/metrics.jsonl
  MetricsMode mode = MetricsMode::truncate;  // append when resuming
  // Resuming (mode append): the checkpoint's step, and whether the resumed run evaluates at that step again
  // (its checkpoint was written at an epoch's last batch before the epoch's evaluation). See
  // Note [Metrics after a resume] in run_log.cpp.
  int64_t resume_step = 0;
  bool evaluates_at_resume_step = false;
  std::string unit = "img";   // Task::unit: the throughput is logged as "<unit>/s" and "<unit>_per_s"
  Device device = Device::cpu();  // CUDA: records carry the peak GPU memory
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;    // where the run stops: epochs * steps_per_epoch, or max_steps when lower
};

// One logging window of training steps.
struct TrainWindow {
  int64_t step = 0;           // global steps done
  int64_t epoch = 0;          // 0-based
  int64_t batch = 0;          // batches of the epoch done
  double loss = 0.0;          // mean over the window
  double lr = 0.0;
  double throughput = 0.0;    // units per second over the window
  double data_wait = 0.0;     // share of the window spent waiting for batches
  std::optional<double> grad_norm;  // with optim.clip_grad_norm
  std::optional<double> mfu;        // model FLOPs utilisation, for tasks that count their FLOPs (on CUDA)
  std::vector<std::pair<std::string, double>> extra;  // further keys of the record (dist: comm_bytes per step)
};

// Where an evaluation falls: at the end of an epoch (or of the run, at a train.max_steps stop), or after a step
// inside an epoch (train.eval_every_steps).
enum class EvalPoint { epoch_end, mid_epoch };

// What an eval record says besides the evaluation's figures.
struct EvalAt {
  int64_t step = 0;         // global steps done
  int64_t epoch = 0;        // 0-based
  int64_t batch = 0;        // batches of the epoch done
  double seconds = 0.0;     // epoch_end: the epoch's training time (evaluations not counted); not recorded mid-epoch
  double train_loss = 0.0;  // the mean loss of the epoch's steps so far; NaN (written as null) when none ran
  EvalPoint point = EvalPoint::epoch_end;
};

// Whether the metrics file at `path` holds an eval record of `step` (false when there is no file).
bool metrics_has_eval_at(const std::string& path, int64_t step);

class RunLog {
 public:
  explicit RunLog(RunLogOptions o);
  void train(const TrainWindow& w);
  // An evaluation. `average`: the weight average's evaluation (config `ema`), logged beside and recorded as
  // ema_test_* keys.
  void eval(const EvalAt& at, const EvalResult& ev, const EvalResult* average = nullptr);
  // Redraws the progress line (at most every 0.2 s, and at an epoch's last batch); nothing unless stderr is
  // a terminal. loss: the latest logged window mean (NaN before one).
  void progress(int64_t step, int64_t epoch, int64_t batch, double loss, double throughput);
  // Erases the progress line so that a log line starts on a clean line.
  void clear_progress();

 private:
  using Clock = std::chrono::steady_clock;
  RunLogOptions o_;
  MetricsLog metrics_;
  bool tty_;
  std::size_t drawn_ = 0;  // characters of the progress line on screen
  Clock::time_point last_draw_;
  std::optional<std::pair<int64_t, Clock::time_point>> first_;  // the first step shown and when
};

}  // namespace ht::train
