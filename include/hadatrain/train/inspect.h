// `hadatrain inspect-grads`: the per-layer sensitivity analysis users run before choosing a gradient
// pipeline (the HLQ paper's own analysis). One training batch runs forward and backward exactly while
// every Linear / Conv2d records its product input x, weight W and output gradient g_y; then each requested
// pipeline recomputes that layer's g_x and g_w from the same x, W and g_y, so every number is the error the
// layer itself introduces (not accumulated through earlier layers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {

struct PipelineGradError {
  std::string pipeline;                  // the label of the compared pipeline (InspectedPipeline::label)
  std::string name;                      // its registered name (grad/registry.h)
  bool exact = false;                    // the pipeline is exact both ways (the reference of the memory totals)
  double gx_rel_err = 0, gx_cosine = 1;  // ||g − g_exact|| / ||g_exact|| and cos(g, g_exact)
  double gw_rel_err = 0, gw_cosine = 1;
  int64_t saved_bytes = 0;               // activation bytes the pipeline's forward keeps
};

struct LayerGradReport {
  std::string name, type;
  int64_t B = 0, L = 0, I = 0, O = 0;  // Note [Product geometry]
  std::vector<PipelineGradError> results;
};

// One pipeline to compare: how the report names it, and its options.
struct InspectedPipeline {
  std::string label;
  grad::PipelineSpec spec;
};

// An entry of `--pipelines`: a pipeline name ("hlq": the options of the config's grad_pipeline.default when
// it names that pipeline, else the pipeline's defaults), or a YAML flow map with `name` and that pipeline's
// options, read like a grad_pipeline entry ("{name: hlq, acbp_bits: 4}": the defaults but for the given
// keys). The label is the entry as written, without surrounding spaces. Unknown names, unknown keys and bad
// values are errors that quote the entry.
InspectedPipeline inspected_pipeline(const TrainerConfig& cfg, const std::string& entry);
// `--pipelines` split at the commas outside braces and brackets: "exact,{name: hlq, acbp_bits: 4}" is two
// entries. Empty entries are dropped; unbalanced braces are an error.
std::vector<std::string> split_pipeline_list(const std::string& list);

struct InspectOptions {
  std::vector<InspectedPipeline> pipelines;  // at least one
  uint64_t step = 0;  // the noise step (Note [Pipeline noise])
};

// Runs one batch of the config's training data (first batch of epoch 1) and compares every pipeline of
// `opts` with exact, layer by layer.
std::vector<LayerGradReport> inspect_grads(const TrainerConfig& cfg, const InspectOptions& opts);

// A fixed-width table of the report (one row per layer and pipeline), and the same as JSON.
std::string format_grad_report(const std::vector<LayerGradReport>& report);
std::string grad_report_json(const std::vector<LayerGradReport>& report);

}  // namespace ht::train
