// Tensor-level entry points to the HLA projection kernel (cuda/kernels/hla.cuh). Internal to src/grad; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/grad/hla.h"

namespace ht::cuda_ops {

// out: f32, contiguous, (B, R, C) for HlaLayout::rows or (B, C, R) for channels; x (B, L, C) on out's device,
// any floating dtype and strides; plan already validated against x by the caller. absmax: optional device
// f32 holding 0 (or any non-negative value) that receives max(itself, max |out|).
void hla_project(const Tensor& out, const Tensor& x, const grad::HlaPlan& plan, grad::HlaLayout layout,
                 float* absmax = nullptr);

// The same for cols = unfold2d(image, window) (N, L, C·kh·kw) without materialising them: out (N, R, C·kh·kw)
// or (N, C·kh·kw, R); image (N, C, H, W) on out's device, any floating dtype and strides; window and plan
// (L = OH·OW) already validated by the caller. The fused im2col kernel, or unfold2d + hla_project for an image
// it cannot index (negative strides, or offsets within a sample beyond int32); the same bits either way.
void hla_project_unfolded(const Tensor& out, const Tensor& image, const Unfold2dParams& window,
                          const grad::HlaPlan& plan, grad::HlaLayout layout, float* absmax = nullptr);

// Note [HLA back-projection] (include/hadatrain/grad/hla.h): out (B, L, C) contiguous, f32 / f64 / bf16 / f16;
// g (B, R, C) on out's device, any floating dtype and strides; plan already validated by the caller.
void hla_back_project(const Tensor& out, const Tensor& g, const grad::HlaPlan& plan, float mult);

}  // namespace ht::cuda_ops
#endif
