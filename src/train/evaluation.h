// The test-set evaluation that training runs (epoch ends, train.eval_every_steps) and `hadatrain eval` runs
// (run_evaluation, trainer.h). Internal to src/train.
#pragma once
#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"
#include "trainer_setup.h"

namespace ht::train {

class DistributedRun;

// The test set evaluated: by this process alone, or with data-parallel ranks each evaluating their rows of every
// test batch and adding the sums (Note [Sharded evaluation] in distributed.cpp).
EvalResult evaluate_test_set(nn::Module& model, const Task& task, const TrainerConfig& cfg, const Datasets& ds,
                             Device device, DistributedRun* dist_run);

}  // namespace ht::train
