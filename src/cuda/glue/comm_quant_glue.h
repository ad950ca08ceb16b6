// Tensor-level entry point to the quantised reduce-scatter's dequantise-and-sum kernel (cuda/kernels/comm_quant.cuh).
// Internal to src/dist; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include <cstdint>

#include "hadatrain/tensor/tensor.h"

namespace ht::cuda_ops {

struct CommDequantSum {
  int64_t ranks = 0, chunks_per_rank = 0, chunk = 0, chunk_padded = 0, dest = 0, block = 0;
  int bits = 8;
};
// out (chunk) f32 contiguous; codes u8 and scales f32 contiguous on out's device (sizes checked by the caller).
void comm_dequant_sum(const Tensor& out, const Tensor& codes, const Tensor& scales, const CommDequantSum& p);

}  // namespace ht::cuda_ops
#endif
