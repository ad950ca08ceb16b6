// Tensor-level entry points to the unfold / fold kernels (cuda/kernels/unfold.cuh). Internal to src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include <cstdint>

#include "hadatrain/ops/unfold.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::cuda_ops {

// Sizes validated by src/ops/unfold.cpp: image (N, C, H, W), output grid OH x OW, window params.
struct UnfoldProblem {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  Unfold2dParams p;
};

// cols (N, OH·OW, C·kh·kw) contiguous <- x (N, C, H, W) of cols' dtype, any strides.
void unfold2d(const Tensor& cols, const Tensor& x, const UnfoldProblem& s);
// x (N, C, H, W) contiguous <- fold of cols (N, OH·OW, C·kh·kw) of x's dtype, any strides.
void fold2d(const Tensor& x, const Tensor& cols, const UnfoldProblem& s);

}  // namespace ht::cuda_ops
#endif
