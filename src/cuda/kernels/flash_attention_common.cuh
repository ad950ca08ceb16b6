// Device helpers shared by the fused attention kernels (flash_attention.cuh, flash_attention_launch.cuh;
// overview in flash_attention.cu): the 16-bit element types with their mma, cp.async / ldmatrix wrappers,
// fragment loads from padded shared tiles, ex2, the backward's CTA -> key block map, and the host-side dispatch
// over dtype and head dim.
//
// Shared-memory rows are padded by 8 elements (16 bytes) so that the 8 row addresses of an ldmatrix hit
// distinct banks. Rows past T or S are zero-filled by cp.async and masked out of the softmax.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit A/B): lane = 4 g + tq.
//   A (16x16, row-major): a0 (g, 2tq..+1), a1 (g+8, 2tq..), a2 (g, 2tq+8..), a3 (g+8, 2tq+8..)
//   B (16x8, k x n):      b0 (k 2tq..+1, n g), b1 (k 2tq+8..+1, n g)
//   C (16x8, fp32):       c0 c1 (g, 2tq..+1), c2 c3 (g+8, 2tq..+1)
// ldmatrix.x4 loads four 8x8 matrices whose row addresses come from lanes 8i..8i+7; lane holds row g,
// columns 2tq..+1 of each (with .trans: column g, rows 2tq..+1). A C tile pair (n-tiles 2j, 2j+1) in
// bf16 is exactly the A fragment of k-step j, which is how P feeds P V without shared memory.
//
// The helpers are __forceinline__: each kernel compiles as when they shared its file.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/flash_attention_launch.cuh"

namespace ht::kernels::fa {

constexpr float kLog2e = 1.4426950408889634f;

// ---- element types: raw 16-bit storage, float conversions, the mma instruction ----

struct Bf16 {
  __device__ static float to_float(uint16_t x) { return __uint_as_float(static_cast<uint32_t>(x) << 16); }
  // Two floats as one 32-bit register: lo in the low half (the lower column / address).
  __device__ static uint32_t pack(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

struct F16 {
  __device__ static float to_float(uint16_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
    return f;
  }
  __device__ static uint32_t pack(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- shared memory, cp.async, ldmatrix ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zero-filled when !valid (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
// 4 bytes global -> shared (through L1); zero-filled when !valid (src must still be a valid address).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// Rows [r0, r0 + kRows) of a (rows, D) matrix with row stride `ld` elements (a multiple of 8, D contiguous)
// into shared memory with row stride kStride; rows >= `rows` become zeros.
template <int kRows, int D, int kStride, int kThreads>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int ld, int r0, int rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const uint16_t* tile = src + static_cast<int64_t>(r0) * ld;
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r0 + r < rows;
    // r ld fits in 32 bits: |ld| < 2^23 (flash_layout_ok) and r < 128
    cp_async16(dst + r * kStride + c * 8, valid ? tile + (r * ld + c * 8) : src, valid);
  }
}

// The A fragment (16 rows x 16 columns at (row0, col0)) of a row-major shared tile.
template <int kStride>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* tile, int row0, int col0, int lane) {
  ldsm_x4(a, tile + (row0 + (lane & 15)) * kStride + col0 + (lane >> 4) * 8);
}
// B fragments of two n-tiles (n0, n0 + 8) for k-step k0 when the shared tile is stored (n, k) row-major
// (Kᵀ from K): b[0], b[1] for n-tile n0 and b[2], b[3] for n-tile n0 + 8.
template <int kStride>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const uint16_t* tile, int n0, int k0, int lane) {
  ldsm_x4(b, tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * kStride + k0 + ((lane >> 3) & 1) * 8);
}
// The same when the tile is stored (k, n) row-major (V in P V): transposing ldmatrix.
template <int kStride>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const uint16_t* tile, int k0, int n0, int lane) {
  ldsm_x4_t(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + n0 + (lane >> 4) * 8);
}

// The first element of head h of batch b of an operand.
template <class P>
__device__ __forceinline__ P* head_ptr(P* base, const OperandStrides& st, int b, int h) {
  return base + static_cast<int64_t>(b) * st.b + static_cast<int64_t>(h) * st.h;
}

// 2^x on the MUFU unit, denormal results flushed to 0 (exp2f without -ftz adds a range fix-up around it);
// ex2(-inf) = 0.
__device__ __forceinline__ float fast_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The CTA of a backward kernel (lean and split): x = b * Hkv + kv head, the key block in y (and z, y + 65535 z
// past 65535 key blocks), so that every head's first (causal: heaviest) key blocks are launched first. k0 may
// be past the last key (grids split over z): the kernel then returns before any barrier.
struct BwdKeyBlock {
  int b, hkv, group, k0;
};
template <int kBc>
__device__ __forceinline__ BwdKeyBlock bwd_key_block(const FlashParams& p) {
  const int bkv = static_cast<int>(blockIdx.x);
  return {bkv / p.Hkv, bkv % p.Hkv, p.Hq / p.Hkv, static_cast<int>(blockIdx.z * gridDim.y + blockIdx.y) * kBc};
}
// The query blocks that see a key of the block at k0 (t >= k0 - shift, shift = S - T, under the causal mask): blocks
// i_start .. i_start + n_qb - 1 of every query head of the group, total = group · n_qb iterations.
struct BwdQueryBlocks {
  int i_start, n_qb, total;
};
template <int kBq>
__device__ __forceinline__ BwdQueryBlocks bwd_query_blocks(const FlashParams& p, int k0, int shift, int group) {
  const int q_first = p.causal ? max(0, k0 - shift) : 0;
  const int i_start = q_first / kBq;
  const int n_qb = q_first < p.T ? (p.T + kBq - 1) / kBq - i_start : 0;
  return {i_start, n_qb, group * n_qb};
}

// Calls f(E{}, std::integral_constant<int, D>{}) for the element type and head dim.
template <class F>
void dispatch(DType dt, int64_t d, const char* kernel, F&& f) {
  const bool bf = dt == DType::bf16;
  if (!bf && dt != DType::f16) HT_UNSUPPORTED_DTYPE(kernel, dt);
  if (d == 64) {
    if (bf) f(Bf16{}, std::integral_constant<int, 64>{});
    else f(F16{}, std::integral_constant<int, 64>{});
  } else {
    if (bf) f(Bf16{}, std::integral_constant<int, 128>{});
    else f(F16{}, std::integral_constant<int, 128>{});
  }
}

}  // namespace ht::kernels::fa
