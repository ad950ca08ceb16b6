// The trainer behind `hadatrain train` and `hadatrain eval`: builds data, model, optimiser, schedule and task
// from a TrainerConfig, runs the train/eval loop with console logs (a progress line on terminals) and JSONL
// metrics, writes atomic checkpoints and resumes a run exactly where it stopped.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {

struct TrainResult {
  EvalResult last_eval;  // the last evaluation on the test split (total 0 if none ran)
  std::optional<EvalResult> last_average_eval;  // config `ema` with evaluate: the weight average's, at the same time
  std::optional<double> best_score;  // the best evaluation score (Task::score_name: top-1); none before one
  int64_t steps = 0;
  std::string out_dir;
  // A resume whose checkpoint is already at the run's end (train.epochs, or a train.max_steps at or below its
  // step): nothing was trained or written, and last_eval is the evaluation of the checkpoint's weights.
  bool already_complete = false;
  // The signal number a stop request carried (run_training's `stop`), 0 when the run was not stopped.
  int stopped_by = 0;
  // already_complete: the checkpoint resumed from; otherwise the last checkpoint this run wrote (at a stop,
  // the one holding the stopped step); "" when none.
  std::string checkpoint;
  int rank = 0;  // under a launcher: this rank (its figures are rank 0's; `hadatrain train` prints rank 0's)
};

// What to resume from: nothing, the latest checkpoint in checkpoint.dir, or a given checkpoint directory.
struct ResumeFrom {
  enum class Kind { none, latest, path } kind = Kind::none;
  std::string path;
};

// Trains the run `cfg` describes. `stop`, when given, is read between steps: once it holds a non-zero value
// (a signal number, stored by a signal handler: the atomic is lock-free), the run finishes the current step,
// writes a checkpoint when checkpointing is on (checkpoint.every_steps or every_epochs), and returns with
// stopped_by set, without evaluating. The run's folder and config.yaml are written only once the resume
// (if any) has succeeded and there is something left to train.
TrainResult run_training(const TrainerConfig& cfg, const ResumeFrom& resume = {},
                         const std::atomic<int>* stop = nullptr);

// An evaluation of a checkpoint: its figures and which checkpoint they are of.
struct CheckpointEvaluation : EvalResult {
  std::filesystem::path checkpoint;  // the step_<N> directory evaluated
  int64_t step = 0;                  // its step
  bool average = false;              // its weight average was evaluated (--ema)
  int rank = 0, world_size = 1;      // under a launcher: this rank, and the ranks that shared the evaluation
};

// Loads the model weights of `checkpoint_dir` (a step_<N> directory, or a checkpoint root whose latest is
// used) and evaluates them with the config's task on the test split. With `average`, the checkpoint's weight
// average (ema.safetensors, config `ema`) replaces the weights it covers; ht::Error when it has none. Under a
// launcher (WORLD_SIZE > 1, any dist.mode) every rank loads the checkpoint, evaluates its rows of every test batch
// and gets the whole test set's figures (the ranks' sums added; docs/distributed.md): one process's up to the
// order of the sums. Every rank must call it with the same config and checkpoint (an error naming what differs).
CheckpointEvaluation run_evaluation(const TrainerConfig& cfg, const std::string& checkpoint_dir, bool average = false);

// The evaluation as one JSON object (`hadatrain eval --json`): "checkpoint", "step", "weights" ("model" or
// "average"), "loss", "total" and the task's figures by name ("acc", "top5", "ppl", "tokens", ...).
std::string evaluation_json(const CheckpointEvaluation& e);

}  // namespace ht::train
