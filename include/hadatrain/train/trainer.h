// The trainer behind `hadatrain train` and `hadatrain eval`: builds data, model, optimiser and schedule from
// a TrainerConfig, runs the train/eval loop with console logs (a progress bar on terminals) and JSONL
// metrics, writes atomic checkpoints and resumes a run exactly where it stopped.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "hadatrain/train/trainer_config.h"

namespace ht::train {

struct EvalResult {
  double loss = 0.0;  // mean cross-entropy (no label smoothing)
  int64_t correct = 0, correct_top5 = 0, total = 0;
  double top1() const { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
  double top5() const { return total ? static_cast<double>(correct_top5) / static_cast<double>(total) : 0.0; }
};

struct TrainResult {
  EvalResult last_eval;  // the last evaluation on the test split (total 0 if none ran)
  double best_top1 = 0.0;
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
// used) and evaluates on the test split.
EvalResult run_evaluation(const TrainerConfig& cfg, const std::string& checkpoint_dir);

}  // namespace ht::train
