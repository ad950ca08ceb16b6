// Fused attention for bf16 / f16, head dim 64 or 128 (see flash_attention.h), FlashAttention-2 structure:
//
// Forward: one CTA of 4 warps per (b, query head, 128-query block), each warp owning 32 query rows (two
// m-tiles, so every K/V fragment loaded from shared memory feeds two mma). K/V tiles of 128 keys (64 for
// D = 128) stream through shared memory (cp.async, two stages, one barrier per tile); S = Q Kᵀ and O += P V
// run on mma.sync m16n8k16 (fp32 accumulate) with ldmatrix fragment loads; the softmax is online in fp32
// registers in the exp2 domain; only the tiles crossing S or the causal diagonal run mask code, per warp.
// Causal grids take the heaviest query blocks of all heads first (Note [Forward kernel]).
//
// Backward: a preprocess kernel dsum[t] = rowsum(dO ∘ O)[t] (which also zeroes dq_acc); then one CTA of
// 8 warps per (b, kv head, 128-key block), each warp owning 16 keys. It loops over the query heads of its kv
// group and over the query blocks that see its keys, recomputes Sᵀ = K Qᵀ and Pᵀ = exp(Sᵀ - lse), dPᵀ = V dOᵀ
// and dSᵀ = Pᵀ ∘ (dPᵀ - dsum), and accumulates dV += Pᵀ dO and dK += dSᵀ Q in registers; dQ += dS K is
// computed from dSᵀ staged in shared memory and added into an fp32 buffer with atomics (so dq is not
// bitwise deterministic; dk and dv are). A last kernel scales dQ and converts it to the input dtype.
// The query rows per iteration depend on the head dim (Note [Backward variants], Note [Lean backward]).
// At D 128 the split-tile kernel runs instead (Note [Split backward]: 128 keys x 64 queries per iteration, a
// different warp tiling for each product group, Pᵀ and dSᵀ through shared memory); HADATRAIN_FLASH_BWD=0|1
// forces one kernel for every head dim (Note [Backward variants]).
//
// Operands are strided (B, H, T, D) views (FlashParams' strides; D contiguous, rows 16-byte aligned), so q,
// k, v can be slices of one packed qkv projection and dq, dk, dv slots of one packed gradient; lse, dsum and
// dq_acc are contiguous workspaces. The backward's first kernel computes dsum and zeroes dq_acc; the last
// scales dq_acc into the strided dq.
//
// Shared-memory rows are padded by 8 elements (16 bytes) so that the 8 row addresses of an ldmatrix hit
// distinct banks. Rows past T or S are zero-filled by cp.async and masked out of the softmax.
//
// Note [Ragged tiles]
// 16-row slices past T or S (zero in shared memory, P = dS = 0 there) skip their products, and warps whose
// rows all lie past the end skip their work: the results are those of computing them (the products would
// add exact zeros or be masked to -inf). This matters for short odd lengths (a ViT's N = 65 or 197), where
// much of a 64- or 128-row block is padding. Every such condition is warp-uniform. The backward's per-element
// mask is evaluated only in blocks that cross S or the causal diagonal.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit A/B): lane = 4 g + tq.
//   A (16x16, row-major): a0 (g, 2tq..+1), a1 (g+8, 2tq..), a2 (g, 2tq+8..), a3 (g+8, 2tq+8..)
//   B (16x8, k x n):      b0 (k 2tq..+1, n g), b1 (k 2tq+8..+1, n g)
//   C (16x8, fp32):       c0 c1 (g, 2tq..+1), c2 c3 (g+8, 2tq..+1)
// ldmatrix.x4 loads four 8x8 matrices whose row addresses come from lanes 8i..8i+7; lane holds row g,
// columns 2tq..+1 of each (with .trans: column g, rows 2tq..+1). A C tile pair (n-tiles 2j, 2j+1) in
// bf16 is exactly the A fragment of k-step j, which is how P feeds P V without shared memory.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/flash_attention.h"
#include "kernels/variant.h"
#include "kernels/launch.h"

namespace ht::kernels {
namespace {

std::atomic<int64_t> g_forward_calls{0}, g_backward_calls{0};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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

// The first element of head h of batch b of an operand.
template <class P>
__device__ __forceinline__ P* head_ptr(P* base, const OperandStrides& st, int b, int h) {
  return base + static_cast<int64_t>(b) * st.b + static_cast<int64_t>(h) * st.h;
}

// ---- forward (Note [Forward kernel]) ----

// 2^x on the MUFU unit, denormal results flushed to 0 (exp2f without -ftz adds a range fix-up around it);
// ex2(-inf) = 0.
__device__ __forceinline__ float fast_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A forward configuration: Warps warps of M 16-row m-tiles each (query rows per CTA = 16 M Warps), key
// tiles of Bc keys, __launch_bounds__ asking for MinBlocks CTAs per SM. Shared memory: the Q tile and two
// stages of K and V tiles.
template <int D, int Warps, int M, int Bc, int MinBlocks>
struct FwdTiles {
  static constexpr int kD = D, kThreads = 32 * Warps, kM = M, kWarpRows = 16 * M;
  static constexpr int kBr = kWarpRows * Warps, kBc = Bc, kStride = D + 8, kMinBlocks = MinBlocks;
  static constexpr std::size_t kSmemBytes = std::size_t{kBr + 4 * kBc} * kStride * sizeof(uint16_t);
};

// A warp's accumulators: O of its rows, and per row (g, g + 8 of each m-tile) the running max of the raw
// scores q·k (-inf: no visible key yet) and this thread's part of the running sum of exp2(sl (s - max)).
template <class C>
struct FwdAcc {
  float o[C::kM][C::kD / 8][4];
  float m[C::kM][2];
  float l[C::kM][2];
};

// One key tile for one warp: S = Q Kᵀ, (kMask: keys past S and past the causal diagonal to -inf), the online
// softmax update, O += P V. row0: the warp's first query row; key0: the tile's first key; key_lim: no row
// of the warp sees a key >= key_lim (kMask: 16-key slices from there on skip their products, as P = 0 for
// them); sl = |scale| log2 e (q was negated in shared memory when the scale is negative).
template <class E, class C, bool kMask>
__device__ __forceinline__ void fwd_tile(FwdAcc<C>& acc, const uint16_t* q_s, const uint16_t* k_s,
                                         const uint16_t* v_s, int warp_row0, int row0, int key0, int key_lim,
                                         float sl, const FlashParams& p, int shift, int lane) {
  constexpr int D = C::kD, kM = C::kM, kBc = C::kBc, kStride = C::kStride;
  const int g = lane >> 2, tq = lane & 3;
  float sc[kM][kBc / 8][4];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n) sc[mi][n][0] = sc[mi][n][1] = sc[mi][n][2] = sc[mi][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) load_a<kStride>(a[mi], q_s, warp_row0 + 16 * mi, kk * 16, lane);
#pragma unroll
    for (int nn = 0; nn < kBc / 16; ++nn) {
      if constexpr (kMask) {
        if (key0 + nn * 16 >= key_lim) continue;  // keys past S or the warp's diagonal: masked below
      }
      uint32_t bf[4];
      load_b_nk<kStride>(bf, k_s, nn * 16, kk * 16, lane);
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
        E::mma(sc[mi][2 * nn], a[mi], bf[0], bf[1]);
        E::mma(sc[mi][2 * nn + 1], a[mi], bf[2], bf[3]);
      }
    }
  }
  if constexpr (kMask) {
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = key0 + n * 8 + 2 * tq + (c & 1);
          const int row = row0 + 16 * mi + g + (c >> 1) * 8;
          if (key >= p.S || (p.causal && key > row + shift)) sc[mi][n][c] = -INFINITY;
        }
  }

  // online softmax per row (mi, r) (elements c = 2r, 2r + 1); p = exp2(sl s - sl max) in one FFMA, packed to
  // the input dtype at once (pk[mi][n][r] is the A-fragment word of P V: the fp32 scores die here)
  uint32_t pk[kM][kBc / 8][2];
  float alpha[kM][2];
  bool changed = false;
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_old = acc.m[mi][r];
      // long rows (kBc 128) in two chains: half the dependent latency (for kBc 64 the extra registers spill)
      constexpr bool kTwo = kBc >= 128;
      float mx0 = m_old, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) {
        if constexpr (kTwo) {
          mx0 = fmaxf(mx0, sc[mi][n][2 * r]);
          mx1 = fmaxf(mx1, sc[mi][n][2 * r + 1]);
        } else {
          mx0 = fmaxf(mx0, fmaxf(sc[mi][n][2 * r], sc[mi][n][2 * r + 1]));
        }
      }
      float mx = kTwo ? fmaxf(mx0, mx1) : mx0;
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_scaled = mx == -INFINITY ? 0.f : mx * sl;  // a row that has seen no key yet
      // unchanged max: exactly 1 (nothing to rescale); from -inf: 0 (o and l are still 0)
      alpha[mi][r] = mx == m_old ? 1.f : fast_ex2(m_old * sl - m_scaled);
      changed |= mx != m_old;
      acc.m[mi][r] = mx;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) {
        const float p0 = fast_ex2(fmaf(sc[mi][n][2 * r], sl, -m_scaled));
        const float p1 = fast_ex2(fmaf(sc[mi][n][2 * r + 1], sl, -m_scaled));
        if constexpr (kTwo) {
          sum0 += p0;
          sum1 += p1;
        } else {
          sum0 += p0 + p1;
        }
        pk[mi][n][r] = E::pack(p0, p1);
      }
      acc.l[mi][r] = acc.l[mi][r] * alpha[mi][r] + (kTwo ? sum0 + sum1 : sum0);
    }
  // rescale O only when some row of the warp has a new max (warp-uniform branch)
  if (__any_sync(0xffffffffu, changed)) {
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc.o[mi][i][c] *= alpha[mi][c >> 1];
  }

  // O += P V (P from registers, rounded to the input dtype)
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    if constexpr (kMask) {
      if (key0 + kk * 16 >= key_lim) continue;  // P = 0 there (Note [Ragged tiles])
    }
    uint32_t a[kM][4];
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
      a[mi][0] = pk[mi][2 * kk][0];
      a[mi][1] = pk[mi][2 * kk][1];
      a[mi][2] = pk[mi][2 * kk + 1][0];
      a[mi][3] = pk[mi][2 * kk + 1][1];
    }
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t bf[4];
      load_b_kn<kStride>(bf, v_s, kk * 16, dn * 16, lane);
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
        E::mma(acc.o[mi][2 * dn], a[mi], bf[0], bf[1]);
        E::mma(acc.o[mi][2 * dn + 1], a[mi], bf[2], bf[3]);
      }
    }
  }
}

