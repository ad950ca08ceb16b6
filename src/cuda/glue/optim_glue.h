// CUDA glue of the optimiser steps: gathers the CUDA parameters of one step into per-dtype descriptor
// batches (kernel arguments) and runs the fused multi-tensor kernels of cuda/kernels/optim.cuh, which read the
// step's hyper-parameters from a small device buffer (DeviceHyper) staged by Optimizer::begin_step. CUDA
// builds only; the optimisers call it from their `#ifdef HADATRAIN_CUDA` branch.
#pragma once
#ifdef HADATRAIN_CUDA
#include <map>
#include <vector>

#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/optim.cuh"

namespace ht::optim::cuda_step {

// One parameter's tensors for a step. The gradient is made contiguous (and kept alive) by the batch.
struct SgdItem {
  Tensor p, g, buf;  // buf undefined without momentum
  double weight_decay;
  bool first;
  double lr_scale;  // the parameter's learning-rate factor (ParamRef::lr_scale)
};
struct AdamWItem {
  Tensor p, g, m, v;
  double weight_decay;  // 0 for parameters without decay
  double lr_scale;      // the parameter's learning-rate factor (ParamRef::lr_scale)
};

// The hyper-parameters of the current step on each device (one 64-byte buffer per device, kept for the
// optimiser's life): stage() writes them in the device's current stream order, the step kernels read them.
class DeviceHyper {
 public:
  template <class H>
  void stage(int device, const H& h) {
    static_assert(sizeof(H) <= 64, "hyper-parameters of at most 64 bytes");
    stage_bytes(device, &h, static_cast<int>(sizeof(H)));
  }
  const void* get(int device) const;

 private:
  void stage_bytes(int device, const void* h, int bytes);
  std::map<int, Tensor> bufs_;
};

// Runs one launch per (device, dtype) group and kOptimBatch items (empty: nothing).
void sgd(const std::vector<SgdItem>& items, const DeviceHyper& h);
void adamw(const std::vector<AdamWItem>& items, const DeviceHyper& h);

}  // namespace ht::optim::cuda_step
#endif
