// The trainer tests' config helper, apart from dist_testing.h so that the tests that do not run the trainer
// do not see namespace ht::train (several name their own run function `train`).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dist_testing.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::test {

// A trainer config on the idx8 images: `yaml` with "{root}" replaced by idx8_dataset()'s folder is written to
// scratch_dir()/<file> and loaded with `sets` and run.out_dir=scratch_dir()/<run_name>. The file goes through
// a per-process temporary renamed over it, so forked ranks may call this at once; make idx8_dataset() before
// the fork (it is not written that way).
train::TrainerConfig idx8_config(const std::string& file, const std::string& yaml, const std::string& run_name,
                                 std::vector<std::string> sets = {});

// Two ranks (launcher variables set) train `config()` with a stop request, `signal`, that only rank 0 sees, from
// before the first step (Note [Agreeing on a stop] in src/train/distributed.cpp): each rank expects to return stopped
// by it after step 2, the step its checkpoint holds. Returns the ranks' outcomes.
std::vector<RankOutcome> run_stop_seen_by_rank0(const std::function<train::TrainerConfig()>& config, int signal);

}  // namespace ht::test
