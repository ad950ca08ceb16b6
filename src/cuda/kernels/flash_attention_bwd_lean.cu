// The lean backward kernel of the fused attention (flash_attention.cuh; overview in flash_attention.cu): one CTA
// of 8 warps per (b, kv head, 128-key block), each warp owning 16 keys and all D columns of their dK / dV
// (Note [Lean backward]; the head dim 64 backward, Note [Backward variants]), and its launch.
#include "cuda/kernels/flash_attention_common.cuh"

namespace ht::kernels::fa {
namespace {

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
//   D 64: 8 w, Bq 64, 1 CTA   236 / 0, 109 KiB
// ("1" in the CTA column: no register cap; head dim 128 runs the split kernel, Note [Backward variants].) The 8-warp tiles (128 keys per CTA) halve the dQ atomics and the
// Q / dO tile loads per key against 4 warps. dQ stays with fp32 atomics per key block: a separate dQ pass (a
// CTA per query block looping over the key blocks) would recompute Sᵀ and dPᵀ, two of the backward's five
// products (+40 % mma work), to save atomics that are 1/kBc-th of the products' data volume; FlashAttention-2
// and -3 keep the atomics too.
using BwdLean64 = BwdCfg<64, 8, 64, 1>;

}  // namespace

void launch_backward_lean(DType dt, const FlashBackwardArgs& a, const FlashParams& p, cudaStream_t stream) {
  dispatch(dt, 64, "flash_attention_backward", [&](auto e, auto) {
    using E = decltype(e);
    launch_backward_kernel<BwdLean64>(flash_backward_kernel<E, BwdLean64>, a, p, stream);
  });
}

}  // namespace ht::kernels::fa
