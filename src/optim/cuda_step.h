// CUDA glue of the optimiser steps: gathers the CUDA parameters of one step into per-dtype descriptor
// arrays and runs the fused multi-tensor kernels of kernels/optim.h. CUDA builds only; the optimisers
// call it from their `#ifdef HADATRAIN_CUDA` branch.
#pragma once
#ifdef HADATRAIN_CUDA
#include <vector>

#include "hadatrain/tensor/tensor.h"
#include "kernels/optim.h"

namespace ht::optim::cuda_step {

// One parameter's tensors for a step. The gradient is made contiguous (and kept alive) by the batch.
struct SgdItem {
  Tensor p, g, buf;  // buf undefined without momentum
  double weight_decay;
  bool first;
};
struct AdamWItem {
  Tensor p, g, m, v;
  double decay;
};

// Runs one launch per (device, dtype) group over all items (empty: nothing).
void sgd(const std::vector<SgdItem>& items, const kernels::SgdHyper& h);
void adamw(const std::vector<AdamWItem>& items, const kernels::AdamWHyper& h);

}  // namespace ht::optim::cuda_step
#endif
