// `hadatrain inspect-grads`: the per-layer sensitivity analysis users run before choosing a gradient
// pipeline (the HLQ paper's own analysis). One training batch runs forward and backward exactly while
// every Linear / Conv2d records its product input x, weight W and output gradient g_y; then each requested
// pipeline recomputes that layer's g_x and g_w from the same x, W and g_y, so every number is the error the
// layer itself introduces (not accumulated through earlier layers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/train/trainer_config.h"

namespace ht::train {

struct PipelineGradError {
  std::string pipeline;
  double gx_rel_err = 0, gx_cosine = 1;  // ||g − g_exact|| / ||g_exact|| and cos(g, g_exact)
  double gw_rel_err = 0, gw_cosine = 1;
  int64_t saved_bytes = 0;               // activation bytes the pipeline's forward keeps
};

struct LayerGradReport {
  std::string name, type;
  int64_t B = 0, L = 0, I = 0, O = 0;  // Note [Product geometry]
  std::vector<PipelineGradError> results;
};

struct InspectOptions {
  std::vector<std::string> pipelines{"exact", "hlq", "lbp_wht", "luq"};
  uint64_t step = 0;  // the noise step (Note [Pipeline noise])
};

// Runs one batch of the config's training data (first batch of epoch 1). Options of a pipeline come from
// the config's grad_pipeline.default when it names that pipeline, else that pipeline's defaults.
std::vector<LayerGradReport> inspect_grads(const TrainerConfig& cfg, const InspectOptions& opts);

// A fixed-width table of the report (one row per layer and pipeline), and the same as JSON.
std::string format_grad_report(const std::vector<LayerGradReport>& report);
std::string grad_report_json(const std::vector<LayerGradReport>& report);

}  // namespace ht::train
