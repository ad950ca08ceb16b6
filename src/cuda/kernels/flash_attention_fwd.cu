// The forward kernel of the fused attention (flash_attention.cuh; overview in flash_attention.cu): one CTA of 4
// warps per (b, query head, 128-query block), K / V tiles streamed through shared memory, the online softmax
// in registers (Note [Forward kernel]), and its launch.
#include "cuda/kernels/flash_attention_common.cuh"

namespace ht::kernels::fa {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

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
// D 128 255 / 112 spill bytes, 102 KiB. Measured on the H200 against four other configurations
// (the previous kernel with FlashAttention-1-style masking and two barriers per tile; this code with 64 / 32-key
// tiles; 8 warps of 16 rows; 96 / 48-key tiles without spills): these tiles were fastest or within 4 %
// everywhere (docs/cuda_backend.md), and the others were removed.
template <int D>
using FwdDefault = FwdTiles<D, 4, 2, D == 64 ? 128 : 64, 2>;

}  // namespace

// flash_attention_supported keeps the query blocks within grid.y's 65535.
void launch_forward(DType dt, int64_t d, const FlashForwardArgs& a, const FlashParams& p, cudaStream_t stream) {
  dispatch(dt, d, "flash_attention_forward", [&](auto e, auto dc) {
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
    const dim3 grid(static_cast<unsigned>(p.B * p.Hq), static_cast<unsigned>((p.T + C::kBr - 1) / C::kBr));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(out, a.lse, q, k, v, p);
  });
}

}  // namespace ht::kernels::fa
