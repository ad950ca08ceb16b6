// The classifier job behind `hadatrain train`: an MLP trained with SGD on an MNIST-layout dataset
// (Fashion-MNIST by default), evaluated on the test split after every epoch. Writes the resolved config
// (config.yaml) and JSONL metrics (metrics.jsonl) into run.out_dir.
#pragma once
#include <cstdint>
#include <string>

#include "hadatrain/train/job_config.h"

namespace ht::train {

struct ClassifierJobResult {
  double test_accuracy = 0.0;  // top-1 accuracy on the test split after the last epoch, in [0, 1]
  double test_loss = 0.0;      // mean cross-entropy on the test split after the last epoch
  int64_t steps = 0;           // optimiser steps taken
  std::string out_dir;
};

// Runs the whole job. Throws ht::Error on bad data, an unusable device or a diverged loss.
ClassifierJobResult run_classifier_job(const ClassifierJobConfig& cfg);

}  // namespace ht::train
