// bind_pipelines: one pipeline object per Linear / Conv2d, chosen by module-name pattern.
#include "hadatrain/nn/pipelines.h"

#include <algorithm>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
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
  // Per override pattern: whether it selected a layer, and whether it matched one at all (it may match only
  // layers an earlier pattern took: first match wins).
  std::vector<bool> selected(config.overrides.size(), false), matched(config.overrides.size(), false);
  std::vector<std::string> ignored_recompute;  // Conv2d layers whose spec sets recompute_output (Linear only)
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
    // The first matching pattern selects the spec (grad::select_spec's rule); later matches are only noted.
    const grad::PipelineSpec* spec = &config.default_spec;
    for (std::size_t i = 0; i < config.overrides.size(); ++i) {
      if (!grad::glob_match(config.overrides[i].first, name)) continue;
      matched[i] = true;
      if (spec == &config.default_spec) {
        selected[i] = true;
        spec = &config.overrides[i].second;
      }
    }
    b->pipeline = grad::make_pipeline(*spec);
    b->key = grad::NoiseKey{config.seed, layer++, 0};
    b->clock = clock;
    b->saved_bytes = 0;
    b->recompute_output = spec->recompute_output && type == "Linear";
    if (spec->recompute_output && type != "Linear") ignored_recompute.push_back(name);
    b->output_rebuilt = false;
    out.push_back({name, type, grad::describe(*spec), b});
  }
  // A pattern that selects nothing is almost always a typo (or a config written for another model): the run
  // would silently train those layers with the default pipeline.
  for (std::size_t i = 0; i < config.overrides.size(); ++i) {
    if (selected[i]) continue;
    std::string names;
    for (std::size_t k = 0; k < out.size() && k < 12; ++k) names += (k ? ", " : "") + out[k].name;
    if (out.size() > 12) names += fmt::format(", ... ({} in all)", out.size());
    const std::string& pattern = config.overrides[i].first;
    HT_FAIL("grad_pipeline.layers: pattern '{}' {}; the Linear / Conv2d layers are: {}", pattern,
            matched[i] ? "matches only layers that an earlier pattern already selects (the first match wins)"
                       : "matches no Linear or Conv2d of the model",
            names.empty() ? "(none)" : names);
  }
  if (!ignored_recompute.empty())
    logging::warn("grad_pipeline: recompute_output is for Linear layers; {} Conv2d layer(s) keep their output as "
                  "usual (first: {}; docs/gradient_pipelines.md, \"Recomputed outputs\")",
                  ignored_recompute.size(), ignored_recompute.front());
  return out;
}

bool any_draws_noise(const std::vector<BoundLayer>& layers) {
  return std::any_of(layers.begin(), layers.end(),
                     [](const BoundLayer& l) { return l.binding->pipeline && l.binding->pipeline->draws_noise(); });
}

std::string describe_fallbacks(const std::vector<BoundLayer>& layers) {
  // (what, layers), in the order first seen; `what` is "<pipeline name> <its fallback>".
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const BoundLayer& l : layers) {
    const auto& p = l.binding->pipeline;
    if (!p) continue;
    const std::string fb = p->fallback();
    if (fb.empty()) continue;
    const std::string what = p->name() + " " + fb;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == what; });
    if (it == groups.end()) groups.push_back({what, {l.name}});
    else it->second.push_back(l.name);
  }
  if (groups.empty()) return {};
  std::string line = "grad pipeline fallbacks:";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    std::string names;
    for (const std::string& n : groups[i].second) names += (names.empty() ? "" : ", ") + n;
    line += fmt::format("{} {} ({})", i == 0 ? "" : ";", names, groups[i].first);
  }
  return line;
}

void log_fallbacks(const std::vector<BoundLayer>& layers) {
  if (const std::string line = describe_fallbacks(layers); !line.empty()) logging::warn("{}", line);
}

}  // namespace ht::nn
