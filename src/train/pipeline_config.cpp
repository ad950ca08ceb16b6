// Reading the `grad_pipeline` section into grad::PipelineConfig (documented in docs/config.md). Each entry's
// `name` picks a registered pipeline (grad/registry.h), which reads its own options.
#include "hadatrain/train/pipeline_config.h"

#include "hadatrain/grad/registry.h"

namespace ht::train {

grad::PipelineSpec read_pipeline_spec(ConfigReader r) {
  grad::PipelineSpec s;
  s.name = r.get_enum("name", "exact", grad::registered_pipelines());
  s.recompute_output = r.get("recompute_output", false);
  s.options = grad::find_pipeline(s.name).read_options(r);
  return s;
}

grad::PipelineConfig read_grad_pipeline(ConfigReader r, uint64_t seed) {
  grad::PipelineConfig c;
  c.seed = seed;
  c.default_spec = read_pipeline_spec(r.child("default"));
  ConfigReader layers = r.child("layers");
  for (const std::string& pattern : layers.keys()) c.overrides.emplace_back(pattern, read_pipeline_spec(layers.child(pattern)));
  return c;
}

}  // namespace ht::train
