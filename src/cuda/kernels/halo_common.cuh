// Helpers shared by HALO's row kernels (halo.cu: the general ones; halo_fast.cu: the ones for rotations whose
// power-of-two part is at least 512): the quantiser's arithmetic, the block absmax, element and 16-byte loads, the
// dispatch over the rotation order K and the row kernels' grid and shared-memory opt-in. Internal to
// src/cuda/kernels.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/halo.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "hadatrain/grad/halo_paley.h"
#include "hadatrain/tensor/dtype_enum.h"
#include "hadatrain/tensor/scalar_types.h"

namespace ht::kernels::halo_detail {

// The e4m3 code of t: detail::float_to_e4m3_bits (round to nearest even, saturating at ±448, signed zeros and
// subnormals kept), in one instruction for a non-NaN t: cvt.rn.satfinite.e4m3x2.f32 (sm_89 and later) rounds the
// same way, clamps ±inf and magnitudes beyond 448 to ±448 and keeps the sign of zero. A NaN keeps the software
// encoding (sign | 0x7F) rather than the instruction's canonical NaN.
// The e4m3 codes of t0 (low byte) and t1 by that instruction, one for both: e4m3_code's for non-NaN values; before
// sm_89, the software encoder's.
__device__ __forceinline__ unsigned short e4m3_pair(float t0, float t1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(t1), "f"(t0));  // the second source: low byte
  return pair;
#else
  return static_cast<unsigned short>(detail::float_to_e4m3_bits(t0) | detail::float_to_e4m3_bits(t1) << 8);
#endif
}

__device__ __forceinline__ uint8_t e4m3_code(float t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (!isnan(t)) return static_cast<uint8_t>(e4m3_pair(t, 0.0f) & 0xffU);
#endif
  return detail::float_to_e4m3_bits(t);
}

// The int8 code of t = v·r: t clamped to ±127, rounded half to even (Note [HALO quantiser]).
__device__ __forceinline__ uint8_t int8_code(float t) {
  return static_cast<uint8_t>(static_cast<int8_t>(rintf(fminf(fmaxf(t, -127.0f), 127.0f))));
}

// The code of v (Note [HALO quantiser] in include/hadatrain/grad/pipeline_halo.h); m == 0 writes +0.
__device__ __forceinline__ uint8_t code_of(float v, float m, float r, bool int8) {
  if (m == 0.0f) return 0;
  const float t = __fmul_rn(v, r);
  if (int8) return int8_code(t);
  return e4m3_code(t);
}

// Note [HALO codes by four]
// The quantise passes write their codes four to a 32-bit word (v[0] in the low byte). code_of per value, with a
// carrier chosen at run time, costs about 14 instructions a code where 3 do the work (ncu on up_proj's paired
// quantiser: 59 instructions a value against the absmax pass's 32): the int8 clamp and conversion are issued
// predicated off beside the e4m3 one, and e4m3_code's NaN test is a branch with its convergence barrier around
// every conversion. codes4 takes the carrier as a template argument, converts the four e4m3 values as two pairs
// (cvt.rn.satfinite.e4m3x2.f32: one instruction for two codes) and tests the four for NaN once: only a group
// holding a NaN goes through e4m3_code value by value. Every code is code_of's, bit for bit.
template <bool I8>
__device__ __forceinline__ uint32_t codes4(const float* v, float m, float r) {
  if (m == 0.0f) return 0;
  float t[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) t[e] = __fmul_rn(v[e], r);
  if constexpr (I8) {
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) w |= uint32_t{int8_code(t[e])} << (8 * e);
    return w;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (!((t[0] != t[0]) | (t[1] != t[1]) | (t[2] != t[2]) | (t[3] != t[3]))) {  // setp.nan, two a pair
      return uint32_t{e4m3_pair(t[0], t[1])} | uint32_t{e4m3_pair(t[2], t[3])} << 16;
    }
#endif
    return uint32_t{e4m3_code(t[0])} | uint32_t{e4m3_code(t[1])} << 8 | uint32_t{e4m3_code(t[2])} << 16 |
           uint32_t{e4m3_code(t[3])} << 24;
  }
}
__device__ __forceinline__ uint32_t codes4(const float* v, float m, float r, bool int8) {
  return int8 ? codes4<true>(v, m, r) : codes4<false>(v, m, r);
}

// Note [HALO bf16 pairs]
// The rotation passes' bf16 outputs are detail::float_to_bf16_bits of each value, bit for bit (the CPU
// reference's encoder). In software that is about eight integer instructions a value, as many as the rotation's
// additions in a row of 256; cvt.rn.bf16x2.f32 rounds two values in one, with the same round-to-nearest-even,
// subnormals and overflow to Inf (test_gpu_halo rotates ties, subnormals, the largest bf16, Inf and NaN). Only NaN
// differs: the instruction writes the canonical 0x7FFF, the encoder sign | 0x7FC0. bf16_pair_hw is the
// instruction alone; its callers test their values for NaN (y != y: setp.nan, folded into one predicate) and
// re-encode only then.
// The bf16 bits of y0 (low half) and y1: exact for non-NaN values (above); device code for sm_80 and newer.
__device__ __forceinline__ uint32_t bf16_pair_hw(float y0, float y1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(y1), "f"(y0));
  return w;
