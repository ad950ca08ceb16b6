// Internals of the fused attention kernels shared by cuda/kernels/flash_attention*.cu (the interface is
// flash_attention.cuh): the problem as the kernels see it (FlashParams, filled on the host in flash_attention.cu)
// and the launch functions of the three kernel families that the public launchers call:
//   flash_attention_fwd.cu        the forward (Note [Forward kernel]);
//   flash_attention_bwd_lean.cu   the lean backward, 8 warps of 16 keys (Note [Lean backward]);
//   flash_attention_bwd_split.cu  the split-tile backward (Note [Split backward]).
// flash_attention.cu holds the overview, the backward's dsum / dQ conversion kernels, the backward kernel choice and
// the public launchers; flash_attention_common.cuh the device helpers. Included by .cu files only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/flash_attention.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels::fa {

// AttnStrides on the device: the token stride in 32 bits (flash_layout_ok keeps it below 2^23) so that row
// offsets within a tile are 32-bit products.
struct OperandStrides {
  int64_t b, h;
  int t;
};

// Problem sizes as the kernels use them.
struct FlashParams {
  int B, Hq, Hkv, T, S;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  int causal;        // query t sees keys s <= t + (S - T)
  // element strides of every (B, H, T, D) operand; D has stride 1
  OperandStrides q, k, v, o, dout, dq, dk, dv;
};

// flash_attention_fwd.cu: flash_forward_kernel (FwdDefault tiles) for dtype dt and head dim d.
void launch_forward(DType dt, int64_t d, const FlashForwardArgs& a, const FlashParams& p, cudaStream_t stream);
// flash_attention_bwd_lean.cu / flash_attention_bwd_split.cu: the backward's main kernel (between the dsum
// kernel and the dQ conversion, Note [Backward variants]): the lean kernel for head dim 64, the split kernel for
// head dim 128.
void launch_backward_lean(DType dt, const FlashBackwardArgs& a, const FlashParams& p, cudaStream_t stream);
void launch_backward_split(DType dt, const FlashBackwardArgs& a, const FlashParams& p, cudaStream_t stream);

// Launches a backward main kernel of configuration C (lean or split: same arguments, same grid). Key blocks in
// grid.y, past 65535 of them continued in grid.z (Note [Lean backward]).
template <class C, class K>
void launch_backward_kernel(K kernel, const FlashBackwardArgs& a, const FlashParams& p, cudaStream_t stream) {
  HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(C::kSmemBytes)));
  if constexpr (C::kMinBlocks > 2) {
    // 3 CTAs per SM: ask for the largest carveout (the driver's choice may leave room for fewer)
    HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
  }
  constexpr unsigned kMaxGridY = 65535;
  const unsigned key_blocks = static_cast<unsigned>((p.S + C::kBc - 1) / C::kBc);
  const unsigned gy = key_blocks < kMaxGridY ? key_blocks : kMaxGridY;
  const dim3 grid(static_cast<unsigned>(p.B * p.Hkv), gy, (key_blocks + gy - 1) / gy);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      static_cast<uint16_t*>(a.dk.data), static_cast<uint16_t*>(a.dv.data), a.dq_acc,
      static_cast<const uint16_t*>(a.q.data), static_cast<const uint16_t*>(a.k.data),
      static_cast<const uint16_t*>(a.v.data), static_cast<const uint16_t*>(a.dout.data), a.lse, a.dsum, p);
}

}  // namespace ht::kernels::fa
