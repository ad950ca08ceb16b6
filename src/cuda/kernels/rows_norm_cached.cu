// The register-resident layer_norm / rms_norm kernels (the rows the staged kernels do not take; Note [Norm
// kernels] in rows_norm.cu): the forward holds a row in registers (the section
// "register-resident rows" of rows_common.cuh), the backward the rows of g and x, with the parameter gradients'
// column sums in registers and one partial row per block.
#include "cuda/kernels/rows_common.cuh"

namespace ht::kernels::rk {
namespace {

template <class T, int NP>
__global__ void __launch_bounds__(kCacheMaxTpr, NP == 4 ? 2 : 1) norm_cached_kernel(NormArgs a, int tpr) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  __shared__ A smem[2][kCacheMaxTpr / 32];
  const int64_t d = a.dim;
  const int packs = static_cast<int>(d / V);
  const Param<T, A> w{a.weight, a.weight_narrow};
  const Param<T, A> b{a.bias, a.bias_narrow};
  const bool layer = a.kind == NormKind::layer;
  const A inv_d = A(1) / static_cast<A>(d);  // bf16 / f16: the mean and variance by a multiplication
  int phase = 0;
  for_each_cached_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    RowCache<T, NP> c;
    c.load(static_cast<const T*>(a.x) + row * d, packs, lane, tpr);
    A x[NP][V];  // the row in A, converted once; x - mean after the second pass
#pragma unroll
    for (int i = 0; i < NP; ++i)
      if (lane + i * tpr < packs) unpack(c.p[i], x[i]);
    A m = A(0), ms = A(0);
    if (layer) {  // uniform across the block: every thread reduces
      // bf16 / f16: the mean as K + mean(x - K), K the row's first element (Note [Shifted row mean])
      A shift = A(0);
      if constexpr (kShiftMean<T>) shift = convert<A>(static_cast<const T*>(a.x)[row * d]);
      A s = A(0);
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        if (lane + i * tpr >= packs) continue;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          if constexpr (kShiftMean<T>) x[i][k] -= shift;
          s += x[i][k];
        }
      }
      const A total = tile_reduce1(s, tpr, smem, phase, Sum{});
      if constexpr (kHalfPack<T>) ms = total * inv_d;
      else ms = total / static_cast<A>(d);
      m = shift + ms;
    }
    A ss = A(0);
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      if (lane + i * tpr >= packs) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        x[i][k] -= ms;
        ss += x[i][k] * x[i][k];
      }
    }
    ss = tile_reduce1(ss, tpr, smem, phase, Sum{});
    if (!valid) return;
    A r;
    if constexpr (kHalfPack<T>) r = fast_rsqrt(ss * inv_d + static_cast<A>(a.eps));
    else r = A(1) / d_sqrt(ss / static_cast<A>(d) + static_cast<A>(a.eps));
    if (lane == 0) {
      if (a.mean) static_cast<A*>(a.mean)[row] = m;
      static_cast<A*>(a.rstd)[row] = r;
    }
    T* y = static_cast<T*>(a.out) + row * d;
    // y = xh * w + b; without parameters w = 1 and b = 0 leave xh exact. A NaN / inf entry or parameter can
    // make single results NaN: pack_cast checks.
    store_packs<true, T, NP>(y, packs, lane, tpr, [&](int i, A(&o)[V]) {
      const int j = (lane + i * tpr) * V;
      A wv[V], bv[V];
      load_param(w, j, A(1), wv);
      load_param(b, j, A(0), bv);
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = x[i][k] * r * wv[k] + bv[k];
    });
  });
}

