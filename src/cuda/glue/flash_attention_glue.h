// Tensor-level glue of the fused attention kernels (cuda/kernels/flash_attention.cuh). Internal to src/ops; CUDA
// builds only. scaled_dot_product_attention (src/ops/attention.cpp) and attention_qkv_packed
// (src/ops/attention_qkv_packed.cpp) take this path when flash_attention_applies says so; the former falls
// back to attention_glue.h otherwise.
//
// Operands are (B, H, T, D) tensors of any strides the kernels can use in place (flash_strides): D
// contiguous and every row on a 16-byte boundary, e.g. a transpose(1, 2) view of a (B, T, H, D) buffer or
// the q / k / v slots of a packed (B, T, 3 H D) projection. Inputs of another layout are copied first;
// outputs given to the *_into functions must already have such a layout.
#pragma once
#ifdef HADATRAIN_CUDA
#include <array>
#include <optional>
#include <utility>

#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/flash_attention.cuh"

namespace ht::cuda_ops {

// True when the fused kernels handle inputs of dtype `dt` with shape `s` (bf16/f16, D == Dv in {64, 128},
// Hq a multiple of Hkv, non-empty; any layout: inputs the kernels cannot read in place are copied).
bool flash_attention_applies(DType dt, const kernels::AttnShape& s);

// The kernels' strides of a (B, H, T, D) tensor (0 for dims of size 1), or nothing when they cannot use it
// in place (D not contiguous, data or a row not 16-byte aligned, a token stride of 2^23 or more).
std::optional<kernels::AttnStrides> flash_strides(const Tensor& t);

// Writes softmax(scale q kᵀ) v into `out` (B, Hq, T, D), a tensor of q's dtype with a layout flash_strides
// accepts, and returns lse (B, Hq, T) f32.
Tensor flash_attention_forward_into(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const kernels::AttnShape& s);
// (out (B, Hq, T, D) of q's dtype, contiguous; lse (B, Hq, T) f32).
std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const kernels::AttnShape& s);

// What the backward reads: the forward's inputs, output and lse, and the output gradient (any dtype: it is
// converted to q's).
struct FlashBackwardInputs {
  Tensor q, k, v, out, lse, dout;
};
// Writes {dq, dk, dv} into the given tensors (q's dtype, layouts flash_strides accepts; e.g. the three slots
// of one packed (B, T, 3 H D) gradient buffer).
void flash_attention_backward_into(const std::array<Tensor, 3>& grads, const FlashBackwardInputs& in,
                                   const kernels::AttnShape& s);
// {dq, dk, dv}, contiguous, in the inputs' dtype.
std::array<Tensor, 3> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& lse, const Tensor& dout, const kernels::AttnShape& s);

}  // namespace ht::cuda_ops
#endif
