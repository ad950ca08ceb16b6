// Binding gradient pipelines to a model's layers (DESIGN.md, "The gradient-pipeline plug-in point"): each
// Linear and each Conv2d with groups = 1 gets its own pipeline object, chosen by the first matching
// module-name pattern of the config. A layer captures its binding when its forward runs; backward never
// looks anything up globally.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline.h"

namespace ht::nn {

class Module;

struct PipelineBinding {
  std::shared_ptr<grad::Pipeline> pipeline;  // null (or exact): the plain linear / conv2d ops
  grad::NoiseKey key;                         // seed and layer id; the step is read from `clock` per forward
  std::shared_ptr<const grad::StepClock> clock;
  int64_t saved_bytes = 0;                    // activation bytes the latest training forward kept
  // PipelineSpec::recompute_output (Linear layers), and whether the latest training forward's product could offer
  // its output for rebuilding (Note [Recomputed outputs]).
  bool recompute_output = false;
  bool output_rebuilt = false;
  // Whether the pipeline changes a product (it is not exact both ways, grad::Pipeline::exact_backward).
  bool active() const { return pipeline != nullptr && !(pipeline->exact_forward() && pipeline->exact_backward()); }
  // Whether a forward whose inputs need (`grad`) or do not need a gradient goes through the pipeline (an exact layer
  // too when it recomputes its output: only the product's node can rebuild it).
  bool routes(bool grad) const {
    return pipeline != nullptr && (grad ? active() || recompute_output : !pipeline->exact_forward());
  }
  grad::NoiseKey key_now() const;
};

struct BoundLayer {
  std::string name;      // module name, e.g. "layer1.0.conv1"
  std::string type;      // Linear / Conv2d
  std::string pipeline;  // describe() of the spec
  PipelineBinding* binding = nullptr;
};

// Binds every Linear and every Conv2d with groups = 1 below `root` (layer ids in module order). Grouped
// convolutions stay exact. Returns one entry per bound layer. Throws when a `config.overrides` pattern selects
// no layer (it matches none, or only layers an earlier pattern selects), naming the pattern and the layers.
std::vector<BoundLayer> bind_pipelines(Module& root, const grad::PipelineConfig& config,
                                       std::shared_ptr<const grad::StepClock> clock);

// Whether any bound layer's pipeline draws stochastic-rounding noise (grad::Pipeline::draws_noise).
bool any_draws_noise(const std::vector<BoundLayer>& layers);

// The bound layers whose latest training forward fell back (grad::Pipeline::fallback: an identity HLA, an exact
// LBP-WHT layer) in one line, the layers grouped by what they fell back to: "grad pipeline fallbacks: fc
// (lbp_wht runs exact: 64 rows have no token grid (...)); blocks.0.attn.qkv, ... (hlq HLA keeps every row: ...)".
// Empty when none did. A fallback depends on the product's shape, so ask after the first training step.
std::string describe_fallbacks(const std::vector<BoundLayer>& layers);
// Logs describe_fallbacks as one warning, when it is not empty.
void log_fallbacks(const std::vector<BoundLayer>& layers);

}  // namespace ht::nn