// out (B, Hq, T, D), lse (B, Hq, T); grid (B * Hq, query blocks): causal launches take the query blocks with
// the most key tiles first across all heads (blockIdx.y 0 is the last query block).
template <class E, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    flash_forward_kernel(uint16_t* __restrict__ out, float* __restrict__ lse, const uint16_t* __restrict__ q,
                           const uint16_t* __restrict__ k, const uint16_t* __restrict__ v, FlashParams p) {
  constexpr int D = C::kD, kStride = C::kStride, kBr = C::kBr, kBc = C::kBc, kM = C::kM;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* q_s = smem;                   // (kBr, D)
  uint16_t* kv_s = smem + kBr * kStride;  // stage i: K at 2 i kBc rows, V after it
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, tq = lane & 3;

  const int bh = static_cast<int>(blockIdx.x);
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  const int qb = p.causal ? static_cast<int>(gridDim.y - 1 - blockIdx.y) : static_cast<int>(blockIdx.y);
  const int q0 = qb * kBr;
  const uint16_t* qh = head_ptr(q, p.q, b, h);
  const uint16_t* kh = head_ptr(k, p.k, b, hk);
  const uint16_t* vh = head_ptr(v, p.v, b, hk);
  const int shift = p.S - p.T;                        // causal: row t sees keys <= t + shift

  int key_end = p.S;
  if (p.causal) key_end = min(p.S, q0 + kBr + shift);
  const int n_tiles = key_end > 0 ? (key_end + kBc - 1) / kBc : 0;

  // A negative scale: q is negated in shared memory (exact) and the softmax runs with |scale|, so that the
  // running max of the raw scores is the max of the scaled ones.
  const bool negate = p.scale < 0.f;
  const float sl = fabsf(p.scale_log2);
  if (n_tiles > 0) {
    load_tile<kBr, D, kStride, C::kThreads>(q_s, qh, p.q.t, q0, p.T);
    load_tile<kBc, D, kStride, C::kThreads>(kv_s, kh, p.k.t, 0, p.S);
    load_tile<kBc, D, kStride, C::kThreads>(kv_s + kBc * kStride, vh, p.v.t, 0, p.S);
    cp_async_commit();
    if (negate) {
      cp_async_wait<0>();
      __syncthreads();
      constexpr int kChunks = D / 8;
      for (int i = tid; i < kBr * kChunks; i += C::kThreads) {
        uint4* x = reinterpret_cast<uint4*>(q_s + (i / kChunks) * kStride + (i % kChunks) * 8);
        uint4 y = *x;
        y.x ^= 0x80008000u;
        y.y ^= 0x80008000u;
        y.z ^= 0x80008000u;
        y.w ^= 0x80008000u;
        *x = y;
      }
      // made visible by the first barrier of the loop
    }
  }

  const int warp_row0 = warp * C::kWarpRows;  // within the CTA
  const int row0 = q0 + warp_row0;             // the warp's first query row
  // No row of this warp sees a key >= key_lim; every row sees all keys < full_end (causal: up to the
  // diagonal of its first row). Tiles below full_end run without mask code; tiles from key_lim on are
  // skipped by the warp (their P would be 0); the tiles between are masked per element.
  const int key_lim = p.causal ? min(p.S, row0 + C::kWarpRows + shift) : p.S;
  const int full_end = p.causal ? min(p.S, row0 + shift + 1) : p.S;
  FwdAcc<C> acc;
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc.o[mi][i][0] = acc.o[mi][i][1] = acc.o[mi][i][2] = acc.o[mi][i][3] = 0.f;
    acc.m[mi][0] = acc.m[mi][1] = -INFINITY;
    acc.l[mi][0] = acc.l[mi][1] = 0.f;
  }

  // One barrier per tile: after it, tile j is visible to every thread and every warp is done with tile j - 1,
  // whose stage then receives tile j + 1 while tile j is computed.
  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < n_tiles) {
      uint16_t* next = kv_s + ((j + 1) & 1) * 2 * kBc * kStride;
      load_tile<kBc, D, kStride, C::kThreads>(next, kh, p.k.t, (j + 1) * kBc, p.S);
      load_tile<kBc, D, kStride, C::kThreads>(next + kBc * kStride, vh, p.v.t, (j + 1) * kBc, p.S);
      cp_async_commit();
    }
    const uint16_t* k_s = kv_s + (j & 1) * 2 * kBc * kStride;
    const uint16_t* v_s = k_s + kBc * kStride;
    // Warps whose rows all lie past T have nothing to compute (they still share the loads and barriers).
    const int key0 = j * kBc;
    if (row0 < p.T) {
      if (key0 + kBc <= full_end)
        fwd_tile<E, C, false>(acc, q_s, k_s, v_s, warp_row0, row0, key0, key_lim, sl, p, shift, lane);
      else if (key0 < key_lim)
        fwd_tile<E, C, true>(acc, q_s, k_s, v_s, warp_row0, row0, key0, key_lim, sl, p, shift, lane);
    }
  }

  // normalise, stage this warp's rows in its own rows of q_s (only this warp reads them), store 16-byte chunks
  // (the output pointers are formed here, not kept in registers through the loop)
  uint16_t* oh = head_ptr(out, p.o, b, h);
  float* lh = lse + static_cast<int64_t>(bh) * p.T;  // lse is contiguous (B, Hq, T)
  uint16_t* o_s = q_s + warp_row0 * kStride;
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = acc.l[mi][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;  // rows that see no key: output 0
      const int rl = 16 * mi + g + 8 * r;         // row within the warp's rows
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
        *reinterpret_cast<uint32_t*>(o_s + rl * kStride + i * 8 + 2 * tq) =
            E::pack(acc.o[mi][i][2 * r] * inv, acc.o[mi][i][2 * r + 1] * inv);
      const int row = row0 + rl;
      if (tq == 0 && row < p.T) lh[row] = l > 0.f ? (acc.m[mi][r] * sl + log2f(l)) * kLn2 : -INFINITY;
    }
  __syncwarp();
  constexpr int kChunks = D / 8;
  for (int i = lane; i < C::kWarpRows * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    const int row = row0 + r;
    if (row < p.T)
      *reinterpret_cast<uint4*>(oh + static_cast<int64_t>(row) * p.o.t + c * 8) =
          *reinterpret_cast<const uint4*>(o_s + r * kStride + c * 8);
  }
}

// ---- backward ----

// The 8 16-bit values of a 16-byte chunk as floats.
template <class E>
__device__ __forceinline__ void unpack8(float (&f)[8], const uint4& x) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = E::to_float(static_cast<uint16_t>(w[i] & 0xffffu));
    f[2 * i + 1] = E::to_float(static_cast<uint16_t>(w[i] >> 16));
  }
}

// Flat query row (b, h, t) of the contiguous (B, Hq, T) workspaces -> (b, h, t).
__device__ __forceinline__ void split_row(int64_t row, int T, int Hq, int& b, int& h, int& t) {
  t = static_cast<int>(row % T);
  const int64_t bh = row / T;
  b = static_cast<int>(bh / Hq);
  h = static_cast<int>(bh % Hq);
}

// Backward preprocessing: dsum[row] = sum_e dout[row, e] * out[row, e] (fp32) and dq_acc[row, :] = 0.
// D / 8 consecutive threads own a row, one 16-byte chunk each; the block size is a multiple of 32.
template <class E, int D>
__global__ void flash_bwd_prep_kernel(float* __restrict__ dsum, float* __restrict__ dq_acc,
                                      const uint16_t* __restrict__ out, const uint16_t* __restrict__ dout,
                                      FlashParams p, int64_t rows) {
  constexpr int kTpr = D / 8;  // threads per row (8 or 16: a power of two dividing 32)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = i / kTpr;
  const int c = static_cast<int>(i % kTpr);
  float acc = 0.f;  // rows past the end take part in the shuffles with 0
  if (row < rows) {
    int b, h, t;
    split_row(row, p.T, p.Hq, b, h, t);
    float o[8], d[8];
    unpack8<E>(o, *reinterpret_cast<const uint4*>(head_ptr(out, p.o, b, h) + static_cast<int64_t>(t) * p.o.t + c * 8));
    unpack8<E>(d, *reinterpret_cast<const uint4*>(head_ptr(dout, p.dout, b, h) + static_cast<int64_t>(t) * p.dout.t +
                                                  c * 8));
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += o[e] * d[e];
    float4* z = reinterpret_cast<float4*>(dq_acc + row * D + c * 8);
    z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int off = kTpr / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < rows && c == 0) dsum[row] = acc;
}

