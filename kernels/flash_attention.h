// Launchers of the fused (FlashAttention-2 style) attention kernels for bf16 / f16 on sm_80+ (built for
// sm_90a): tensor-core mma.sync, online softmax, no (T, S) matrix in memory. The fallback for every other
// case is kernels/attention.h; `flash_attention_supported` says which path a problem takes.
// Buffers are contiguous: q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, D), out/dout (B, Hq, T, D),
// lse and dsum (B, Hq, T) f32, dq_acc (B, Hq, T, D) f32. The shape struct is attention.h's AttnShape
// (causal alignment: Note [Causal alignment and empty rows] in src/ops/attention.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "kernels/attention.h"

namespace ht::kernels {

// True when the fused kernels handle this problem: dtype bf16 or f16, D == Dv in {64, 128}, Hq a multiple
// of Hkv, and at least one query row and one key.
bool flash_attention_supported(DType dt, const AttnShape& s);

// out = softmax(scale q kᵀ) v and lse (f32, natural log; -inf and out 0 for rows that see no key).
void launch_flash_attention_forward(DType dt, void* out, float* lse, const void* q, const void* k, const void* v,
                                    const AttnShape& s, cudaStream_t stream);

// The backward pass. Workspaces of the caller: dsum (B, Hq, T) f32 and dq_acc (B, Hq, T, D) f32 (both need
// no initialisation; the launcher zeroes dq_acc). dq (dtype dt) is written through dq_acc: the dQ partial
// products of the key blocks are added with fp32 atomics, so dq is not bitwise deterministic from run to
// run (dk, dv are: each key block's CTA owns its rows and sums its query heads and blocks in a fixed order).
struct FlashGrads {
  void* dq;
  void* dk;
  void* dv;
  float* dsum;
  float* dq_acc;
};
void launch_flash_attention_backward(DType dt, const FlashGrads& g, const void* q, const void* k, const void* v,
                                     const void* out, const float* lse, const void* dout, const AttnShape& s,
                                     cudaStream_t stream);

// How many forward and backward passes the fused kernels ran in this process (tests assert that the fused
// path was taken rather than the fallback).
struct FlashAttentionCounts {
  int64_t forward = 0, backward = 0;
};
FlashAttentionCounts flash_attention_counts();

}  // namespace ht::kernels
