// The trainer tests' config helper, apart from dist_testing.h so that the tests that do not run the trainer
// do not see namespace ht::train (several name their own run function `train`).
#pragma once

#include <string>
#include <vector>

#include "hadatrain/train/trainer_config.h"

namespace ht::test {

// A trainer config on the idx8 images: `yaml` with "{root}" replaced by idx8_dataset()'s folder is written to
// scratch_dir()/<file> and loaded with `sets` and run.out_dir=scratch_dir()/<run_name>. The file goes through
// a per-process temporary renamed over it, so forked ranks may call this at once; make idx8_dataset() before
// the fork (it is not written that way).
train::TrainerConfig idx8_config(const std::string& file, const std::string& yaml, const std::string& run_name,
                                 std::vector<std::string> sets = {});

}  // namespace ht::test
