// The `lbp_wht` baseline's options (hlq.md §11; docs/gradient_pipelines.md): low-pass 2-D Walsh projection of
// each 8×8 patch of the token grid for both backward products. The pipeline, its config reader and its
// description are in src/grad/pipeline_lbp_wht.cpp.
#pragma once
#include <cstdint>
#include <memory>

#include "hadatrain/grad/pipeline.h"

namespace ht::grad {

struct LbpWhtOptions {
  int64_t order = 6;           // k: keeps the k(k+1)/2 lowest 2-D Walsh bases of each 8×8 patch
  int64_t extra_tokens = -1;   // leading tokens outside the grid (-1: 0 if L is a square, 1 if L−1 is)
};

// A new lbp_wht pipeline for one layer.
std::shared_ptr<Pipeline> make_lbp_wht_pipeline(const LbpWhtOptions& o);

}  // namespace ht::grad
