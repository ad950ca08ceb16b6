// Tensor-level entry points to the HLA projection kernel (kernels/hla.h). Internal to src/grad (and the GPU
// tests, which pick the im2col tile mapping); CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/grad/hla.h"
#include "kernels/hla.h"

namespace ht::cuda_ops {

// How hla_project_unfolded runs (kernels/hla.h): automatic follows HADATRAIN_HLA_IM2COL (unset: unfold2d +
// hla_project); runs or taps run the fused im2col kernel with that tile mapping (the GPU tests name each).
// Every choice gives the same bits.
struct HlaKernelChoice {
  kernels::HlaIm2colTiles tiles = kernels::HlaIm2colTiles::automatic;
};

// out: f32, contiguous, (B, R, C) for HlaLayout::rows or (B, C, R) for channels; x (B, L, C) on out's device,
// any floating dtype and strides; plan already validated against x by the caller. absmax: optional device
// f32 holding 0 (or any non-negative value) that receives max(itself, max |out|).
void hla_project(const Tensor& out, const Tensor& x, const grad::HlaPlan& plan, grad::HlaLayout layout,
                 float* absmax = nullptr);

// The same for cols = unfold2d(image, window) (N, L, C·kh·kw) without materialising them: out (N, R, C·kh·kw)
// or (N, C·kh·kw, R); image (N, C, H, W) on out's device, any floating dtype and strides; window and plan
// (L = OH·OW) already validated by the caller.
void hla_project_unfolded(const Tensor& out, const Tensor& image, const Unfold2dParams& window,
                          const grad::HlaPlan& plan, grad::HlaLayout layout, float* absmax = nullptr,
                          const HlaKernelChoice& choice = {});

}  // namespace ht::cuda_ops
#endif
