// `hadatrain inspect-grads`: the per-layer sensitivity analysis users run before choosing a gradient
// pipeline (the HLQ paper's own analysis). One training batch runs forward and backward exactly while
// every Linear / Conv2d records its product input x, weight W, output Y and output gradient g_y; then each
// requested pipeline recomputes that layer's Y, g_x and g_w from the same x, W and g_y, so every number is the
// error the layer itself introduces (not accumulated through earlier layers). Y differs from exact's only for a
// pipeline that quantises the forward (HALO).
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
  double y_rel_err = 0, y_cosine = 1;    // the forward's output Y against exact's
  double gx_rel_err = 0, gx_cosine = 1;  // ||g − g_exact|| / ||g_exact|| and cos(g, g_exact)
  double gw_rel_err = 0, gw_cosine = 1;
  int64_t saved_bytes = 0;               // activation bytes the pipeline's forward keeps
};

struct LayerGradReport {
  std::string name, type;
  int64_t B = 0, L = 0, I = 0, O = 0;  // Note [Product geometry]
  // crest_factor of the exact pass's x, W and g_y: what a per-tensor scale has to cover (Note [Crest factor]).
  double x_crest = 0, w_crest = 0, gy_crest = 0;
  std::vector<PipelineGradError> results;
};

// Note [Crest factor]. max |v| / rms(v) over the whole tensor (0 for an all-zero or empty one). A symmetric
// b-bit quantiser with one scale per tensor (HALO's, spec §3) spaces its levels max |v| / (2^(b−1) − 1) apart,
// so its rounding error relative to the tensor's rms grows with this ratio: about crest / (127 · √12) for int8
// with round-to-nearest. Outlier channels raise it (one channel at 20× the others' scale puts it near 20 or
// above), and a Hadamard rotation lowers it toward a Gaussian's (about 4 to 5 at these sizes), which is why
// the rotations of HALO-1/2 matter where the crest factor is large and little where it is not.
double crest_factor(const Tensor& v);

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
