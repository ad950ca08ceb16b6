// The split-tile backward kernel of the fused attention (flash_attention.cuh; overview in flash_attention.cu): 8
// warps, 128 keys x 64 queries per iteration, a different warp tiling for Sᵀ / dPᵀ, dK / dV and dQ, Pᵀ and dSᵀ
// through shared memory (Note [Split backward]; the D 128 default, Note [Backward variants]), and its launch.
#include "cuda/kernels/flash_attention_common.cuh"

namespace ht::kernels::fa {
namespace {

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

// Note [Split backward]
// flash_backward_split_kernel (the D 128 backward, Note [Backward variants]) attacks what the lean kernel would
// spend its time on at D 128: shared-memory traffic. In the lean kernel each warp owns 16 keys and all D
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
// 173 KiB. One CTA (8 warps) per SM, like the lean kernel.
using BwdSplit128 = BwdSplitCfg<128, 64, 1>;

}  // namespace

void launch_backward_split(DType dt, const FlashBackwardArgs& a, const FlashParams& p, cudaStream_t stream) {
  dispatch(dt, 128, "flash_attention_backward", [&](auto e, auto) {
    using E = decltype(e);
    launch_backward_kernel<BwdSplit128>(flash_backward_split_kernel<E, BwdSplit128>, a, p, stream);
  });
}

}  // namespace ht::kernels::fa
