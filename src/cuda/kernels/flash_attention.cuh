// Launchers of the fused (FlashAttention-2 style) attention kernels for bf16 / f16 on sm_80+ (built for
// sm_90a): tensor-core mma.sync, online softmax, no (T, S) matrix in memory. The fallback for every other
// case is cuda/kernels/attention.cuh; `flash_attention_supported` says which path a problem takes.
// Operands q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, D), out/dout/dq (B, Hq, T, D), dk/dv like k/v are
// strided views (AttnStrides; D contiguous, rows 16-byte aligned); the workspaces lse and dsum (B, Hq, T) f32
// and dq_acc (B, Hq, T, D) f32 are contiguous. The shape struct is attention.cuh's AttnShape
// (causal alignment: Note [Causal alignment and empty rows] in src/ops/attention.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/attention.cuh"

namespace ht::kernels {

// True when the fused kernels handle this problem: dtype bf16 or f16, D == Dv in {64, 128}, Hq a multiple
// of Hkv, at least one query row and one key, and T <= 65535 * 128 (the forward's grid).
bool flash_attention_supported(DType dt, const AttnShape& s);

// Element strides of the batch, head and token dims of one (B, H, T, D) operand; D is contiguous (stride
// 1). A (B, T, H, D) buffer seen as (B, H, T, D) has {T H D, D, H D}; q inside a packed (B, T, 3 H D) qkv
// buffer has {3 T H D, D, 3 H D}.
struct AttnStrides {
  int64_t b, h, t;
};
// A read operand and a written one: data (the element (0, 0, 0, 0)) and strides.
struct FlashIn {
  const void* data;
  AttnStrides st;
};
struct FlashOut {
  void* data;
  AttnStrides st;
};
// True when the kernels can read or write an operand with this start and these strides: data 16-byte
// aligned and every stride a multiple of 8 elements (each row starts on a 16-byte boundary). A stride of a
// dim of size 1 is never used: pass 0 for it.
bool flash_layout_ok(const void* data, const AttnStrides& st);

// out = softmax(scale q kᵀ) v and lse (contiguous (B, Hq, T) f32, natural log; -inf and out 0 for rows that
// see no key). q, k, v, out: any strides that flash_layout_ok accepts.
struct FlashForwardArgs {
  FlashOut out;
  float* lse;
  FlashIn q, k, v;
};
void launch_flash_attention_forward(DType dt, const FlashForwardArgs& a, const AttnShape& s, cudaStream_t stream);

// The backward pass. dq, dk, dv and the inputs take any strides flash_layout_ok accepts (dq, dk, dv may be
// the three slots of one packed (B, T, 3 H D) gradient buffer). Contiguous workspaces of the caller: dsum
// (B, Hq, T) f32 and dq_acc (B, Hq, T, D) f32, 16-byte aligned, needing no initialisation (the first kernel
// zeroes dq_acc). dq is written through dq_acc: the dQ partial products of the key blocks are added with fp32
// atomics, so dq is not bitwise deterministic from run to run (dk, dv are: each key block's CTA owns its rows
// and sums its query heads and blocks in a fixed order).
struct FlashBackwardArgs {
  FlashOut dq, dk, dv;
  float* dsum;
  float* dq_acc;
  FlashIn q, k, v, out, dout;
  const float* lse;
};
void launch_flash_attention_backward(DType dt, const FlashBackwardArgs& a, const AttnShape& s, cudaStream_t stream);

// Which backward main kernel runs for head dim `head_dim` (Note [Backward variants] in
// cuda/kernels/flash_attention.cu): the lean kernel (8 warps of 16 keys, each warp owning all columns of its
// keys) at head dim 64, the split-tile kernel (8 warps, 128 keys x 64 queries per iteration, a different warp
// tiling for Sᵀ / dPᵀ, dK / dV and dQ, Pᵀ and dSᵀ through shared memory) at 128.
enum class FlashBackwardKernel { lean, split };
FlashBackwardKernel flash_backward_kernel_for(int64_t head_dim);

// How many forward and backward passes the fused kernels ran in this process (tests assert that the fused
// path was taken rather than the fallback).
struct FlashAttentionCounts {
  int64_t forward = 0, backward = 0;
};
FlashAttentionCounts flash_attention_counts();

}  // namespace ht::kernels