// One query block for one warp of the backward (Note [Lean backward]): Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for the
// warp's 16 keys (from kw) x kBq queries (from q0), Pᵀ = exp2(s sl - lse log2 e) in one FFMA and ex2.approx,
// dSᵀ = Pᵀ (dPᵀ - dsum) into the warp's rows of ds_cur, dV += Pᵀ dO and dK += dSᵀ Q. rs: the block's lse
// (rs[0, kBq)) and dsum (rs[kBq, 2 kBq)). kMask: the per-element mask (keys past S, rows past T, keys after a
// row's diagonal), and the 16-query slices outside [nn_lo, nn_hi) skip their products (none of their rows
// sees a key of the warp, or they lie past T); without kMask every row of the block sees every key of the warp.
template <class E, class C, bool kMask>
__device__ __forceinline__ void bwd_lean_block(float (&dk_acc)[C::kD / 8][4], float (&dv_acc)[C::kD / 8][4],
                                               const uint16_t* k_s, const uint16_t* v_s, const uint16_t* q_s,
                                               const uint16_t* do_s, const float* rs, uint16_t* ds_cur, int warp,
                                               int kw, int q0, int nn_lo, int nn_hi, const FlashParams& p,
                                               int shift, int lane) {
  constexpr int D = C::kD, kBq = C::kBq, kStride = C::kStride, kSStride = C::kSStride;
  const int g = lane >> 2, tq = lane & 3;
  float st[kBq / 8][4], dpt[kBq / 8][4];
#pragma unroll
  for (int n = 0; n < kBq / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) st[n][c] = dpt[n][c] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t ak[4], av[4];
    load_a<kStride>(ak, k_s, warp * 16, kk * 16, lane);
    load_a<kStride>(av, v_s, warp * 16, kk * 16, lane);
#pragma unroll
    for (int nn = 0; nn < kBq / 16; ++nn) {
      if constexpr (kMask) {
        if (nn < nn_lo || nn >= nn_hi) continue;  // P = 0 there: masked below
      }
      uint32_t bq[4], bd[4];
      load_b_nk<kStride>(bq, q_s, nn * 16, kk * 16, lane);
      load_b_nk<kStride>(bd, do_s, nn * 16, kk * 16, lane);
      E::mma(st[2 * nn], ak, bq[0], bq[1]);
      E::mma(st[2 * nn + 1], ak, bq[2], bq[3]);
      E::mma(dpt[2 * nn], av, bd[0], bd[1]);
      E::mma(dpt[2 * nn + 1], av, bd[2], bd[3]);
    }
  }

  // Pᵀ and dSᵀ; element (n, c) is key kw + g + 8 (c >> 1), query q0 + 8 n + 2 tq + (c & 1)
#pragma unroll
  for (int n = 0; n < kBq / 8; ++n)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int rl = n * 8 + 2 * tq + cc;  // query row within the block
      const float l = rs[rl], ds = rs[kBq + rl];
      const float nl2 = l == -INFINITY ? -INFINITY : -l * kLog2e;  // rows that see no key pass no gradient
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int c = 2 * r + cc;
        float x = fmaf(st[n][c], p.scale_log2, nl2);
        if constexpr (kMask) {
          const int key = kw + g + 8 * r, row = q0 + rl;
          if (key >= p.S || row >= p.T || (p.causal && key > row + shift)) x = -INFINITY;
        }
        const float pr = fast_ex2(x);
        st[n][c] = pr;
        dpt[n][c] = pr * (dpt[n][c] - ds);
      }
    }

#pragma unroll
  for (int kk = 0; kk < kBq / 16; ++kk) {
    const uint32_t ap[4] = {E::pack(st[2 * kk][0], st[2 * kk][1]), E::pack(st[2 * kk][2], st[2 * kk][3]),
                            E::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                            E::pack(st[2 * kk + 1][2], st[2 * kk + 1][3])};
    const uint32_t as[4] = {E::pack(dpt[2 * kk][0], dpt[2 * kk][1]), E::pack(dpt[2 * kk][2], dpt[2 * kk][3]),
                            E::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                            E::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
    // dSᵀ to shared memory for dQ (zeros included): rows = keys (g, g + 8 of this warp), columns = queries
    uint16_t* ds_w = ds_cur + (warp * 16 + g) * kSStride + kk * 16 + 2 * tq;
    *reinterpret_cast<uint32_t*>(ds_w) = as[0];
    *reinterpret_cast<uint32_t*>(ds_w + 8 * kSStride) = as[1];
    *reinterpret_cast<uint32_t*>(ds_w + 8) = as[2];
    *reinterpret_cast<uint32_t*>(ds_w + 8 * kSStride + 8) = as[3];
    if constexpr (kMask) {
      if (kk < nn_lo || kk >= nn_hi) continue;  // P = dS = 0
    }
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t bd[4], bq[4];
      load_b_kn<kStride>(bd, do_s, kk * 16, dn * 16, lane);
      load_b_kn<kStride>(bq, q_s, kk * 16, dn * 16, lane);
      E::mma(dv_acc[2 * dn], ap, bd[0], bd[1]);
      E::mma(dv_acc[2 * dn + 1], ap, bd[2], bd[3]);
      E::mma(dk_acc[2 * dn], as, bq[0], bq[1]);
      E::mma(dk_acc[2 * dn + 1], as, bq[2], bq[3]);
    }
  }
}

// dQ (kBq x D) += dS K for the query block at q0 (q_rows valid rows) of flat head bh, from dSᵀ (ds_cur) and the
// key block's K (k_s): warp w adds its 16 rows x kDqCols columns into dq_acc with fp32 atomics. Key slices
// whose dS is 0 for every row of the warp's 16 (past S; causal: after the diagonal of its last row) are
// skipped.
template <class E, class C>
__device__ __forceinline__ void bwd_dq(float* __restrict__ dq_acc, const uint16_t* ds_cur, const uint16_t* k_s,
                                       int bh, int q0, int q_rows, int k0, int warp, const FlashParams& p,
                                       int shift, int lane) {
  constexpr int D = C::kD, kBc = C::kBc, kStride = C::kStride, kSStride = C::kSStride;
  const int g = lane >> 2, tq = lane & 3;
  const int wm = warp % C::kWm, wn = warp / C::kWm;
  if (wm * 16 >= q_rows) return;  // rows past T: nothing to add
  // keys < key_end have a nonzero dS for some row of the warp's 16
  const int key_end = p.causal ? min(p.S, q0 + wm * 16 + 16 + shift) : p.S;
  float dq[C::kDqCols / 8][4];
#pragma unroll
  for (int i = 0; i < C::kDqCols / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    if (k0 + kk * 16 >= key_end) continue;  // dS = 0 (Note [Ragged tiles])
    // A = dS (query rows wm*16.., key columns kk*16..) from dSᵀ stored (key, query): transposing loads
    uint32_t a[4];
    const int mi = lane >> 3;
    ldsm_x4_t(a, ds_cur + (kk * 16 + (lane & 7) + (mi >> 1) * 8) * kSStride + wm * 16 + (mi & 1) * 8);
#pragma unroll
    for (int dn = 0; dn < C::kDqCols / 16; ++dn) {
      uint32_t bk[4];
      load_b_kn<kStride>(bk, k_s, kk * 16, wn * C::kDqCols + dn * 16, lane);
      E::mma(dq[2 * dn], a, bk[0], bk[1]);
      E::mma(dq[2 * dn + 1], a, bk[2], bk[3]);
    }
  }
  float* dq_h = dq_acc + static_cast<int64_t>(bh) * p.T * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + wm * 16 + g + 8 * r;
    if (row < p.T) {
      float* dst = dq_h + static_cast<int64_t>(row) * D + wn * C::kDqCols + 2 * tq;
#pragma unroll
      for (int i = 0; i < C::kDqCols / 8; ++i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(dst + i * 8), make_float2(dq[i][2 * r], dq[i][2 * r + 1]));
#else
        atomicAdd(dst + i * 8, dq[i][2 * r]);
        atomicAdd(dst + i * 8 + 1, dq[i][2 * r + 1]);
#endif
      }
    }
  }
}

// A backward configuration: W warps per CTA, each owning 16 keys; Bq query rows per iteration;
// __launch_bounds__ asking for MinBlocks CTAs per SM (Note [Backward variants]).
template <int D, int W, int Bq, int MinBlocks>
struct BwdCfg {
  static constexpr int kD = D, kWarps = W, kThreads = 32 * kWarps, kMinBlocks = MinBlocks;
  static constexpr int kBc = 16 * kWarps;  // keys per CTA
  static constexpr int kBq = Bq;           // query rows per iteration
  static constexpr int kStride = D + 8;
  static constexpr int kSStride = kBq + 8;  // dSᵀ tile (kBc, kBq)
  // dQ tile (kBq, D) over the warps: kWm row blocks of 16 x kWn column groups
  static constexpr int kWm = kBq / 16, kWn = kWarps / kWm, kDqCols = D / kWn;
  // K, V; two stages of Q and dO; two dSᵀ buffers (even / odd iterations); then two stages of lse and dsum
  static constexpr int kSmemElems = (2 * kBc + 4 * kBq) * kStride + 2 * kBc * kSStride;
  static constexpr std::size_t kSmemBytes = kSmemElems * sizeof(uint16_t) + 4 * kBq * sizeof(float);
  static_assert(kWm * kWn == kWarps && kDqCols % 16 == 0);
};

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

