// Small models and pipeline configs shared by the CPU and GPU tests of the gradient pipelines.
#pragma once
#include <cstdint>

#include <string>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/train/pipeline_config.h"

namespace ht::test {

// A ViT small enough for unit tests: 8×8 images in 4×4 patches (4 tokens and a class token), 10 classes, `heads`
// heads of dim / heads (64 or 128 on CUDA: the fused attention).
inline models::VitConfig tiny_vit(int64_t dim, int64_t heads, int64_t depth) {
  models::VitConfig cfg = models::VitConfig::vit_s4(10);
  cfg.image_size = 8;
  cfg.dim = dim;
  cfg.heads = heads;
  cfg.depth = depth;
  return cfg;
}

// HLQ with its defaults for every layer, and recompute_output (Note [Recomputed outputs]) on every mlp.fc1 and
// attn.qkv when `recompute`.
inline grad::PipelineConfig hlq_recomputing_fc1_qkv(bool recompute) {
  grad::PipelineConfig pc;
  pc.default_spec.name = "hlq";
  grad::PipelineSpec rc = pc.default_spec;
  rc.recompute_output = recompute;
  pc.overrides = {{"*.fc1", rc}, {"*.qkv", rc}};
  return pc;
}

// The `grad_pipeline` section of a YAML text, read as the trainer reads it (every key must be used).
inline grad::PipelineConfig parse_grad_pipeline(const std::string& yaml) {
  auto r = ConfigReader::from_string(yaml, "test.yaml");
  grad::PipelineConfig c = train::read_grad_pipeline(r.child("grad_pipeline"), 0);
  r.finish();
  return c;
}

}  // namespace ht::test