// Combines (u, v) over the tpr threads of a row group with a sum, like tile_reduce but both values in one
// pass (one pair of barriers instead of two). smem holds two values per warp.
template <class A>
HT_DEV void tile_sum2(A& u, A& v, int tpr, A* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u += shfl_xor(u, o);
    v += shfl_xor(v, o);
  }
  if (tpr > 32) {
    constexpr int kWarps = kRowBlock / 32;
    const int first = static_cast<int>(threadIdx.x) / tpr * (tpr / 32);
    if (threadIdx.x % 32 == 0) {
      smem[threadIdx.x / 32] = u;
      smem[kWarps + threadIdx.x / 32] = v;
    }
    __syncthreads();
    u = smem[first];
    v = smem[kWarps + first];
    for (int w = 1; w < tpr / 32; ++w) {
      u += smem[first + w];
      v += smem[kWarps + first + w];
    }
    __syncthreads();
  }
}

// One block per resident slot (the host sizes the grid to the occupancy: one wave), each walking its row
// groups with the next group's g, x, mean and rstd loaded before the current one is reduced, so every
// thread keeps loads in flight through its reductions and stores (the kernel was latency-bound: about 0.4
// of copy bandwidth at 50432 x 768 bf16).
template <class T, int NP>
__global__ void __launch_bounds__(kRowBlock, NP == 2 ? 2 : 1) norm_backward_cached_kernel(NormBackwardArgs a, int tpr) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  __shared__ A smem[2 * (kRowBlock / 32)];
  __shared__ A colsum[kRowBlock * V];
  const int64_t d = a.dim;
  const int packs = static_cast<int>(d / V);
  const Param<T, A> w{a.weight, a.weight_narrow};
  const T* gp = static_cast<const T*>(a.g);
  const T* xp = static_cast<const T*>(a.x);
  const A* meanp = static_cast<const A*>(a.mean);
  const A* rstdp = static_cast<const A*>(a.rstd);
  const bool layer = a.kind == NormKind::layer;
  const bool params = a.gw_partial || a.gb_partial;
  const int per_block = kRowBlock / tpr;
  const int lane = static_cast<int>(threadIdx.x) % tpr, slot = static_cast<int>(threadIdx.x) / tpr;
  const int64_t groups = (a.rows + per_block - 1) / per_block;
  A accw[NP][V], accb[NP][V];
#pragma unroll
  for (int i = 0; i < NP; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) accw[i][k] = accb[i][k] = A(0);
  RowCache<T, NP> cg, cx;
  A m = A(0), r = A(0);
  auto fetch = [&](int64_t grp, RowCache<T, NP>& fg, RowCache<T, NP>& fx, A& fm, A& fr) {
    const int64_t row0 = grp * per_block + slot;
    const int64_t row = row0 < a.rows ? row0 : a.rows - 1;
    fg.load(gp + row * d, packs, lane, tpr);
    fx.load(xp + row * d, packs, lane, tpr);
    fm = layer ? meanp[row] : A(0);
    fr = rstdp[row];
  };
  int64_t grp = blockIdx.x;
  if (grp < groups) fetch(grp, cg, cx, m, r);
  for (; grp < groups; grp += gridDim.x) {
    const int64_t row = grp * per_block + slot;
    const bool valid = row < a.rows;
    RowCache<T, NP> ng, nx;
    A nm = A(0), nr = A(0);
    if (grp + gridDim.x < groups) fetch(grp + gridDim.x, ng, nx, nm, nr);  // uniform across the block
    A s_gh = A(0), s_ghx = A(0);
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int q = lane + i * tpr;
      if (q >= packs) continue;
      A wv[V];
      load_param(w, q * V, A(1), wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A gv = convert<A>(cg.p[i].v[k]);
        const A xh = (convert<A>(cx.p[i].v[k]) - m) * r;
        const A gh = w ? gv * wv[k] : gv;
        s_gh += gh;
        s_ghx += gh * xh;
        if (valid) {
          accw[i][k] += gv * xh;
          accb[i][k] += gv;
        }
      }
    }
    tile_sum2(s_gh, s_ghx, tpr, smem);  // uniform across the block
    if (valid) {
      const A mean_gh = layer ? s_gh / static_cast<A>(d) : A(0), mean_ghx = s_ghx / static_cast<A>(d);
      T* gx = static_cast<T*>(a.gx) + row * d;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int q = lane + i * tpr;
        if (q >= packs) continue;
        A wv[V];
        load_param(w, q * V, A(1), wv);
        Pack<T, V> o, prior;
        if (a.accumulate) prior = reinterpret_cast<const Pack<T, V>*>(gx)[q];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A gv = convert<A>(cg.p[i].v[k]);
          const A xh = (convert<A>(cx.p[i].v[k]) - m) * r;
          const A gh = w ? gv * wv[k] : gv;
          const A v = r * ((gh - mean_gh) - xh * mean_ghx);
          o.v[k] = store_cast<T>(a.accumulate ? v + convert<A>(prior.v[k]) : v);
        }
        reinterpret_cast<Pack<T, V>*>(gx)[q] = o;
      }
    }
    cg = ng;
    cx = nx;
    m = nm;
    r = nr;
  }
  if (!params) return;
  // Add the row groups' column sums (groups in order) and write this block's partial row.
  const int groups_in_block = kRowBlock / tpr;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    A* dst = static_cast<A*>(which == 0 ? a.gw_partial : a.gb_partial);
    if (!dst) continue;  // uniform
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      __syncthreads();
#pragma unroll
      for (int k = 0; k < V; ++k) colsum[threadIdx.x * V + k] = which == 0 ? accw[i][k] : accb[i][k];
      __syncthreads();
      const int q = lane + i * tpr;
      if (static_cast<int>(threadIdx.x) < tpr && q < packs) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          A t = colsum[lane * V + k];
          for (int gi = 1; gi < groups_in_block; ++gi) t += colsum[(gi * tpr + lane) * V + k];
          dst[static_cast<int64_t>(blockIdx.x) * d + q * V + k] = t;
        }
      }
    }
  }
}