// dk, dv (B, Hkv, S, D) in the input dtype (unscaled sums written once); dq_acc (B, Hq, T, D) fp32 gets
// atomic adds of dS K (without the scale). grid (B * Hkv, key blocks) when there are at most 65535 key blocks,
// else (B * Hkv, 65535, z) with key block y + 65535 z (the CTAs past the last one return at once); the
// iteration body is bwd_lean_block with one barrier per iteration (Note [Lean backward]).
template <class E, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    flash_backward_kernel(uint16_t* __restrict__ dk, uint16_t* __restrict__ dv, float* __restrict__ dq_acc,
                          const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                          const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                          const float* __restrict__ lse, const float* __restrict__ dsum, FlashParams p) {
  constexpr int D = C::kD;
  constexpr int kStride = C::kStride, kBc = C::kBc, kBq = C::kBq, kSStride = C::kSStride;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* k_s = smem;                          // (kBc, D)
  uint16_t* v_s = k_s + kBc * kStride;           // (kBc, D)
  uint16_t* qd_s = v_s + kBc * kStride;          // stage i: Q at 2 i kBq rows, dO after it
  uint16_t* ds_s = qd_s + 4 * kBq * kStride;     // two dSᵀ (kBc, kBq), for even and odd iterations
  // stage i's lse at rs_s[2 i kBq], its dsum after it
  float* rs_s = reinterpret_cast<float*>(ds_s + 2 * kBc * kSStride);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, tq = lane & 3;

  const BwdKeyBlock kb = bwd_key_block<kBc>(p);
  if (kb.k0 >= p.S) return;  // past the last key block (grids split over z): the whole CTA, before any barrier
  const int b = kb.b, hkv = kb.hkv, group = kb.group, k0 = kb.k0, shift = p.S - p.T;
  const uint16_t* kh = head_ptr(k, p.k, b, hkv);
  const uint16_t* vh = head_ptr(v, p.v, b, hkv);
  const BwdQueryBlocks qb = bwd_query_blocks<kBq>(p, k0, shift, group);
  const int i_start = qb.i_start, n_qb = qb.n_qb, total = qb.total;
  auto qhead_of = [&](int it) { return hkv * group + it / n_qb; };  // query head
  auto head_of = [&](int it) { return b * p.Hq + qhead_of(it); };    // flat (b, query head) of the workspaces
  auto q0_of = [&](int it) { return (i_start + it % n_qb) * kBq; };
  auto load_q_do = [&](int it) {
    const int h = qhead_of(it), q0 = q0_of(it);
    uint16_t* dst = qd_s + (it & 1) * 2 * kBq * kStride;
    load_tile<kBq, D, kStride, C::kThreads>(dst, head_ptr(q, p.q, b, h), p.q.t, q0, p.T);
    load_tile<kBq, D, kStride, C::kThreads>(dst + kBq * kStride, head_ptr(dout, p.dout, b, h), p.dout.t, q0, p.T);
    {  // lse and dsum of the block's rows, in the same group as its tiles
      float* rs = rs_s + (it & 1) * 2 * kBq;
      const int64_t row0 = static_cast<int64_t>(b * p.Hq + h) * p.T;
      for (int i = tid; i < 2 * kBq; i += C::kThreads) {
        const int r = i % kBq;
        const float* src = (i < kBq ? lse : dsum) + row0;
        const bool valid = q0 + r < p.T;
        cp_async4(rs + i, valid ? src + q0 + r : src, valid);
      }
    }
  };

  float dk_acc[D / 8][4], dv_acc[D / 8][4];  // this warp's 16 keys x D
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) dk_acc[i][c] = dv_acc[i][c] = 0.f;

  if (total > 0) {
    load_tile<kBc, D, kStride, C::kThreads>(k_s, kh, p.k.t, k0, p.S);
    load_tile<kBc, D, kStride, C::kThreads>(v_s, vh, p.v.t, k0, p.S);
    load_q_do(0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (total > 1) {
      load_q_do(1);
      cp_async_commit();
    }
  }

  for (int it = 0; it < total; ++it) {
    // One barrier per iteration: stage it (K, V with it) is visible; the iteration writes the dSᵀ buffer of
    // its parity, then waits for its own copies of stage it + 1 (issued after the previous barrier) and
    // meets the others at the barrier, after which dSᵀ is complete, stage it + 1 is visible and stage it is
    // free for it + 2. A warp can write this dSᵀ buffer again (iteration it + 2) only after passing the
    // barrier of it + 1, i.e. after every warp's dQ of iteration it.
    const int bh = head_of(it), q0 = q0_of(it);
    const uint16_t* q_s = qd_s + (it & 1) * 2 * kBq * kStride;
    const uint16_t* do_s = q_s + kBq * kStride;
    const float* rs = rs_s + (it & 1) * 2 * kBq;
    uint16_t* ds_cur = ds_s + (it & 1) * kBc * kSStride;
    const int kw = k0 + warp * 16;  // the warp's first key
    // the warp's 16-query slices [nn_lo, nn_hi) that see one of its keys (causal: slices whose last row is
    // before the diagonal of the warp's first key see none; slices past T; none when the warp is past S)
    const int nn_hi = kw < p.S ? min(kBq / 16, (p.T - q0 + 15) / 16) : 0;
    const int before = p.causal ? kw - shift - q0 : 0;
    const int nn_lo = before > 0 ? before / 16 : 0;
    // every row of the block sees every key of the warp: no mask code
    const bool full = q0 + kBq <= p.T && kw + 16 <= p.S && (!p.causal || kw + 15 <= q0 + shift);
    if (full)
      bwd_lean_block<E, C, false>(dk_acc, dv_acc, k_s, v_s, q_s, do_s, rs, ds_cur, warp, kw, q0, nn_lo, nn_hi, p,
                                  shift, lane);
    else
      bwd_lean_block<E, C, true>(dk_acc, dv_acc, k_s, v_s, q_s, do_s, rs, ds_cur, warp, kw, q0, nn_lo, nn_hi, p,
                                 shift, lane);
    cp_async_wait<0>();
    __syncthreads();
    if (it + 2 < total) {
      load_q_do(it + 2);
      cp_async_commit();
    }
    const int q_rows = p.T - q0;
    bwd_dq<E, C>(dq_acc, ds_cur, k_s, bh, q0, q_rows, k0, warp, p, shift, lane);
  }
  __syncthreads();  // every warp is done with k_s (dQ) before it is overwritten below

  // dK = scale dSᵀ Q summed, dV = Pᵀ dO summed: stage this warp's rows in its own rows of k_s / v_s
  uint16_t* dk_s = k_s + warp * 16 * kStride;
  uint16_t* dv_s = v_s + warp * 16 * kStride;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int off = (g + 8 * r) * kStride + i * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(dk_s + off) = E::pack(dk_acc[i][2 * r] * p.scale, dk_acc[i][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_s + off) = E::pack(dv_acc[i][2 * r], dv_acc[i][2 * r + 1]);
    }
  __syncwarp();
  uint16_t* dkh = head_ptr(dk, p.dk, b, hkv);
  uint16_t* dvh = head_ptr(dv, p.dv, b, hkv);
  constexpr int kChunks = D / 8;
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    const int key = k0 + warp * 16 + r;
    if (key < p.S) {
      *reinterpret_cast<uint4*>(dkh + static_cast<int64_t>(key) * p.dk.t + c * 8) =
          *reinterpret_cast<const uint4*>(dk_s + r * kStride + c * 8);
      *reinterpret_cast<uint4*>(dvh + static_cast<int64_t>(key) * p.dv.t + c * 8) =
          *reinterpret_cast<const uint4*>(dv_s + r * kStride + c * 8);
    }
  }
}


// ---- backward, split warp tiles (HADATRAIN_FLASH_BWD=1, Note [Split backward]) ----

// A split-tile backward configuration: 8 warps, 128 keys per CTA, Bq query rows per iteration, and a
// different warp tiling for each of the three product groups (Note [Split backward]):
//   Sᵀ, dPᵀ (kBc x kBq): 4 key groups of 32 x 2 query groups of kBq / 2;
//   dV, dK (kBc x D):      4 key groups of 32 x 2 column groups of D / 2 (Pᵀ and dSᵀ read from shared memory);
//   dQ (kBq x D):          kBq / 32 row groups of 32 x (8 32 / kBq) column groups (bwd_split_dq).
template <int D, int Bq, int MinBlocks>
struct BwdSplitCfg {
  static constexpr int kD = D, kWarps = 8, kThreads = 32 * kWarps, kMinBlocks = MinBlocks;
  static constexpr int kBc = 128, kBq = Bq;
  static constexpr int kStride = D + 8;
  static constexpr int kSStride = kBq + 8;  // Pᵀ and dSᵀ tiles (kBc, kBq)
  static constexpr int kSq = kBq / 2;        // queries per warp in Sᵀ / dPᵀ
  static constexpr int kKvCols = D / 2;      // columns per warp in dK / dV
  static constexpr int kWm = kBq / 32, kWn = kWarps / kWm, kDqCols = D / kWn;  // dQ (bwd_split_dq)
  // K, V; two stages of Q and dO; Pᵀ and dSᵀ; then two stages of lse and dsum
  static constexpr int kSmemElems = (2 * kBc + 4 * kBq) * kStride + 2 * kBc * kSStride;
  static constexpr std::size_t kSmemBytes = kSmemElems * sizeof(uint16_t) + 4 * kBq * sizeof(float);
  static_assert(kWm * kWn == kWarps && kDqCols % 16 == 0 && kSq % 16 == 0 && kKvCols % 16 == 0);
};

