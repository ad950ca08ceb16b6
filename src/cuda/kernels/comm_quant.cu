// The quantised reduce-scatter's dequantise-and-sum (launcher and contract: cuda/kernels/comm_quant.cuh).
// Bit-identical to the CPU loop in src/dist/comm_quant.cpp: the same f32 operations in the same order.
#include "cuda/kernels/comm_quant.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

template <int Bits>
__device__ __forceinline__ int level_at(const uint8_t* codes, int64_t i) {
  if constexpr (Bits == 8) {
    return static_cast<int8_t>(codes[i]);
  } else {
    const int nib = (codes[i / 2] >> (4 * (i % 2))) & 0xF;  // element 2k in the low nibble
    return (nib ^ 8) - 8;
  }
}

template <int Bits>
__global__ void dequant_sum_kernel(CommDequantSumArgs a, float* out) {
  const int64_t per_rank = a.chunks_per_rank * a.chunk_padded, blocks_per_rank = per_rank / a.block;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < a.chunk; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = a.dest * a.chunk_padded + e;
    float acc = 0.0f;
    for (int64_t r = 0; r < a.ranks; ++r) {
      const float level = static_cast<float>(level_at<Bits>(a.codes + r * per_rank * Bits / 8, i));
      acc = __fadd_rn(acc, __fmul_rn(level, a.scales[r * blocks_per_rank + i / a.block]));
    }
    out[e] = acc;
  }
}

}  // namespace

void launch_comm_dequant_sum(const CommDequantSumArgs& a, float* out, cudaStream_t stream) {
  const unsigned grid = cuda::grid_for(a.chunk);
  if (a.bits == 8) dequant_sum_kernel<8><<<grid, cuda::kBlock, 0, stream>>>(a, out);
  else if (a.bits == 4) dequant_sum_kernel<4><<<grid, cuda::kBlock, 0, stream>>>(a, out);
  else HT_UNSUPPORTED_DTYPE("comm_dequant_sum bits", a.bits);
  HT_CHECK_LAUNCH("comm_dequant_sum");
}

}  // namespace ht::kernels
