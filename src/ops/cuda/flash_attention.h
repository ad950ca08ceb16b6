// Tensor-level glue of the fused attention kernels (kernels/flash_attention.h). Internal to src/ops; CUDA
// builds only. scaled_dot_product_attention (src/ops/attention.cpp) takes this path when
// flash_attention_applies says so and falls back to cuda/attention.h otherwise.
#pragma once
#ifdef HADATRAIN_CUDA
#include <array>
#include <utility>

#include "hadatrain/tensor/tensor.h"
#include "kernels/flash_attention.h"

namespace ht::cuda_ops {

// True when the fused kernels handle inputs of dtype `dt` with shape `s` (bf16/f16, D == Dv in {64, 128},
// Hq a multiple of Hkv, non-empty; any layout: the glue makes inputs contiguous).
bool flash_attention_applies(DType dt, const kernels::AttnShape& s);

// (out (B, Hq, T, D) of q's dtype, lse (B, Hq, T) f32).
std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const kernels::AttnShape& s);
// {dq, dk, dv} in the inputs' dtype, from the forward's inputs, output and lse and the output gradient.
std::array<Tensor, 3> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& lse, const Tensor& dout, const kernels::AttnShape& s);

}  // namespace ht::cuda_ops
#endif