// The two 16-bit values of a packed word as floats (lo: the lower address).
template <class E>
__device__ __forceinline__ float unpack_lo(uint32_t w) { return E::to_float(static_cast<uint16_t>(w & 0xffffu)); }
template <class E>
__device__ __forceinline__ float unpack_hi(uint32_t w) { return E::to_float(static_cast<uint16_t>(w >> 16)); }

// Sᵀ = K Qᵀ (a_s = K, b_s = Q) or dPᵀ = V dOᵀ (a_s = V, b_s = dO) for a warp's 32 keys (kl0, 2 m-tiles) x kSq queries (ql0).
template <class E, class C>
__device__ __forceinline__ void bwd_split_kq(float (&acc)[2][C::kSq / 8][4], const uint16_t* a_s, const uint16_t* b_s,
                                             int kl0, int ql0, int lane) {
  constexpr int D = C::kD, kSq = C::kSq, kStride = C::kStride;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int n = 0; n < kSq / 8; ++n) acc[mi][n][0] = acc[mi][n][1] = acc[mi][n][2] = acc[mi][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) load_a<kStride>(a[mi], a_s, kl0 + 16 * mi, kk * 16, lane);
#pragma unroll
    for (int nn = 0; nn < kSq / 16; ++nn) {
      uint32_t bf[4];
      load_b_nk<kStride>(bf, b_s, ql0 + nn * 16, kk * 16, lane);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        E::mma(acc[mi][2 * nn], a[mi], bf[0], bf[1]);
        E::mma(acc[mi][2 * nn + 1], a[mi], bf[2], bf[3]);
      }
    }
  }
}

// The Sᵀ / dPᵀ part of one iteration for one warp: its 32 keys (kl0 within the block, 2 m-tiles) x kSq
// queries (ql0 within the block). Sᵀ first, Pᵀ = exp2(s sl - lse log2 e) packed to the input dtype at once
// (into p_s, and kept packed in registers: the fp32 scores die before dPᵀ is accumulated, which keeps the
// kernel within 255 registers), then dPᵀ and dSᵀ = Pᵀ (dPᵀ - dsum) into ds_s, with the rounded Pᵀ (the one dV
// uses). kMask: the per-element mask (keys past S, rows past T, keys after a row's diagonal) and `live` false
// skips the products (no element of the warp's tile is visible: it writes zeros).
template <class E, class C, bool kMask>
__device__ __forceinline__ void bwd_split_sdp(const uint16_t* k_s, const uint16_t* v_s, const uint16_t* q_s,
                                              const uint16_t* do_s, const float* rs, uint16_t* p_s, uint16_t* ds_s,
                                              int kl0, int ql0, int k0, int q0, bool live, const FlashParams& p,
                                              int shift, int lane) {
  constexpr int kSq = C::kSq, kBq = C::kBq, kSStride = C::kSStride;
  const int g = lane >> 2, tq = lane & 3;
  float acc[2][kSq / 8][4];
  uint32_t pk[2][kSq / 8][2];  // Pᵀ packed: (mi, n, r) holds keys g + 8 r, queries 2 tq, 2 tq + 1
  if (!kMask || live) bwd_split_kq<E, C>(acc, k_s, q_s, kl0, ql0, lane);
  // element (mi, n, c): key kl0 + 16 mi + g + 8 (c >> 1), query ql0 + 8 n + 2 tq + (c & 1) (within the block)
#pragma unroll
  for (int n = 0; n < kSq / 8; ++n) {
    float l2[2];
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const float l = rs[ql0 + n * 8 + 2 * tq + cc];
      l2[cc] = l == -INFINITY ? -INFINITY : -l * kLog2e;  // rows that see no key pass no gradient
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      float pr[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int cc = c & 1;
        float x = kMask && !live ? -INFINITY : fmaf(acc[mi][n][c], p.scale_log2, l2[cc]);
        if constexpr (kMask) {
          const int key = k0 + kl0 + 16 * mi + g + 8 * (c >> 1), row = q0 + ql0 + n * 8 + 2 * tq + cc;
          if (key >= p.S || row >= p.T || (p.causal && key > row + shift)) x = -INFINITY;
        }
        pr[c] = fast_ex2(x);
      }
      pk[mi][n][0] = E::pack(pr[0], pr[1]);
      pk[mi][n][1] = E::pack(pr[2], pr[3]);
      // rows = keys (g, g + 8 of m-tile mi), columns = queries
      const int off = (kl0 + 16 * mi + g) * kSStride + ql0 + n * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(p_s + off) = pk[mi][n][0];
      *reinterpret_cast<uint32_t*>(p_s + off + 8 * kSStride) = pk[mi][n][1];
    }
  }
  if (!kMask || live) bwd_split_kq<E, C>(acc, v_s, do_s, kl0, ql0, lane);
#pragma unroll
  for (int n = 0; n < kSq / 8; ++n) {
    const float ds0 = rs[kBq + ql0 + n * 8 + 2 * tq], ds1 = rs[kBq + ql0 + n * 8 + 2 * tq + 1];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      // P = 0 (masked or !live) gives dS = 0 whatever acc holds
      float dsv[4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float dp0 = kMask && !live ? 0.f : acc[mi][n][2 * r];
        const float dp1 = kMask && !live ? 0.f : acc[mi][n][2 * r + 1];
        dsv[2 * r] = unpack_lo<E>(pk[mi][n][r]) * (dp0 - ds0);
        dsv[2 * r + 1] = unpack_hi<E>(pk[mi][n][r]) * (dp1 - ds1);
      }
      const int off = (kl0 + 16 * mi + g) * kSStride + ql0 + n * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(ds_s + off) = E::pack(dsv[0], dsv[1]);
      *reinterpret_cast<uint32_t*>(ds_s + off + 8 * kSStride) = E::pack(dsv[2], dsv[3]);
    }
  }
}

// dQ (kBq x D) += dS K for the query block at q0 of flat head bh, from dSᵀ (ds_s) and the key block's K (k_s):
// warp w adds 32 rows (2 m-tiles, row group w % kWm) x kDqCols columns (group w / kWm) into dq_acc with fp32
// atomics; key slices whose dS is 0 for all of the warp's rows (past S; causal: after the diagonal of its last
// row) are skipped. (bwd_dq with two m-tiles per warp: each K fragment feeds two mma.)
template <class E, class C>
__device__ __forceinline__ void bwd_split_dq(float* __restrict__ dq_acc, const uint16_t* ds_s, const uint16_t* k_s,
                                             int bh, int q0, int k0, int warp, const FlashParams& p, int shift,
                                             int lane) {
  constexpr int D = C::kD, kBc = C::kBc, kStride = C::kStride, kSStride = C::kSStride, kCols = C::kDqCols;
  const int g = lane >> 2, tq = lane & 3;
  const int wm = warp % C::kWm, wn = warp / C::kWm;
  const int r0 = q0 + wm * 32;  // the warp's first query row
  if (r0 >= p.T) return;        // rows past T: nothing to add
  const int key_end = p.causal ? min(p.S, r0 + 32 + shift) : p.S;
  float dq[2][kCols / 8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) dq[mi][i][0] = dq[mi][i][1] = dq[mi][i][2] = dq[mi][i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    if (k0 + kk * 16 >= key_end) continue;  // dS = 0 (Note [Ragged tiles])
    // A = dS (query rows, key columns kk*16..) from dSᵀ stored (key, query): transposing loads
    uint32_t a[2][4];
    const int m = lane >> 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
      ldsm_x4_t(a[mi], ds_s + (kk * 16 + (lane & 7) + (m >> 1) * 8) * kSStride + wm * 32 + mi * 16 + (m & 1) * 8);
#pragma unroll
    for (int dn = 0; dn < kCols / 16; ++dn) {
      uint32_t bk[4];
      load_b_kn<kStride>(bk, k_s, kk * 16, wn * kCols + dn * 16, lane);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        E::mma(dq[mi][2 * dn], a[mi], bk[0], bk[1]);
        E::mma(dq[mi][2 * dn + 1], a[mi], bk[2], bk[3]);
      }
    }
  }
  float* dq_h = dq_acc + static_cast<int64_t>(bh) * p.T * D;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r0 + 16 * mi + g + 8 * r;
      if (row < p.T) {
        float* dst = dq_h + static_cast<int64_t>(row) * D + wn * kCols + 2 * tq;
#pragma unroll
        for (int i = 0; i < kCols / 8; ++i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(dst + i * 8), make_float2(dq[mi][i][2 * r], dq[mi][i][2 * r + 1]));
#else
          atomicAdd(dst + i * 8, dq[mi][i][2 * r]);
          atomicAdd(dst + i * 8 + 1, dq[mi][i][2 * r + 1]);
#endif
        }
      }
    }
}

