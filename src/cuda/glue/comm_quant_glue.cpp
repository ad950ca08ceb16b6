// Tensor glue of the quantised reduce-scatter's kernel (cuda/kernels/comm_quant.cuh). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/comm_quant_glue.h"

#include "hadatrain/cuda/context.h"
#include "cuda/kernels/comm_quant.cuh"

namespace ht::cuda_ops {

void comm_dequant_sum(const Tensor& out, const Tensor& codes, const Tensor& scales, const CommDequantSum& p) {
  if (out.numel() == 0) return;
  cuda::DeviceGuard guard(out.device().index);
  kernels::CommDequantSumArgs a;
  a.codes = static_cast<const uint8_t*>(codes.data_ptr());
  a.scales = static_cast<const float*>(scales.data_ptr());
  a.ranks = p.ranks;
  a.chunks_per_rank = p.chunks_per_rank;
  a.chunk = p.chunk;
  a.chunk_padded = p.chunk_padded;
  a.dest = p.dest;
  a.block = p.block;
  a.bits = p.bits;
  kernels::launch_comm_dequant_sum(a, static_cast<float*>(out.data_ptr()), cuda::current_stream(out.device().index));
}

}  // namespace ht::cuda_ops
#endif
