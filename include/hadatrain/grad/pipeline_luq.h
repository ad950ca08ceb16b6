// The `luq` baseline's options (hlq.md §10; docs/gradient_pipelines.md): g_y in 4-bit logarithmic unbiased
// quantisation, W and the saved x in 4-bit INT, both backward products full rank. The pipeline, its config
// reader and its description are in src/grad/pipeline_luq.cpp.
#pragma once
#include <memory>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/quant.h"

namespace ht::grad {

struct LuqOptions {
  int bits = 4;
  WeightQuant w_quant = WeightQuant::sawb;  // W and the saved x: 4-bit INT, round to nearest
  int x_bits = 4;
};

// A new luq pipeline for one layer.
std::shared_ptr<Pipeline> make_luq_pipeline(const LuqOptions& o);

}  // namespace ht::grad
