// Launchers of the scaled-dot-product attention kernels: a straightforward (correct, not fast) path with
// one block per (batch, query head, query row), the CUDA counterpart of src/ops/attention.cpp.
// Buffers are contiguous: q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), out/dout (B, Hq, T, Dv),
// lse (B, Hq, T). Element dtypes f32 f64 bf16 f16. Compute ("acc") precision: double for f32 and f64 (as
// the CPU reference), float for bf16 and f16. lse is f64 for f64 inputs and f32 otherwise (the CPU's).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

struct AttnShape {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  double scale;
  int32_t causal;  // query t sees keys s <= t + (S - T) (Note [Causal alignment and empty rows])
};

// The accumulator dtype of the dK / dV buffers for inputs of dtype dt: f64 for f32/f64, f32 otherwise.
inline DType attention_acc_dtype(DType dt) { return dt == DType::f32 || dt == DType::f64 ? DType::f64 : DType::f32; }

// out = softmax(scale q kᵀ) v per row and lse = the row's logsumexp (-inf and out 0 for empty rows).
void launch_attention_forward(DType dt, void* out, void* lse, const void* q, const void* k, const void* v,
                              const AttnShape& s, cudaStream_t stream);

// dq (dtype dt) is written; dk (B, Hkv, S, D) and dv (B, Hkv, S, Dv), of attention_acc_dtype(dt), must be
// zeroed by the caller: every query row of every head of the group adds into them (atomicAdd).
struct AttnGrads {
  void* dq;
  void* dk_acc;
  void* dv_acc;
};
void launch_attention_backward(DType dt, const AttnGrads& g, const void* q, const void* k, const void* v,
                               const void* lse, const void* dout, const AttnShape& s, cudaStream_t stream);

}  // namespace ht::kernels
