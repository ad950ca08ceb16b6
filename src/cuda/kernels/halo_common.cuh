// Device helpers shared by HALO's row kernels (halo.cu: the general ones; halo_fast.cu: the ones for rotations
// whose power-of-two part is at least 512). Internal to src/cuda/kernels.
#pragma once
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "hadatrain/tensor/scalar_types.h"

namespace ht::kernels::halo_detail {

// The code of v (Note [HALO quantiser] in include/hadatrain/grad/pipeline_halo.h); m == 0 writes +0.
__device__ __forceinline__ uint8_t code_of(float v, float m, float r, bool int8) {
  if (m == 0.0f) return 0;
  const float t = __fmul_rn(v, r);
  if (int8) return static_cast<uint8_t>(static_cast<int8_t>(rintf(fminf(fmaxf(t, -127.0f), 127.0f))));
  return detail::float_to_e4m3_bits(t);
}

// r = qmax / m (0 when m = 0), the quantiser's one f32 division per element's multiplier.
__device__ __forceinline__ float reciprocal_step(float m, bool int8) {
  return m == 0.0f ? 0.0f : __fdiv_rn(int8 ? 127.0f : 448.0f, m);
}
__device__ __forceinline__ float scale_of(float m, bool int8) {
  return m == 0.0f ? 0.0f : __fdiv_rn(m, int8 ? 127.0f : 448.0f);
}

// max over the block of v (every thread passes its own); the result in thread 0. It has a barrier and a static
// scratch: every thread of the block calls it, once per kernel.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float red[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < (blockDim.x + 31) / 32 ? red[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  }
  return v;
}

// *addr = max(*addr, v) for v >= 0 (f32 bits of non-negative floats order as unsigned integers).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}

// One element of an input of dtype DT (f32, bf16 or f16) as f32, exactly.
template <DType DT>
__device__ __forceinline__ float load_elem(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return __ldg(static_cast<const float*>(x) + i);
  else if constexpr (DT == DType::bf16) return detail::bf16_bits_to_float(__ldg(static_cast<const uint16_t*>(x) + i));
  else return detail::f16_bits_to_float(__ldg(static_cast<const uint16_t*>(x) + i));
}

// The two 16-bit halves of a 32-bit word as f32 (element 0 in the low half: little-endian).
template <DType DT>
__device__ __forceinline__ void unpack2(uint32_t w, float* v) {
  if constexpr (DT == DType::bf16) {
    v[0] = detail::bf16_bits_to_float(static_cast<uint16_t>(w & 0xffffU));
    v[1] = detail::bf16_bits_to_float(static_cast<uint16_t>(w >> 16));
  } else {
    v[0] = detail::f16_bits_to_float(static_cast<uint16_t>(w & 0xffffU));
    v[1] = detail::f16_bits_to_float(static_cast<uint16_t>(w >> 16));
  }
}

// V = 16 / sizeof(element) consecutive elements from a 16-byte aligned address, as f32.
template <DType DT>
struct Vec16 {
  static constexpr int V = DT == DType::f32 ? 4 : 8;
  __device__ __forceinline__ static void load(const void* x, int64_t i, float* v) {  // i: a multiple of V
    if constexpr (DT == DType::f32) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(x) + i));
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + i));
      unpack2<DT>(w.x, v);
      unpack2<DT>(w.y, v + 2);
      unpack2<DT>(w.z, v + 4);
      unpack2<DT>(w.w, v + 6);
    }
  }
};

}  // namespace ht::kernels::halo_detail
