// The staged layer_norm / rms_norm backward (Note [Staged norm kernels] in rows_staged.cuh, Notes [Norm kernels]
// and [Norm backward, clusters] in rows_norm.cu): gx and one partial row of the parameter gradients per block
// (per cluster for the cluster kernel of rows >= 2048 wide), which
// norm_param_finalize_wide_kernel (rows_norm.cu) adds. The launch shape comes from staged_grid
// (rows_norm_staged_fwd.cu).
#include "cuda/kernels/rows_staged.cuh"

namespace ht::kernels::rk {
namespace {

// kCl: the cluster kernel (Note [Norm backward, clusters]).
template <class T, int NP, bool kCl = false>
__global__ void __launch_bounds__(kRowBlock, 2) norm_backward_staged_kernel(NormBackwardArgs a, int tpr, int stages) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  constexpr int kSlots = 2 * NP + 1;  // the thread's packs of g, of x, then (mean, rstd) of the row
  static_assert(2 * sizeof(A) <= sizeof(P), "row statistics in one slot");
  static_assert(kRowBlock / 64 <= 4, "kCl: one named barrier per row group of more than a warp (ids 1..4)");
  extern __shared__ __align__(16) unsigned char norm_dyn_smem[];
  __shared__ A red[2][2][kRowBlock / 32];
  const int64_t d = a.dim;
  const int packs = static_cast<int>(d / V);
  const bool layer = a.kind == NormKind::layer;
  const bool params = a.gw_partial || a.gb_partial;
  // (D) weight (1 without one), padded to 16 bytes; then the stages [stages][kSlots][block]
  A* ws = reinterpret_cast<A*>(norm_dyn_smem);
  const int64_t ws_bytes = (d * static_cast<int64_t>(sizeof(A)) + 15) / 16 * 16;
  P* stage = reinterpret_cast<P*>(norm_dyn_smem + ws_bytes);
  const StagedRows sr(a.rows, tpr);
  const int tid = static_cast<int>(threadIdx.x);
  const T* gp = static_cast<const T*>(a.g);
  const T* xp = static_cast<const T*>(a.x);
  const A* meanp = static_cast<const A*>(a.mean);
  const A* rstdp = static_cast<const A*>(a.rstd);
  const int stat_width = tpr < 32 ? tpr : 32;  // kCl: threads of a warp sharing one copy of the statistics
  auto issue = [&](int64_t grp, int st) {
    if (grp < sr.groups) {
      const int64_t r0 = sr.row_of(grp);
      const int64_t row = r0 < a.rows ? r0 : a.rows - 1;
      P* dst = stage + st * kSlots * kRowBlock + tid;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int q = sr.lane + i * tpr;
        if (q >= packs) continue;
        cp_async16(dst + i * kRowBlock, gp + row * d + static_cast<int64_t>(q) * V);
        cp_async16(dst + (NP + i) * kRowBlock, xp + row * d + static_cast<int64_t>(q) * V);
      }
      A* stats = reinterpret_cast<A*>(dst + 2 * NP * kRowBlock);
      // (kCl: the first thread of each warp's share of the row group only; it shuffles them)
      if (!kCl || sr.lane % stat_width == 0) {
        if (layer) cp_async_small<sizeof(A)>(stats, meanp + row);
        cp_async_small<sizeof(A)>(stats + 1, rstdp + row);
      }
    }
    cp_async_commit();
  };
  for (int s = 0; s + 1 < stages; ++s) issue(blockIdx.x + static_cast<int64_t>(s) * gridDim.x, s);
  const Param<T, A> w{a.weight, a.weight_narrow};
  (void)stage_param(ws, w, d, A(1));
  __syncthreads();
  A accw[NP][V], accb[NP][V];
#pragma unroll
  for (int i = 0; i < NP; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) accw[i][k] = accb[i][k] = A(0);
  A inv_d;
  if constexpr (kHalfPack<T>) inv_d = A(1) / static_cast<A>(d);
  auto over_d = [&](A v) {
    if constexpr (kHalfPack<T>) return v * inv_d;
    else return v / static_cast<A>(d);
  };
  int phase = 0, st = 0;
  for (int64_t grp = blockIdx.x; grp < sr.groups; grp += gridDim.x) {
    issue(grp + static_cast<int64_t>(stages - 1) * gridDim.x, st == 0 ? stages - 1 : st - 1);
    cp_async_wait(stages - 1);
    const int64_t row = sr.row_of(grp);
    const bool valid = row < a.rows;
    const P* src = stage + st * kSlots * kRowBlock + tid;
    st = st + 1 == stages ? 0 : st + 1;
    const A* stats = reinterpret_cast<const A*>(src + 2 * NP * kRowBlock);
    A m, r;
    if constexpr (kCl) {
      A m0 = A(0), r0 = A(0);
      if (sr.lane % stat_width == 0) {
        m0 = layer ? stats[0] : A(0);
        r0 = stats[1];
      }
      m = __shfl_sync(kFull, m0, 0, stat_width);
      r = __shfl_sync(kFull, r0, 0, stat_width);
    } else {
      m = layer ? stats[0] : A(0);
      r = stats[1];
    }
    const A mr = m * r;
    auto xhat = [&](A xv) {
      if constexpr (kHalfPack<T>) return d_fma(xv, r, -mr);
      else return (xv - m) * r;
    };
    A s_gh = A(0), s_ghx = A(0);
    auto weight_of = [&](int, int q, A(&wv)[V]) { load_params<A, V>(ws, q * V, A(1), wv); };
    // kAcc: a row of the tensor (not past the end), whose g * xhat and g go into the column sums
    auto pass1 = [&](auto acc) {
      constexpr bool kAcc = decltype(acc)::value;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int q = sr.lane + i * tpr;
        if (q >= packs) continue;
        A gf[V], xf[V], wv[V];
        unpack(src[i * kRowBlock], gf);
        unpack(src[(NP + i) * kRowBlock], xf);
        weight_of(i, q, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A xh = xhat(xf[k]);
          const A gh = gf[k] * wv[k];
          s_gh += gh;
          s_ghx = d_fma(gh, xh, s_ghx);
          if constexpr (kAcc) {
            accw[i][k] = d_fma(gf[k], xh, accw[i][k]);
            accb[i][k] += gf[k];
          }
        }
      }
    };
    if (valid) pass1(std::true_type{});
    else pass1(std::false_type{});
    group_sum2<kCl>(s_gh, s_ghx, tpr, red, phase);  // uniform across the row group (kCl) / the block
    if (!valid) continue;
    const A mean_gh = layer ? over_d(s_gh) : A(0), mean_ghx = over_d(s_ghx);
    const A c1 = -r * mean_gh, c2 = -r * mean_ghx;
    // Finite sums and statistics: every g * weight and xhat is finite (a NaN or inf one makes s_ghx NaN or
    // inf), so no result is NaN short of a float overflow (pack_cast unchecked).
    const bool finite = d_finite(s_gh) && d_finite(s_ghx) && d_finite(r) && d_finite(m);
    T* gx = static_cast<T*>(a.gx) + row * d;
    auto f = [&](int i, A(&o)[V]) {
      const int q = sr.lane + i * tpr;
      A gf[V], xf[V], wv[V];
      unpack(src[i * kRowBlock], gf);
      unpack(src[(NP + i) * kRowBlock], xf);
      weight_of(i, q, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A xh = xhat(xf[k]);
        const A gh = gf[k] * wv[k];
        if constexpr (kHalfPack<T>) o[k] = d_fma(xh, c2, d_fma(gh, r, c1));
        else o[k] = r * ((gh - mean_gh) - xh * mean_ghx);
      }
      if (a.accumulate) {  // the gradient gx already holds, read by the thread that overwrites it
        A pf[V];
        unpack(reinterpret_cast<const Pack<T, V>*>(gx)[q], pf);
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] += pf[k];
      }
    };
    // Without accumulation every result is finite when the sums are; a prior gradient may not be.
    if (finite && !a.accumulate) store_packs<false, T, NP>(gx, packs, sr.lane, tpr, f);
    else store_packs<true, T, NP>(gx, packs, sr.lane, tpr, f);
  }
  cp_async_wait(0);
  if (!params) return;  // uniform
  __syncthreads();  // the stages are free now
  {
    // The row slots' column sums added pairwise, slot s + h into slot s for h = per_block / 2, ..., 1, every
    // thread of the upper half handing its 2 NP V sums over at once (a fixed order: deterministic), then slot 0
    // stores the block's partial row. (tpr threads of slot 0 walking the per_block slots in one dependent chain
    // per column reach 0.173 of copy at 16640 x 384 against 0.461 for this tree.)
    A* ts = reinterpret_cast<A*>(stage);  // [2][NP][V][block / 2]
    auto tat = [&](int which, int i, int k, int t) { return ((which * NP + i) * V + k) * (kRowBlock / 2) + t; };
    for (int h = sr.per_block / 2; h >= 1; h /= 2) {
      if (sr.slot >= h && sr.slot < 2 * h) {
        const int t = (sr.slot - h) * tpr + sr.lane;
#pragma unroll
        for (int i = 0; i < NP; ++i)
#pragma unroll
          for (int k = 0; k < V; ++k) {
            ts[tat(0, i, k, t)] = accw[i][k];
            ts[tat(1, i, k, t)] = accb[i][k];
          }
      }
      __syncthreads();
      if (sr.slot < h) {
        const int t = sr.slot * tpr + sr.lane;
#pragma unroll
        for (int i = 0; i < NP; ++i)
#pragma unroll
          for (int k = 0; k < V; ++k) {
            accw[i][k] += ts[tat(0, i, k, t)];
            accb[i][k] += ts[tat(1, i, k, t)];
          }
      }
      __syncthreads();
    }
    if constexpr (kCl) {
      // Variant 4: the cluster's blocks (row slot 0 of each holds the block's sums now) add up into block 0 of
      // the cluster in rank order (deterministic) through distributed shared memory, and only it stores a
      // partial row (row blockIdx.x / cluster size): cluster-size times fewer rows to write and to finalize.
      const unsigned rank = cluster_rank(), nblocks = cluster_blocks();
      if (nblocks > 1) {  // uniform across the cluster
        A* xs = reinterpret_cast<A*>(stage);  // [2][NP][V][tpr]; the tree above has finished with the stages
        auto xat = [&](int which, int i, int k) { return ((which * NP + i) * V + k) * tpr + sr.lane; };
        if (rank != 0 && sr.slot == 0) {
#pragma unroll
          for (int i = 0; i < NP; ++i)
#pragma unroll
            for (int k = 0; k < V; ++k) {
              xs[xat(0, i, k)] = accw[i][k];
              xs[xat(1, i, k)] = accb[i][k];
            }
        }
        cluster_sync_all();
        if (rank == 0 && sr.slot == 0) {
          for (unsigned c = 1; c < nblocks; ++c) {
            const A* peer = cluster_peer(static_cast<const A*>(xs), c);
#pragma unroll
            for (int i = 0; i < NP; ++i)
#pragma unroll
              for (int k = 0; k < V; ++k) {
                accw[i][k] += peer[xat(0, i, k)];
                accb[i][k] += peer[xat(1, i, k)];
              }
          }
        }
        cluster_sync_all();  // the peers' shared memory stays until block 0 has read it
      }
      if (sr.slot != 0 || rank != 0) return;
      // 16-byte stores (a pack's V sums are 16 or 32 bytes, rows of D sums start 16-byte aligned when the
      // buffer does)
      constexpr int kPer = 16 / static_cast<int>(sizeof(A));
      static_assert(V % kPer == 0, "whole 16-byte stores");
      const int64_t prow = static_cast<int64_t>(blockIdx.x / nblocks) * d;
      auto store_row = [&](void* base, const A(&acc)[NP][V]) {
        if (!base) return;
        A* dst = static_cast<A*>(base) + prow;
        const bool vec = aligned_to(base, 16);
#pragma unroll
        for (int i = 0; i < NP; ++i) {
          const int q = sr.lane + i * tpr;
          if (q >= packs) continue;
          if (vec) {
#pragma unroll
            for (int c = 0; c < V / kPer; ++c) {
              Pack<A, kPer> o;
#pragma unroll
              for (int k = 0; k < kPer; ++k) o.v[k] = acc[i][c * kPer + k];
              reinterpret_cast<Pack<A, kPer>*>(dst + static_cast<int64_t>(q) * V)[c] = o;
            }
          } else {
#pragma unroll
            for (int k = 0; k < V; ++k) dst[static_cast<int64_t>(q) * V + k] = acc[i][k];
          }
        }
      };
      store_row(a.gw_partial, accw);
      store_row(a.gb_partial, accb);
      return;
    }
    if (sr.slot != 0) return;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int q = sr.lane + i * tpr;
      if (q >= packs) continue;
      const int64_t at0 = static_cast<int64_t>(blockIdx.x) * d + q * V;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (a.gw_partial) static_cast<A*>(a.gw_partial)[at0 + k] = accw[i][k];
        if (a.gb_partial) static_cast<A*>(a.gb_partial)[at0 + k] = accb[i][k];
      }
    }
  }
}

