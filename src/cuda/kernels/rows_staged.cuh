// Device helpers of the staged layer_norm / rms_norm kernels (rows_norm_staged_fwd.cu, rows_norm_staged_bwd.cu;
// Note [Staged norm kernels] below): cp.async, the row-group sums and named barriers, thread block clusters,
// the parameters staged into shared memory or registers, and the row-group bookkeeping. HT_DEV
// (__forceinline__), as rows_common.cuh.
#pragma once
#include "cuda/kernels/cp_async.cuh"
#include "cuda/kernels/rows_common.cuh"

namespace ht::kernels::rk {

// ---- layer_norm / rms_norm, staged rows ---------------------------------------------------------------------
// Note [Staged norm kernels]
// The register-resident norm kernels (rows_norm_cached.cu) load a row, wait for it, reduce and store, with the
// next row's loads issued only by other blocks (forward: 0.68 of copy bandwidth at 4096-wide bf16 rows on the H200,
// where the softmax kernel of the same shape reaches 0.95) or by a register prefetch of one row group
// (backward: 0.43 at 50432 x 768, 0.26 at 16640 x 384). These kernels instead stage the rows through shared
// memory with cp.async (cp_async.cuh), `stages` (2..4) row groups deep: at the top of every iteration a thread
// issues the copies of the row group stages - 1 iterations ahead, then waits for the current one. A thread copies and
// later reads only its own 16-byte slots (slot i of thread t at [stage][i][t], conflict-free), so the stages need no
// barrier. One wave of persistent blocks walks the row groups (the grid comes from the occupancy).
// Other changes against the register-resident kernels:
// - threads per row tpr: the smallest power of two (1..256) with at most four packs per thread, so a
//   768-wide bf16 row (96 packs) is one warp with three packs per lane and a 384-wide row half a warp (no
//   idle lanes, no barrier: groups up to a warp reduce with shuffles only);
// - forward, bf16 / f16: one reduction of the pair (sum of x - K, sum of (x - K)^2) with K the row's first
//   element (a shifted one-pass variance: the relative error of the variance grows with (mean - K)^2 / var,
//   small unless the first element is a far outlier of its row) instead of two reductions; f32 / f64 keep two
//   (the mean, then the sum of squares about it); rms_norm reduces sum x^2 alone. (Two passes in bf16
//   measure no faster on the H200: 0.0959 against 0.0896 ms at 16384 x 4096, equal elsewhere.);
// - the parameters are converted once per block into shared memory (float, double for f64), and checked
//   there for NaN / inf: rows whose statistics and parameters are finite skip pack_cast's NaN check;
// - backward: the weight in shared memory, g and x staged; the gradients of weight and bias summed per
//   column in registers over the block's rows, then over the block's row slots in a fixed order, one partial
//   row per block (norm_param_finalize_wide_kernel adds the blocks' rows in a fixed order: deterministic).
// bf16 / f16 rows use the fused-multiply forms of xhat and gx (x r - mean r; gh r + c1 + xhat c2) and the
// MUFU rsqrt; f32 / f64 keep (x - mean) r and r ((gh - mean gh) - xhat mean(gh xhat)).
// Rows that are not packable, or longer than 256 x 4 packs, take the register-resident / multi-pass kernels.
HT_DEV bool d_finite(float v) { return isfinite(v); }
HT_DEV bool d_finite(double v) { return isfinite(v); }
HT_DEV float d_fma(float a, float b, float c) { return fmaf(a, b, c); }
HT_DEV double d_fma(double a, double b, double c) { return fma(a, b, c); }

// The cluster backward (Note [Norm backward, clusters]): the warps of a row group of more than a warp meet at their
// own named barrier (1 + the row slot, tpr threads) instead of the block-wide one, so the block's row groups do
// not wait for each other (group_sum2<true>). (The barrier ids are immediates: a register id makes ptxas reserve
// all 16 barriers.)
HT_DEV void bar_sync_row(int slot, int threads) {
  switch (slot) {  // row slots 0..3: groups of more than a warp, at most 4 per block
    case 0: asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;\n" ::"r"(threads) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;\n" ::"r"(threads) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;\n" ::"r"(threads) : "memory"); break;
  }
}
// Sums (u, v) over the tpr threads (a power of two, 1..256; groups of more than a warp aligned to warps) of a
// row group in a fixed order; every thread of the group gets the totals. Every thread of the block calls it,
// or with kRowBarrier (the cluster backward) every thread of the group: the group's warps then meet at its named barrier
// (bar_sync_row) instead of __syncthreads, with the same sums in the same order. Groups of more than a warp
// combine their warps through red, whose two buffers alternate (phase) so that one barrier per call suffices
// (as tile_reduce1; a group's entries are its own warps, so this holds per group too).
template <bool kRowBarrier = false, class A>
HT_DEV void group_sum2(A& u, A& v, int tpr, A (*red)[2][kRowBlock / 32], int& phase) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < tpr) {
      u += shfl_xor(u, o);
      v += shfl_xor(v, o);
    }
  }
  if (tpr > 32) {
    A(*buf)[kRowBlock / 32] = red[phase];
    phase ^= 1;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int first = static_cast<int>(threadIdx.x) / tpr * (tpr / 32);
    if (threadIdx.x % 32 == 0) {
      buf[0][warp] = u;
      buf[1][warp] = v;
    }
    if constexpr (kRowBarrier) bar_sync_row(static_cast<int>(threadIdx.x) / tpr, tpr);
    else __syncthreads();
    u = buf[0][first];
    v = buf[1][first];
    for (int w = 1; w < tpr / 32; ++w) {
      u += buf[0][first + w];
      v += buf[1][first + w];
    }
  }
}

