// Tensor-level entry point to the HLA projection kernel (kernels/hla.h). Internal to src/grad; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/grad/hla.h"

namespace ht::cuda_ops {

// out: f32, contiguous, (B, R, C) for HlaLayout::rows or (B, C, R) for channels; x (B, L, C) on out's device,
// any floating dtype and strides; plan already validated against x by the caller. absmax: optional device
// f32 holding 0 (or any non-negative value) that receives max(itself, max |out|).
void hla_project(const Tensor& out, const Tensor& x, const grad::HlaPlan& plan, grad::HlaLayout layout,
                 float* absmax = nullptr);

}  // namespace ht::cuda_ops
#endif
