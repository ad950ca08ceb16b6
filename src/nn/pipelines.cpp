// bind_pipelines: one pipeline object per Linear / Conv2d, chosen by module-name pattern.
#include "hadatrain/nn/pipelines.h"

#include <algorithm>

#include "hadatrain/nn/layers.h"

namespace ht::nn {

grad::NoiseKey PipelineBinding::key_now() const {
  grad::NoiseKey k = key;
  if (clock) {
    k.step = clock->step;
    if (clock->word.defined()) k.step_word = clock->word.data<int64_t>();
  }
  return k;
}

std::vector<BoundLayer> bind_pipelines(Module& root, const grad::PipelineConfig& config,
                                       std::shared_ptr<const grad::StepClock> clock) {
  std::vector<BoundLayer> out;
  uint32_t layer = 0;
  for (auto& [name, m] : root.named_modules()) {
    PipelineBinding* b = nullptr;
    std::string type;
    if (auto* lin = dynamic_cast<Linear*>(m)) {
      b = &lin->grad_pipeline;
      type = "Linear";
    } else if (auto* conv = dynamic_cast<Conv2d*>(m); conv != nullptr && conv->options.groups == 1) {
      b = &conv->grad_pipeline;
      type = "Conv2d";
    }
    if (b == nullptr) continue;
    const grad::PipelineSpec& spec = grad::select_spec(config, name);
    b->pipeline = grad::make_pipeline(spec);
    b->key = grad::NoiseKey{config.seed, layer++, 0};
    b->clock = clock;
    b->saved_bytes = 0;
    out.push_back({name, type, grad::describe(spec), b});
  }
  return out;
}

bool any_draws_noise(const std::vector<BoundLayer>& layers) {
  return std::any_of(layers.begin(), layers.end(),
                     [](const BoundLayer& l) { return l.binding->pipeline && l.binding->pipeline->draws_noise(); });
}

}  // namespace ht::nn