// Thread block clusters (sm_90; a launch without a cluster dimension is a cluster of one block).
HT_DEV unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return __clusterRelativeBlockRank();
#else
  return 0;
#endif
}
HT_DEV unsigned cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return __clusterSizeInBlocks();
#else
  return 1;
#endif
}
// Every thread of every block of the cluster; shared-memory writes before it are visible cluster-wide after.
HT_DEV void cluster_sync_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
#else
  __syncthreads();
#endif
}
// The address of p (this block's shared memory) in block `rank` of the cluster.
template <class A>
HT_DEV const A* cluster_peer(const A* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<const A*>(__cluster_map_shared_rank(p, rank));
#else
  (void)rank;
  return p;
#endif
}

// A norm parameter (D) into shared memory as A (`none` without it), by 16-byte packs when it starts
// 16-byte aligned and D is a multiple of the pack, else element by element (at 4096-wide bf16
// rows that is 16 iterations of 2-byte loads per thread before a block's first row); true when every
// value is finite. dst is 16-byte aligned.
template <class T, class A>
HT_DEV bool stage_param(A* dst, const Param<T, A>& p, int64_t d, A none) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(A));  // A values per 16-byte shared-memory store
  const int tid = static_cast<int>(threadIdx.x);
  bool fin = true;
  if (p.p && p.narrow && aligned_to(p.p, 16) && d % kVec<T> == 0) {
    constexpr int V = kVec<T>;
    static_assert(V % kPer == 0, "whole shared-memory packs");
    for (int64_t q = tid; q < d / V; q += kRowBlock) {
      A v[V];
      unpack(reinterpret_cast<const Pack<T, V>*>(p.p)[q], v);
#pragma unroll
      for (int c = 0; c < V / kPer; ++c) {
        Pack<A, kPer> o;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          o.v[k] = v[c * kPer + k];
          fin = fin && d_finite(o.v[k]);
        }
        reinterpret_cast<Pack<A, kPer>*>(dst + q * V)[c] = o;
      }
    }
    return fin;
  }
  if (p.p && !p.narrow && aligned_to(p.p, 16) && d % kPer == 0) {
    for (int64_t q = tid; q < d / kPer; q += kRowBlock) {
      const Pack<A, kPer> o = reinterpret_cast<const Pack<A, kPer>*>(p.p)[q];
#pragma unroll
      for (int k = 0; k < kPer; ++k) fin = fin && d_finite(o.v[k]);
      reinterpret_cast<Pack<A, kPer>*>(dst)[q] = o;
    }
    return fin;
  }
  for (int64_t j = tid; j < d; j += kRowBlock) {
    const A v = p ? p[j] : none;
    dst[j] = v;
    fin = fin && d_finite(v);
  }
  return fin;
}

// NormParamsAt::reg_narrow: the thread's packs of a bf16 / f16 parameter (or nothing without it) into
// registers; true when every value is finite.
template <class T, int NP>
HT_DEV bool reg_params_narrow(Pack<T, kVec<T>> (&out)[NP], const Param<T, acc_t<T>>& p, int64_t d, int lane, int tpr) {
  constexpr int V = kVec<T>;
  if (!p.p) return true;
  const int packs = static_cast<int>(d / V);
  const T* pt = static_cast<const T*>(p.p);
  const bool vec = aligned_to(p.p, 16);
  bool fin = true;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int q = lane + i * tpr;
    if (q >= packs) continue;
    if (vec) {
      out[i] = reinterpret_cast<const Pack<T, V>*>(pt)[q];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[i].v[k] = pt[static_cast<int64_t>(q) * V + k];
    }
    acc_t<T> f[V];
    unpack(out[i], f);
#pragma unroll
    for (int k = 0; k < V; ++k) fin = fin && d_finite(f[k]);
  }
  return fin;
}

// The staged forward takes the shift by a shuffle from lane 0 (no shift slot) when a row group is at most a warp.
HT_HD inline bool staged_shfl_shift(int tpr) { return tpr <= 32; }

// kReg (the forward's StagedKind::reg, Note [Norm kernels]): the thread's own parameter values (the columns of its packs,
// the same in every row) into registers, straight from global memory (16-byte loads when aligned, else element
// by element); true when every one is finite.
template <class T, class A, int NP, int V>
HT_DEV bool reg_params(A (&out)[NP][V], const Param<T, A>& p, int64_t d, int lane, int tpr, A none) {
  const int packs = static_cast<int>(d / V);
  const bool vec = p.p && aligned_to(p.p, 16);
  bool fin = true;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int q = lane + i * tpr;
    if (q >= packs) continue;
    if (vec || !p.p) {
      load_param<T, A, V>(p, q * V, none, out[i]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[i][k] = p[static_cast<int64_t>(q) * V + k];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) fin = fin && d_finite(out[i][k]);
  }
  return fin;
}

// Row-group bookkeeping shared by the two staged kernels.
struct StagedRows {
  int tpr, per_block, lane, slot;
  int64_t groups;
  HT_DEV StagedRows(int64_t rows, int tpr_) : tpr(tpr_) {
    per_block = kRowBlock / tpr;
    lane = static_cast<int>(threadIdx.x) % tpr;
    slot = static_cast<int>(threadIdx.x) / tpr;
    groups = (rows + per_block - 1) / per_block;
  }
  HT_DEV int64_t row_of(int64_t grp) const { return grp * per_block + slot; }
};

// Blocks per SM the register bound of norm_staged_kernel aims at: 3 for bf16 / f16 packs of parameters at 3
// packs per thread (80 registers, as the shared-memory kernel; the 384- and 768-wide rows), else 2.
template <int NP, int kPm>
inline constexpr int kStagedMinBlocks = kPm == 2 && NP == 3 ? 3 : 2;

}  // namespace ht::kernels::rk
