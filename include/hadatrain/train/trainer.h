// The trainer behind `hadatrain train` and `hadatrain eval`: builds data, model, optimiser, schedule and task
// from a TrainerConfig, runs the train/eval loop with console logs (a progress line on terminals) and JSONL
// metrics, writes atomic checkpoints and resumes a run exactly where it stopped.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {

struct TrainResult {
  EvalResult last_eval;  // the last evaluation on the test split (total 0 if none ran)
  std::optional<double> best_score;  // the best evaluation score (Task::score_name: top-1); none before one
  int64_t steps = 0;
  std::string out_dir;
};

// What to resume from: nothing, the latest checkpoint in checkpoint.dir, or a given checkpoint directory.
struct ResumeFrom {
  enum class Kind { none, latest, path } kind = Kind::none;
  std::string path;
};

TrainResult run_training(const TrainerConfig& cfg, const ResumeFrom& resume = {});

// Loads the model weights of `checkpoint_dir` (a step_<N> directory, or a checkpoint root whose latest is
// used) and evaluates them with the config's task on the test split.
EvalResult run_evaluation(const TrainerConfig& cfg, const std::string& checkpoint_dir);

}  // namespace ht::train