// dk, dv (B, Hkv, S, D) and dq_acc as flash_backward_kernel (same grid, same workspaces), with the split warp
// tiles of BwdSplitCfg: per iteration (query head of the group, query block of kBq rows) Sᵀ / dPᵀ -> Pᵀ, dSᵀ in
// shared memory; barrier; dV += Pᵀ dO and dK += dSᵀ Q (each warp 32 keys x D / 2 columns, in registers) and
// dQ += dS K (atomics); barrier (which also publishes the next stage of Q / dO / lse / dsum).
template <class E, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    flash_backward_split_kernel(uint16_t* __restrict__ dk, uint16_t* __restrict__ dv, float* __restrict__ dq_acc,
                                const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                                const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                                const float* __restrict__ lse, const float* __restrict__ dsum, FlashParams p) {
  constexpr int D = C::kD;
  constexpr int kStride = C::kStride, kBc = C::kBc, kBq = C::kBq, kSStride = C::kSStride;
  constexpr int kSq = C::kSq, kKvCols = C::kKvCols;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* k_s = smem;                       // (kBc, D)
  uint16_t* v_s = k_s + kBc * kStride;        // (kBc, D)
  uint16_t* qd_s = v_s + kBc * kStride;       // stage i: Q at 2 i kBq rows, dO after it
  uint16_t* p_s = qd_s + 4 * kBq * kStride;   // Pᵀ (kBc, kBq)
  uint16_t* ds_s = p_s + kBc * kSStride;      // dSᵀ (kBc, kBq)
  float* rs_s = reinterpret_cast<float*>(ds_s + kBc * kSStride);  // stage i's lse at 2 i kBq, its dsum after
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, tq = lane & 3;

  const BwdKeyBlock kb = bwd_key_block<kBc>(p);
  if (kb.k0 >= p.S) return;  // past the last key block (grids split over z): the whole CTA, before any barrier
  const int b = kb.b, hkv = kb.hkv, group = kb.group, k0 = kb.k0, shift = p.S - p.T;
  const uint16_t* kh = head_ptr(k, p.k, b, hkv);
  const uint16_t* vh = head_ptr(v, p.v, b, hkv);
  const BwdQueryBlocks qb = bwd_query_blocks<kBq>(p, k0, shift, group);
  const int i_start = qb.i_start, n_qb = qb.n_qb, total = qb.total;
  auto qhead_of = [&](int it) { return hkv * group + it / n_qb; };
  auto q0_of = [&](int it) { return (i_start + it % n_qb) * kBq; };
  auto load_q_do = [&](int it) {
    const int h = qhead_of(it), q0 = q0_of(it);
    uint16_t* dst = qd_s + (it & 1) * 2 * kBq * kStride;
    load_tile<kBq, D, kStride, C::kThreads>(dst, head_ptr(q, p.q, b, h), p.q.t, q0, p.T);
    load_tile<kBq, D, kStride, C::kThreads>(dst + kBq * kStride, head_ptr(dout, p.dout, b, h), p.dout.t, q0, p.T);
    float* rs = rs_s + (it & 1) * 2 * kBq;
    const int64_t row0 = static_cast<int64_t>(b * p.Hq + h) * p.T;
    for (int i = tid; i < 2 * kBq; i += C::kThreads) {
      const int r = i % kBq;
      const float* src = (i < kBq ? lse : dsum) + row0;
      const bool valid = q0 + r < p.T;
      cp_async4(rs + i, valid ? src + q0 + r : src, valid);
    }
  };

  // Sᵀ / dPᵀ tile of the warp; dK / dV tile of the warp
  const int skl0 = (warp & 3) * 32, sql0 = (warp >> 2) * kSq;
  const int kvl0 = (warp & 3) * 32, kvc0 = (warp >> 2) * kKvCols;
  float dk_acc[2][kKvCols / 8][4], dv_acc[2][kKvCols / 8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int i = 0; i < kKvCols / 8; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) dk_acc[mi][i][c] = dv_acc[mi][i][c] = 0.f;

  if (total > 0) {
    load_tile<kBc, D, kStride, C::kThreads>(k_s, kh, p.k.t, k0, p.S);
    load_tile<kBc, D, kStride, C::kThreads>(v_s, vh, p.v.t, k0, p.S);
    load_q_do(0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (total > 1) {
      load_q_do(1);
      cp_async_commit();
    }
  }

  for (int it = 0; it < total; ++it) {
    // Two barriers per iteration: after the first (below the Sᵀ part) Pᵀ and dSᵀ are complete; after the
    // second (at the end) every warp is done with stage it, Pᵀ and dSᵀ, and stage it + 1 is visible; stage it
    // then receives it + 2.
    const int bh = b * p.Hq + qhead_of(it), q0 = q0_of(it);
    const uint16_t* q_s = qd_s + (it & 1) * 2 * kBq * kStride;
    const uint16_t* do_s = q_s + kBq * kStride;
    const float* rs = rs_s + (it & 1) * 2 * kBq;
    {
      const int kw = k0 + skl0, qw = q0 + sql0;  // the warp's first key and query
      const bool full = qw + kSq <= p.T && kw + 32 <= p.S && (!p.causal || kw + 31 <= qw + shift);
      const bool live = kw < p.S && qw < p.T && (!p.causal || kw <= qw + kSq - 1 + shift);
      if (full)
        bwd_split_sdp<E, C, false>(k_s, v_s, q_s, do_s, rs, p_s, ds_s, skl0, sql0, k0, q0, true, p, shift, lane);
      else
        bwd_split_sdp<E, C, true>(k_s, v_s, q_s, do_s, rs, p_s, ds_s, skl0, sql0, k0, q0, live, p, shift, lane);
    }
    __syncthreads();
    {
      // dV += Pᵀ dO, dK += dSᵀ Q over the 16-query slices that see a key of the warp's 32 (causal: a slice
      // whose last row is before the diagonal of the warp's first key has P = dS = 0; rows past T are zero)
      const int kw = k0 + kvl0;
      const int before = p.causal ? kw - shift - q0 : 0;  // rows of the block before kw's diagonal
      const int kk_lo = before > 0 ? before / 16 : 0;
      const int kk_hi = kw < p.S ? min(kBq / 16, (p.T - q0 + 15) / 16) : 0;
#pragma unroll
      for (int kk = 0; kk < kBq / 16; ++kk) {
        if (kk < kk_lo || kk >= kk_hi) continue;
        uint32_t ap[2][4], as[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          load_a<kSStride>(ap[mi], p_s, kvl0 + 16 * mi, kk * 16, lane);
          load_a<kSStride>(as[mi], ds_s, kvl0 + 16 * mi, kk * 16, lane);
        }
#pragma unroll
        for (int dn = 0; dn < kKvCols / 16; ++dn) {
          uint32_t bd[4], bq[4];
          load_b_kn<kStride>(bd, do_s, kk * 16, kvc0 + dn * 16, lane);
          load_b_kn<kStride>(bq, q_s, kk * 16, kvc0 + dn * 16, lane);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            E::mma(dv_acc[mi][2 * dn], ap[mi], bd[0], bd[1]);
            E::mma(dv_acc[mi][2 * dn + 1], ap[mi], bd[2], bd[3]);
            E::mma(dk_acc[mi][2 * dn], as[mi], bq[0], bq[1]);
            E::mma(dk_acc[mi][2 * dn + 1], as[mi], bq[2], bq[3]);
          }
        }
      }
    }
    bwd_split_dq<E, C>(dq_acc, ds_s, k_s, bh, q0, k0, warp, p, shift, lane);
    cp_async_wait<0>();
    __syncthreads();
    if (it + 2 < total) {
      load_q_do(it + 2);
      cp_async_commit();
    }
  }
  __syncthreads();  // (when total is 0 no barrier ran; k_s is overwritten below)

  // dK = scale dSᵀ Q summed, dV = Pᵀ dO summed: staged in k_s / v_s, then 16-byte rows out
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < kKvCols / 8; ++i) {
        const int off = (kvl0 + 16 * mi + g + 8 * r) * kStride + kvc0 + i * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(k_s + off) =
            E::pack(dk_acc[mi][i][2 * r] * p.scale, dk_acc[mi][i][2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(v_s + off) = E::pack(dv_acc[mi][i][2 * r], dv_acc[mi][i][2 * r + 1]);
      }
  __syncthreads();
  uint16_t* dkh = head_ptr(dk, p.dk, b, hkv);
  uint16_t* dvh = head_ptr(dv, p.dv, b, hkv);
  constexpr int kChunks = D / 8;
  for (int i = tid; i < kBc * kChunks; i += C::kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int key = k0 + r;
    if (key < p.S) {
      *reinterpret_cast<uint4*>(dkh + static_cast<int64_t>(key) * p.dk.t + c * 8) =
          *reinterpret_cast<const uint4*>(k_s + r * kStride + c * 8);
      *reinterpret_cast<uint4*>(dvh + static_cast<int64_t>(key) * p.dv.t + c * 8) =
          *reinterpret_cast<const uint4*>(v_s + r * kStride + c * 8);
    }
  }
}

// dq[b, h, t, :] = scale * dq_acc[row, :] in the input dtype (dq strided, dq_acc contiguous); a thread per
// 16-byte chunk of dq.
template <class E, int D>
__global__ void flash_dq_convert_kernel(uint16_t* __restrict__ dq, const float* __restrict__ acc, FlashParams p,
                                        int64_t rows) {
  constexpr int kTpr = D / 8;
  const int64_t n = rows * kTpr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / kTpr;
    const int c = static_cast<int>(i % kTpr);
    int b, h, t;
    split_row(row, p.T, p.Hq, b, h, t);
    const float4* src = reinterpret_cast<const float4*>(acc + row * D + c * 8);
    const float4 x0 = src[0], x1 = src[1];
    const float sc = p.scale;
    const uint4 y = make_uint4(E::pack(x0.x * sc, x0.y * sc), E::pack(x0.z * sc, x0.w * sc),
                               E::pack(x1.x * sc, x1.y * sc), E::pack(x1.z * sc, x1.w * sc));
    *reinterpret_cast<uint4*>(head_ptr(dq, p.dq, b, h) + static_cast<int64_t>(t) * p.dq.t + c * 8) = y;
  }
}

