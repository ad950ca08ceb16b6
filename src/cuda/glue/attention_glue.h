// Tensor-level glue of the attention kernels (cuda/kernels/attention.cuh). Internal to src/ops; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include <array>
#include <utility>

#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/attention.cuh"

namespace ht::cuda_ops {

// (out (B, Hq, T, Dv) of q's dtype, lse (B, Hq, T): f64 for f64 inputs, else f32). q, k, v: any layout,
// one dtype (fp8 is computed in f32).
std::pair<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const kernels::AttnShape& s);
// {dq, dk, dv} in the dtypes of q, k, v, from the forward's inputs, its lse and the output gradient.
std::array<Tensor, 3> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                                         const Tensor& dout, const kernels::AttnShape& s);

}  // namespace ht::cuda_ops
#endif