// Blocks of norm_backward_cached_kernel<T, NP> resident at once on the whole device (occupancy x SMs,
// queried once; 2 x 132 if the queries fail).
template <class T, int NP>
int64_t norm_bwd_resident() {
  static const int64_t n = [] {
    const int64_t r = cuda::resident_blocks(reinterpret_cast<const void*>(norm_backward_cached_kernel<T, NP>),
                                            kRowBlock, 0);
    return r > 0 ? r : int64_t{2 * 132};
  }();
  return n;
}
}  // namespace

bool launch_norm_cached(const NormArgs& a, cudaStream_t stream) {
  bool launched = false;
  visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const CacheGrid cg = cache_grid(a.rows, a.dim, kVec<T>, {a.out, a.x, a.weight, a.bias});
    if (cg.np == 0) return;
    auto* kernel = cg.np == 4 ? norm_cached_kernel<T, 4> : norm_cached_kernel<T, 8>;
    kernel<<<cg.blocks, cg.block, 0, stream>>>(a, cg.tpr);
    HT_CHECK_LAUNCH("norm_cached_kernel");
    launched = true;
  });
  return launched;
}

// One wave of blocks (each walks several row groups, prefetching the next), at most kBwdMaxBlocks.
BwdGrid norm_bwd_grid(const NormBackwardArgs& a) {
  BwdGrid g;
  visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    g = bwd_grid(a.rows, a.dim, kVec<T>, {a.gx, a.g, a.x, a.weight}, kBwdMaxBlocks);
    if (g.np == 0) return;
    const int64_t wave = g.np == 2 ? norm_bwd_resident<T, 2>() : norm_bwd_resident<T, 4>();
    if (static_cast<int64_t>(g.blocks) > wave) g.blocks = static_cast<unsigned>(wave);
  });
  return g;
}

void launch_norm_backward_cached(const NormBackwardArgs& a, const BwdGrid& bg, cudaStream_t stream) {
  visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = bg.np == 2 ? norm_backward_cached_kernel<T, 2> : norm_backward_cached_kernel<T, 4>;
    kernel<<<bg.blocks, kRowBlock, 0, stream>>>(a, bg.tpr);
    HT_CHECK_LAUNCH("norm_backward_cached_kernel");
  });
}

}  // namespace ht::kernels::rk