// ---- host side ----

// Note [Backward variants]
// Run 18 (H200, B 4, H 16, causal bf16, T 1024..4096) picked per-head-dim tiles for the first backward kernel
// (4 warps; D 64: Bq 64, 3 CTAs per SM; D 128: Bq 32) out of six; run 19 measured it against the lean
// kernels of Note [Lean backward] with the same tiles (2), without the register cap / Bq 64 (3), with 8 warps
// (4) (fwd+bwd ms; the backward alone is that minus the forward):
//   T, D       old default  lean, same tiles  lean, Bq 64  lean, 8 warps  torch SDPA
//   1024, 64      0.3017        0.2044           0.2005        0.2044        0.2502
//   2048, 64      0.9436        0.6416           0.6449        0.6369        0.6600
//   4096, 64      3.2561        2.3361           2.3742        2.2563        2.0589
//   1024, 128     0.5416        0.3662           0.4499        0.3795        0.4145
//   2048, 128     1.7672        1.2185           1.5145        1.2485        1.1226
//   4096, 128     6.3411        4.6036           5.5341        4.4880        3.6171
// The lean kernel with 8 warps was best or within 3 % everywhere and best on the longest shapes: it is the
// default ("1") for both head dims, and the old kernel (its code was this kernel's non-lean body) and the
// other two tile sets were removed. The last alternative (attn9's variant 5: 4 warps, fewer query rows, 3
// CTAs per SM) measured slower on every shape in run 20 (fwd+bwd 0.2072 / 0.6585 / 2.3934 ms at D 64 and
// 0.4278 / 1.4168 / 5.1918 at D 128, against 0.2058 / 0.6465 / 2.2545 and 0.3788 / 1.2449 / 4.4964) and was
// removed with the HADATRAIN_FLASH_BWD switch: one backward kernel configuration per head dim remains.
// Wave 6 (helper attn11) brought the switch back for a new kernel: HADATRAIN_FLASH_BWD=0 is this lean kernel,
// =1 the split-tile kernel of Note [Split backward]; read once per process, kernels::set_flash_backward_variant
// overrides it (the GPU tests and the bench run both). Unset, the head dim decides, from run 22 (fwd+bwd ms,
// B=4, H=16, causal bf16, lean / split / PyTorch SDPA in the same call):
//   T, D        lean     split    SDPA
//   1024, 64   0.2018   0.1995   0.2368
//   2048, 64   0.6419   0.6428   0.6439
//   4096, 64   2.2656   2.2950   2.0453
//   1024, 128  0.3781   0.3313   0.4064
//   2048, 128  1.2452   1.0753   1.1108
//   4096, 128  4.4845   3.8510   3.6279
// so the split kernel runs for D 128 (13-16 % faster) and the lean one for D 64 (level within 1.3 %).

// Note [Lean backward]
// flash_backward_kernel is the backward with what made the forward 2x faster (Note [Forward kernel]):
//   - mask code only where needed, per warp (bwd_lean_block<kMask>): a warp whose 16 keys are seen by every row
//     of the query block (below S and T, before the diagonal of the block's first row) runs a body without
//     per-element compares and without the ragged-slice branches between the mma; in the other blocks the
//     warp skips the 16-query slices that see none of its keys (causal: rows before the diagonal of its first
//     key; rows past T), and a warp past S skips all; dQ skips the key slices whose dS is zero for all of a
//     warp's 16 rows (past S, after the diagonal of its last row; bwd_dq);
//   - Pᵀ = exp2(s sl - lse log2 e) in one FFMA per score and ex2.approx.ftz instead of exp2f's range fix-up;
//   - one barrier per iteration: the next-but-one stage's copies are issued after the dSᵀ barrier (which also
//     publishes the next stage); two stages of Q / dO / lse / dsum (cp.async, one iteration ahead) and two dSᵀ
//     buffers (even / odd iterations);
//   - causal grids heaviest first across all heads: grid (B Hkv, key blocks), key block 0 (which every query
//     block sees) of every head first, the diagonal-only last key blocks in the last wave. More than 65535 key
//     blocks (S > 8 M keys with 128 per CTA, > 4 M with 64; flash_attention_supported allows S < 16 M) go
//     over grid.z, the CTAs past the last key block returning at once.
// Tiles (W warps of 16 keys, Bq query rows per iteration, CTAs per SM asked of ptxas) and ptxas sm_90a
// (registers / spill store bytes, bf16 and f16 alike; shared memory per CTA):
//   D 64: 8 w, Bq 64, 1 CTA   236 / 0, 109 KiB   D 128: 8 w, Bq 32, 1  251 / 0, 122.5 KiB
// ("1" in the CTA column: no register cap.) The 8-warp tiles (128 keys per CTA) halve the dQ atomics and the
// Q / dO tile loads per key against 4 warps. dQ stays with fp32 atomics per key block: a separate dQ pass (a
// CTA per query block looping over the key blocks) would recompute Sᵀ and dPᵀ, two of the backward's five
// products (+40 % mma work), to save atomics that are 1/kBc-th of the products' data volume; FlashAttention-2
// and -3 keep the atomics too.
template <int D>
using BwdDefault = std::conditional_t<D == 64, BwdCfg<64, 8, 64, 1>, BwdCfg<D, 8, 32, 1>>;

// Note [Forward kernel]
// flash_forward_kernel is FlashAttention-2's forward with:
//   - no masking code in the tiles that need none: per warp, the tiles below S and below the causal
//     diagonal of the warp's first row run a body without per-element compares and without the
//     ragged-tile branches between the mma (which split the unrolled products into basic blocks); in the
//     masked tiles a warp skips the 16-key slices that none of its rows sees (past S or past the diagonal
//     of its last row), and the tiles wholly past them;
//   - the softmax in the exp2 domain with the scale folded into one FFMA per score (max over raw scores,
//     exp2(s sl - max sl); a negative scale negates q in shared memory once), ex2.approx.ftz instead of
//     exp2f's range fix-up, and P packed to 16 bits as soon as it is computed (the fp32 scores die early);
//   - the O rescale skipped when no row of the warp has a new max (a warp vote per tile);
//   - one barrier per key tile (the next tile's cp.async is issued after the barrier that frees its stage,
//     and overlaps the current tile's products);
//   - causal grids ordered heaviest query block first across all heads (grid (B H, query blocks)), not per
//     head, so that the last wave holds the shortest blocks.
// Tiles: 4 warps of 2 m-tiles (128 query rows per CTA), 128 keys per tile for D 64 and 64 for D 128, for 2 CTAs
// per SM; ptxas sm_90a (bf16 and f16 alike): D 64 255 registers / 0 spill bytes, 90 KiB of shared memory;
// D 128 255 / 112 spill bytes, 102 KiB. Measured on the H200 (run 18) against four other configurations
// (the previous kernel with FlashAttention-1-style masking and two barriers per tile; this code with 64 / 32-key
// tiles; 8 warps of 16 rows; 96 / 48-key tiles without spills): these tiles were fastest or within 4 %
// everywhere (docs/cuda_backend.md), and the others were removed.
template <int D>
using FwdDefault = FwdTiles<D, 4, 2, D == 64 ? 128 : 64, 2>;