#else
  return uint32_t{detail::float_to_bf16_bits(y0)} | uint32_t{detail::float_to_bf16_bits(y1)} << 16;
#endif
}
// The same bits with NaN encoded as the CPU does: float_to_bf16_bits of both, exactly.
__device__ __forceinline__ uint32_t bf16_pair(float y0, float y1) {
  if ((y0 != y0) | (y1 != y1))  // one setp.nan
    return uint32_t{detail::float_to_bf16_bits(y0)} | uint32_t{detail::float_to_bf16_bits(y1)} << 16;
  return bf16_pair_hw(y0, y1);
}

// One butterfly (a, b) -> (a + b, a − b), each an f32 __fadd_rn / __fsub_rn: the CPU reference's operations, so
// every kernel that runs the same stages on the same pairs gives its bits.
__device__ __forceinline__ void butterfly(float& a, float& b) {
  const float u = a, v = b;
  a = __fadd_rn(u, v);
  b = __fsub_rn(u, v);
}

// Note [HALO shuffle stage]
// A butterfly stage whose pairs (a, b) sit in lanes l and l ^ d of a warp: each lane receives its partner's value p
// by __shfl_xor_sync and computes its own result in one instruction, fma(v, sign, p) with sign = +1 in the lane
// holding a (b + a = a + b: addition commutes) and −1 in the lane holding b (a + (−b) = a − b). v·(±1) is exact, so
// the fused multiply-add rounds a ± b once, as __fadd_rn / __fsub_rn do (signed zeros, Inf, NaN included): the same
// bits with no branch and no separate negation.
__device__ __forceinline__ float shuffle_butterfly(float v, int d, float sign) {
  const float p = __shfl_xor_sync(0xffffffffU, v, d);
  return __fmaf_rn(v, sign, p);
}

// The pair sums p_i = u_2i + u_2i+1 and differences m_i = u_2i − u_2i+1 (i < K/2) that Note [HALO paired K×K stage]
// (grad/halo_paley.h) starts from.
template <int K>
__device__ __forceinline__ void pair_sums(const float* u, float (&ps)[K / 2], float (&ms)[K / 2]) {
#pragma unroll
  for (int i = 0; i < K / 2; ++i) {
    ps[i] = __fadd_rn(u[2 * i], u[2 * i + 1]);
    ms[i] = __fsub_rn(u[2 * i], u[2 * i + 1]);
  }
}

// The K×K stage of a Paley II order (K = 28, 36) on one column u (u[k] = value k·stride of col), in the order of
// Note [HALO paired K×K stage] (grad/halo_paley.h), the signs read from s at run time; output c to col[c·stride].
// H_K is symmetric, so the direction does not matter. halo_fast_rows_impl.cuh has K = 28 with the signs folded in.
template <int K>
__device__ __forceinline__ void paired_kk_column(float* col, int stride, const float (&u)[K], const HaloSigns& s) {
  static_assert(grad::paley::pair_form(K), "a Paley II order");
  constexpr int kHalf = K / 2;
  float ps[kHalf], ms[kHalf];
  pair_sums<K>(u, ps, ms);
#pragma unroll 1
  for (int c = 0; c < K; ++c) {
    const int j = c >> 1;
    const bool odd = (c & 1) != 0;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      // grad::paley::pair_term's selections, inline
      const float t = i == j ? (odd ? ps[i] : ms[i]) : (odd ? ms[i] : ps[i]);
      const bool minus = i == j ? odd : ((s.row[2 * i] >> c) & 1U) != 0;
      if (i == 0) acc = minus ? -t : t;
      else acc = minus ? __fsub_rn(acc, t) : __fadd_rn(acc, t);
    }
    col[c * stride] = acc;
  }
}

// r = qmax / m (0 when m = 0), the quantiser's one f32 division per element's multiplier.
__device__ __forceinline__ float reciprocal_step(float m, bool int8) {
  return m == 0.0f ? 0.0f : __fdiv_rn(int8 ? 127.0f : 448.0f, m);
}
__device__ __forceinline__ float scale_of(float m, bool int8) {
  return m == 0.0f ? 0.0f : __fdiv_rn(m, int8 ? 127.0f : 448.0f);
}

