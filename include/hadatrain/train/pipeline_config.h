// The `grad_pipeline` config section (docs/config.md, docs/gradient_pipelines.md):
//
//   grad_pipeline:
//     default: {name: hlq, gy_scale: token, rank_pct: 50}   # options of the named pipeline only
//     layers:                                               # module-name globs, first match wins
//       fc: {name: exact}
//       "layer4.*": {name: hlq, rank_pct: 25}
#pragma once
#include <cstdint>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"

namespace ht::train {

// One pipeline spec from a map with `name` (a registered pipeline), `recompute_output` and that pipeline's options
// (read by the pipeline's registered reader; unknown keys are errors).
grad::PipelineSpec read_pipeline_spec(ConfigReader r);
// The whole section; `seed` keys the stochastic rounding (the run's seed).
grad::PipelineConfig read_grad_pipeline(ConfigReader r, uint64_t seed);

}  // namespace ht::train