// Note [Split backward]
// flash_backward_split_kernel (the D 128 default since run 22; HADATRAIN_FLASH_BWD=1 forces it) attacks what the lean kernel
// spends its time on at D 128: shared-memory traffic. In the lean kernel each warp owns 16 keys and all D
// columns of their dK / dV, so every warp reads all of Q and dO twice per iteration (for Sᵀ / dPᵀ and for dK /
// dV) and reloads its K / V fragments; per 32-query iteration (D 128, 8 warps) that is about 104 ldmatrix.x4
// per warp for 160 mma, ~424 KB of shared-memory reads per CTA, more than the tensor cores need (the reads
// alone take ~3300 cycles per iteration at 128 B / cycle, the mma ~1300-2600). FlashAttention-2's sm80
// backward for D 128 (64 x 128 tiles, 8 warps) moves ~30 % fewer bytes per product and is what PyTorch's SDPA
// runs. The split kernel uses the same structure:
//   - per iteration 128 keys x 64 queries, 8 warps, and a warp tiling per product group: Sᵀ and dPᵀ in 32 x 32
//     warp tiles (4 key groups x 2 query groups: each K / V fragment feeds two query tiles, each Q / dO
//     fragment two key tiles); dK and dV in 32 keys x D / 2 columns per warp (B fragments of Q / dO cover half
//     the columns); dQ in 32 rows x D / 4 columns per warp (bwd_split_dq: each K fragment feeds two m-tiles);
//   - Pᵀ and dSᵀ go through shared memory (the dK / dV warps are not the Sᵀ warps): ~152 ldmatrix.x4 per warp
//     per 64-query iteration (76 per 32 queries against the lean kernel's 104) for the same 320 mma, ~640 KB;
//   - two barriers per iteration (after the Pᵀ / dSᵀ stores; at the end, which also publishes the next stage of
//     Q / dO / lse / dsum, double-buffered with cp.async one iteration ahead as in the lean kernel);
//   - registers: Sᵀ is accumulated first and Pᵀ packed to the input dtype at once (16 registers instead of 32
//     fp32), then dPᵀ; dSᵀ = Pᵀ (dPᵀ - dsum) uses the rounded Pᵀ (the one dV uses; FlashAttention-2 uses the
//     fp32 one: the difference is below dSᵀ's own rounding to the input dtype). With both fp32 (and the two
//     products interleaved) ptxas spilled 112 bytes at D 128;
//   - mask code only in the warp tiles that need it (bwd_split_sdp<kMask>): a warp tile with no visible element
//     skips its products and writes zeros; dK / dV skip the 16-query slices before the diagonal of a warp's
//     first key and past T; dQ skips the key slices after the diagonal of a warp's last row;
//   - the lean kernel's grid (heaviest key blocks of every head first), workspaces, dsum prep and dQ conversion.
// ptxas sm_90a (registers / spill-store bytes; shared memory per CTA): D 128: bf16 255 / 20, f16 255 / 48,
// 173 KiB; D 64: bf16 231 / 0, f16 221 / 0, 109 KiB. One CTA (8 warps) per SM, like the lean kernel.
template <int D>
using BwdSplit = BwdSplitCfg<D, 64, 1>;

std::atomic<int> g_bwd_variant_override{-1};

int env_backward_variant() {
  static_assert(kFlashBackwardVariants == 2, "one name per variant");
  // -1: by head dim
  static const int v = env_variant("HADATRAIN_FLASH_BWD", {{"0", 0}, {"1", 1}}, -1, -1);
  return v;
}

FlashParams make_params(const AttnShape& s) {
  FlashParams p{};
  p.B = static_cast<int>(s.B);
  p.Hq = static_cast<int>(s.Hq);
  p.Hkv = static_cast<int>(s.Hkv);
  p.T = static_cast<int>(s.T);
  p.S = static_cast<int>(s.S);
  p.scale = static_cast<float>(s.scale);
  p.scale_log2 = static_cast<float>(s.scale * 1.4426950408889634);
  p.causal = s.causal;
  return p;
}

OperandStrides dev_strides(const AttnStrides& st) { return {st.b, st.h, static_cast<int>(st.t)}; }

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

}  // namespace

bool flash_attention_supported(DType dt, const AttnShape& s) {
  // the forward's grid.y holds the query blocks of 128 rows (FwdDefault's kBr), at most 65535
  constexpr int64_t kMaxGridY = 65535, kMaxLen = int64_t{1} << 24, kMaxT = kMaxGridY * 128;
  return (dt == DType::bf16 || dt == DType::f16) && s.D == s.Dv && (s.D == 64 || s.D == 128) && s.B > 0 &&
         s.Hkv > 0 && s.Hq % s.Hkv == 0 && s.T > 0 && s.S > 0 && s.T <= kMaxT && s.S < kMaxLen &&
         s.B * s.Hq <= kMaxGridY && s.B * s.Hkv <= kMaxGridY;
}

bool flash_layout_ok(const void* data, const AttnStrides& st) {
  constexpr int64_t kVec = 8;  // 16 bytes of 16-bit elements
  constexpr int64_t kMaxT = int64_t{1} << 23;  // load_tile's offsets (row < 128) times it fit in 32 bits
  return reinterpret_cast<std::uintptr_t>(data) % 16 == 0 && st.b % kVec == 0 && st.h % kVec == 0 &&
         st.t % kVec == 0 && st.t > -kMaxT && st.t < kMaxT;
}

int flash_backward_variant(int head_dim) {
  const int o = g_bwd_variant_override.load(std::memory_order_relaxed);
  if (o >= 0 && o < kFlashBackwardVariants) return o;
  const int e = env_backward_variant();
  if (e >= 0) return e;
  return head_dim >= 128 ? 1 : 0;  // Note [Backward variants]: run 22's measurements
}
void set_flash_backward_variant(int variant) { g_bwd_variant_override.store(variant, std::memory_order_relaxed); }

FlashAttentionCounts flash_attention_counts() { return {g_forward_calls.load(), g_backward_calls.load()}; }

// The glue (src/ops/cuda/flash_attention.cpp) checks every operand with flash_layout_ok before launching.
void launch_flash_attention_forward(DType dt, const FlashForwardArgs& a, const AttnShape& s, cudaStream_t stream) {
  FlashParams p = make_params(s);
  p.q = dev_strides(a.q.st);
  p.k = dev_strides(a.k.st);
  p.v = dev_strides(a.v.st);
  p.o = dev_strides(a.out.st);
  dispatch(dt, s.D, "flash_attention_forward", [&](auto e, auto dc) {
    using E = decltype(e);
    constexpr int D = decltype(dc)::value;
    uint16_t* out = static_cast<uint16_t*>(a.out.data);
    const uint16_t* q = static_cast<const uint16_t*>(a.q.data);
    const uint16_t* k = static_cast<const uint16_t*>(a.k.data);
    const uint16_t* v = static_cast<const uint16_t*>(a.v.data);
    using C = FwdDefault<D>;  // Note [Forward kernel]
    auto kernel = flash_forward_kernel<E, C>;
    HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(C::kSmemBytes)));
    HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    // flash_attention_supported keeps the query blocks within grid.y's 65535
    const dim3 grid(static_cast<unsigned>(p.B * p.Hq), static_cast<unsigned>((p.T + C::kBr - 1) / C::kBr));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(out, a.lse, q, k, v, p);
  });
  HT_CHECK_LAUNCH("flash_attention_forward");
  ++g_forward_calls;
}


void launch_flash_attention_backward(DType dt, const FlashBackwardArgs& a, const AttnShape& s, cudaStream_t stream) {
  FlashParams p = make_params(s);
  p.q = dev_strides(a.q.st);
  p.k = dev_strides(a.k.st);
  p.v = dev_strides(a.v.st);
  p.o = dev_strides(a.out.st);
  p.dout = dev_strides(a.dout.st);
  p.dq = dev_strides(a.dq.st);
  p.dk = dev_strides(a.dk.st);
  p.dv = dev_strides(a.dv.st);
  const int64_t rows = s.B * s.Hq * s.T;
  dispatch(dt, s.D, "flash_attention_backward", [&](auto e, auto dc) {
    using E = decltype(e);
    constexpr int D = decltype(dc)::value;
    constexpr int kPrepBlock = 256;
    const int64_t chunks = rows * (D / 8);
    flash_bwd_prep_kernel<E, D><<<static_cast<unsigned>((chunks + kPrepBlock - 1) / kPrepBlock), kPrepBlock, 0,
                                  stream>>>(a.dsum, a.dq_acc, static_cast<const uint16_t*>(a.out.data),
                                            static_cast<const uint16_t*>(a.dout.data), p, rows);
    HT_CHECK_LAUNCH("flash_attention_backward (dsum)");
    auto run_kernel = [&](auto kernel, auto cfg) {
      using C = decltype(cfg);
      HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(C::kSmemBytes)));
      if constexpr (C::kMinBlocks > 2) {
        // 3 CTAs per SM: ask for the largest carveout (the driver's choice may leave room for fewer)
        HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
      }
      // key blocks in grid.y, past 65535 of them continued in grid.z (Note [Lean backward])
      constexpr unsigned kMaxGridY = 65535;
      const unsigned key_blocks = static_cast<unsigned>((p.S + C::kBc - 1) / C::kBc);
      const unsigned gy = key_blocks < kMaxGridY ? key_blocks : kMaxGridY;
      const dim3 grid(static_cast<unsigned>(p.B * p.Hkv), gy, (key_blocks + gy - 1) / gy);
      kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(
          static_cast<uint16_t*>(a.dk.data), static_cast<uint16_t*>(a.dv.data), a.dq_acc,
          static_cast<const uint16_t*>(a.q.data), static_cast<const uint16_t*>(a.k.data),
          static_cast<const uint16_t*>(a.v.data), static_cast<const uint16_t*>(a.dout.data), a.lse, a.dsum, p);
    };
    if (flash_backward_variant(D) == 1) run_kernel(flash_backward_split_kernel<E, BwdSplit<D>>, BwdSplit<D>{});
    else run_kernel(flash_backward_kernel<E, BwdDefault<D>>, BwdDefault<D>{});  // Note [Backward variants]
    HT_CHECK_LAUNCH("flash_attention_backward");
    flash_dq_convert_kernel<E, D><<<cuda::grid_for(chunks), cuda::kBlock, 0, stream>>>(
        static_cast<uint16_t*>(a.dq.data), a.dq_acc, p, rows);
    HT_CHECK_LAUNCH("flash_attention_backward (dq)");
  });
  ++g_backward_calls;
}

}  // namespace ht::kernels