// A quantise pass's start in a 1-D grid: the tensor's absmax m = *absmax and step r = reciprocal_step(m); the
// first thread of CTA 0 writes *scale = scale_of(m).
struct QuantStep {
  float m, r;
};
__device__ __forceinline__ QuantStep quant_step(const float* absmax, float* scale, bool int8) {
  const float m = *absmax, r = reciprocal_step(m, int8);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = scale_of(m, int8);
  return {m, r};
}
// The row kernels' quantise passes (outputs o: halo_fast::rows::Out): the rotated side's step (o.m, o.scale) and,
// when Pair, the unrotated side's (o.m_plain, o.scale_plain; Note [HALO paired quantiser]); zeros otherwise.
template <bool Pair, class O>
__device__ __forceinline__ void quant_steps(const O& o, bool int8, QuantStep& rotated, QuantStep& plain) {
  rotated = quant_step(o.m, o.scale, int8);
  if constexpr (Pair) plain = quant_step(o.m_plain, o.scale_plain, int8);
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

// *word = max(*word, max over the block of v): block_max, then one atomic by thread 0. Every thread calls it, at
// most once per kernel unless a barrier separates two calls (block_max's scratch).
__device__ __forceinline__ void block_max_into(float* word, float v) {
  v = block_max(v);
  if (threadIdx.x == 0) atomic_max_nonneg(word, v);
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

// V = 16 / sizeof(element) consecutive elements from a 16-byte aligned address, as f32: load() from global memory
// through the read-only path, load_shared() from shared memory (a row staged by cp.async).
template <DType DT>
struct Vec16 {
  static constexpr int V = DT == DType::f32 ? 4 : 8;
  static constexpr int kBytes = DT == DType::f32 ? 4 : 2;  // bytes per element
  __device__ __forceinline__ static void unpack(uint4 w, float* v) {
    if constexpr (DT == DType::f32) {
      v[0] = __uint_as_float(w.x), v[1] = __uint_as_float(w.y);
      v[2] = __uint_as_float(w.z), v[3] = __uint_as_float(w.w);
    } else {
      unpack2<DT>(w.x, v);
      unpack2<DT>(w.y, v + 2);
      unpack2<DT>(w.z, v + 4);
      unpack2<DT>(w.w, v + 6);
    }
  }
  __device__ __forceinline__ static void load(const void* x, int64_t i, float* v) {  // i: a multiple of V
    unpack(__ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(x) + i * kBytes)), v);
  }
  __device__ __forceinline__ static void load_shared(const void* x, int i, float* v) {  // i: a multiple of V
    unpack(*reinterpret_cast<const uint4*>(static_cast<const char*>(x) + i * kBytes), v);
  }
};

// One element of a row staged in shared memory as f32, exactly.
template <DType DT>
__device__ __forceinline__ float shared_elem(const void* x, int i) {
  if constexpr (DT == DType::f32) return static_cast<const float*>(x)[i];
  else if constexpr (DT == DType::bf16) return detail::bf16_bits_to_float(static_cast<const uint16_t*>(x)[i]);
  else return detail::f16_bits_to_float(static_cast<const uint16_t*>(x)[i]);
}

// cp.async of 16 bytes global -> shared (L2 only: the rows are read once per pass), and the wait for every copy
// this thread issued; a barrier must follow the wait before other threads read the data.
__device__ __forceinline__ void copy16_async(void* shared_dst, const void* global_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// f(std::integral_constant<int, K>{}) for the runtime rotation order K (1 or a Paley order of
// grad::kHaloPaleyOrders).
template <class F>
void with_k(int k, F&& f) {
  switch (k) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 12: return f(std::integral_constant<int, 12>{});
    case 20: return f(std::integral_constant<int, 20>{});
    case 28: return f(std::integral_constant<int, 28>{});
    case 36: return f(std::integral_constant<int, 36>{});
    case 44: return f(std::integral_constant<int, 44>{});
    case 60: return f(std::integral_constant<int, 60>{});
    default: HT_UNSUPPORTED_DTYPE("halo rotation order K", k);
  }
}

// The grid of a row kernel (one CTA per row at a time, grid-stride over the rows): at most kMaxRowBlocks CTAs,
// which bounds the absmax kernels' atomics to one per CTA.
inline constexpr int64_t kMaxRowBlocks = 132 * 8;
inline unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxRowBlocks ? (rows < 1 ? 1 : rows) : kMaxRowBlocks);
}

// Before a launch of `kernel` with `smem` bytes of dynamic shared memory: the kernel is opted in once, to
// max_bytes (the most any of its launches asks for). The default limit (48 KiB) bounds the kernel's static shared
// memory plus the dynamic bytes, so a launch asking for 48 KiB or a little less of dynamic memory already fails
// without the opt-in when the kernel has static scratch (block_max's): the rows kernel with a staged bf16 row of
// 8192 values asks for exactly 48 KiB and failed with cudaErrorInvalidValue. Opting in whenever dynamic memory
// is used removes that case. The attribute call is not a stream operation, so a first call while a step graph
// records is fine.
template <auto kernel>
void opt_in_shared(size_t smem, size_t max_bytes) {
  static std::atomic<bool> opted_in{false};
  if (smem > 0 && !opted_in.load()) {
    HT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_bytes)));
    opted_in = true;
  }
}

}  // namespace ht::kernels::halo_detail