template <class T, bool kCl>
const void* const (&norm_bwd_kernels())[4] {
  static const void* const k[4] = {reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 1, kCl>),
                                   reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 2, kCl>),
                                   reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 3, kCl>),
                                   reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 4, kCl>)};
  return k;
}

template <class T>
StagedGrid norm_bwd_staged_grid_of(const NormBackwardArgs& a, StagedKind kind) {
  const bool cluster = kind == StagedKind::cluster;
  const void* const (&k)[4] = cluster ? norm_bwd_kernels<T, true>() : norm_bwd_kernels<T, false>();
  StagedGrid g = staged_grid(a.rows, a.dim, kVec<T>, sizeof(acc_t<T>), StagedPass::backward, 0, {a.gx, a.g, a.x}, k);
  if (g.np > 0 && cluster) {
    g.cluster_kernel = true;
    pick_cluster(g, k[g.np - 1]);
  }
  return g;
}
}  // namespace

StagedGrid norm_bwd_staged_grid(const NormBackwardArgs& a, StagedKind kind) {
  StagedGrid g;
  visit_kernel_float(a.dtype, [&](auto tag) { g = norm_bwd_staged_grid_of<decltype(tag)>(a, kind); });
  return g;
}

void launch_norm_backward_staged(const NormBackwardArgs& a, const StagedGrid& sg, cudaStream_t stream) {
  visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (sg.cluster_kernel) {
      // the cluster kernels, in clusters of sg.cluster blocks (a plain launch when 1)
      auto* kernel = sg.np == 1   ? norm_backward_staged_kernel<T, 1, true>
                     : sg.np == 2 ? norm_backward_staged_kernel<T, 2, true>
                     : sg.np == 3 ? norm_backward_staged_kernel<T, 3, true>
                                  : norm_backward_staged_kernel<T, 4, true>;
      if (sg.cluster > 1) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(sg.blocks, 1, 1);
        cfg.blockDim = dim3(kRowBlock, 1, 1);
        cfg.dynamicSmemBytes = sg.smem;
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = sg.cluster;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        HT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, sg.tpr, sg.stages));
      } else {
        kernel<<<sg.blocks, kRowBlock, sg.smem, stream>>>(a, sg.tpr, sg.stages);
      }
      HT_CHECK_LAUNCH("norm_backward_staged_kernel (cluster)");
      return;
    }
    auto* kernel = sg.np == 1   ? norm_backward_staged_kernel<T, 1>
                   : sg.np == 2 ? norm_backward_staged_kernel<T, 2>
                   : sg.np == 3 ? norm_backward_staged_kernel<T, 3>
                                : norm_backward_staged_kernel<T, 4>;
    kernel<<<sg.blocks, kRowBlock, sg.smem, stream>>>(a, sg.tpr, sg.stages);
    HT_CHECK_LAUNCH("norm_backward_staged_kernel");
  });
}

}  // namespace ht::kernels::rk
