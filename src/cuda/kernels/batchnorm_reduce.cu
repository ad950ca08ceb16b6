// Batch-norm reductions on the split grids (every channels-first shape, channels last below 128 channels, and
// the fallback of the ticket kernels;
// batchnorm_launch.cuh): the statistics and the backward sums, channels last (bn_*_cl, a finalize launch) and
// channels first (bn_*_cf finalised by their last block through tickets, Note [Batch-norm kernels] in
// batchnorm.cu, or bn_*_cf_split + a finalize launch), the finalize kernels, and the eval statistics.
#include "cuda/kernels/batchnorm_common.cuh"

namespace ht::kernels::bn {
namespace {

// ---- statistics -----------------------------------------------------------------------------------------

// Channels last. part (gridDim.y, 2, C): sums of (x - K) and (x - K)^2, K = x[0, c].
template <class T, int V>
HT_DEV void bn_stats_cl_body(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, double* __restrict__ part) {
  using A = bn_t<T>;
  __shared__ A red[2 * V * kThreads];
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int ty = threadIdx.y, TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  A s1[V], s2[V], k[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = k[j] = A(0);
  if (cv < g.CV) {
    const T* col = x + cv * V;
    const Pack<T, V> p0 = load_pack<T, V>(col);
#pragma unroll
    for (int j = 0; j < V; ++j) k[j] = convert<A>(p0.v[j]);
    int64_t r = r0 + ty;
    for (; r + 3 * TY < r1; r += 4 * TY) {
      Pack<T, V> p[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) p[u] = load_pack<T, V>(col + (r + u * TY) * C);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A d = convert<A>(p[u].v[j]) - k[j];
          s1[j] += d;
          s2[j] += d * d;
        }
    }
    for (; r < r1; r += TY) {
      const Pack<T, V> p = load_pack<T, V>(col + r * C);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A d = convert<A>(p.v[j]) - k[j];
        s1[j] += d;
        s2[j] += d * d;
      }
    }
  }
  column_sums_to<A, V>(s1, s2, red, cv, g.CV, C, part);
}
// Compiled for 4 resident blocks per SM (its grid: one wave of them, cl_grid's kTargetBlocksCl).
template <class T, int V>
__global__ void __launch_bounds__(kThreads, 4)
    bn_stats_cl(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, double* __restrict__ part) {
  bn_stats_cl_body<T, V>(x, M, C, g, part);
}

// Channels first. Same partial sums, K = x[0, c, 0]. Fin: the last block of channel c to finish
// (an atomic ticket per channel, tickets[c], reset to 0 by that block) adds the channel's partial sums as
// bn_stats_finalize does and writes mean, invstd and the running stats.
template <class T, int V, bool Fin>
HT_DEV void bn_stats_cf_body(const T* __restrict__ x, BnShape s, CfGrid g, double* __restrict__ part,
                             unsigned* __restrict__ tickets, double eps, BnRunning running, double* __restrict__ mean,
                             double* __restrict__ invstd) {
  using A = bn_t<T>;
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * g.chunk, j1 = std::min(g.per_channel, j0 + g.chunk);
  const A k = convert<A>(x[c * s.S]);
  A s1 = A(0), s2 = A(0), t1 = A(0), t2 = A(0);
  int64_t j = j0 + threadIdx.x;
  for (; j + kThreads < j1; j += 2 * kThreads) {
    const Pack<T, V> p = load_pack<T, V>(x + cf_offset(s, g, c, j, V));
    const Pack<T, V> q = load_pack<T, V>(x + cf_offset(s, g, c, j + kThreads, V));
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const A d = convert<A>(p.v[u]) - k, e = convert<A>(q.v[u]) - k;
      s1 += d;
      s2 += d * d;
      t1 += e;
      t2 += e * e;
    }
  }
  if (j < j1) {
    const Pack<T, V> p = load_pack<T, V>(x + cf_offset(s, g, c, j, V));
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const A d = convert<A>(p.v[u]) - k;
      s1 += d;
      s2 += d * d;
    }
  }
  const double a1 = block_sum(static_cast<double>(s1) + static_cast<double>(t1), scratch);
  const double a2 = block_sum(static_cast<double>(s2) + static_cast<double>(t2), scratch);
  if (threadIdx.x == 0) {
    part[(static_cast<int64_t>(blockIdx.y) * 2) * s.C + c] = a1;
    part[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * s.C + c] = a2;
  }
  if constexpr (Fin) {
    if (last_block_of_channel(tickets, c) && threadIdx.x < 32)
      stats_finalize_channel(part, static_cast<int>(gridDim.y), to_double(x[c * s.S]), s.C, s.N * s.S, eps, running,
                             mean, invstd, c);
  }
}
// Fallback without tickets (C > kTicketSlot, or the first use inside a graph capture): partial sums only,
// added by bn_stats_finalize (no launch bounds).
template <class T, int V>
__global__ void bn_stats_cf_split(const T* __restrict__ x, BnShape s, CfGrid g, double* __restrict__ part) {
  bn_stats_cf_body<T, V, false>(x, s, g, part, nullptr, 0.0, BnRunning{}, nullptr, nullptr);
}
// Compiled for 8 resident blocks per SM.
template <class T, int V>
__global__ void __launch_bounds__(kThreads, 8)
    bn_stats_cf(const T* __restrict__ x, BnShape s, CfGrid g, double* __restrict__ part,
                unsigned* __restrict__ tickets, double eps, BnRunning running, double* __restrict__ mean,
                double* __restrict__ invstd) {
  bn_stats_cf_body<T, V, true>(x, s, g, part, tickets, eps, running, mean, invstd);
}

// kstride: element distance between the channels' first values (1 channels last, S channels first).
template <class T>
__global__ void bn_stats_finalize(const double* __restrict__ part, int splits, const T* __restrict__ x,
                                  int64_t kstride, int64_t C, int64_t M, double eps, BnRunning running,
                                  double* __restrict__ mean, double* __restrict__ invstd) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= C) return;
  stats_finalize_channel(part, splits, M > 0 ? to_double(x[c * kstride]) : 0.0, C, M, eps, running, mean, invstd, c);
}

__global__ void bn_eval_stats_kernel(BnParam running_mean, BnParam running_var, int64_t C, double eps,
                                     double* __restrict__ mean, double* __restrict__ invstd) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    mean[c] = param_at(running_mean, c, 0.0);
    invstd[c] = 1.0 / sqrt(param_at(running_var, c, 1.0) + eps);
  }
}

// ---- backward sums --------------------------------------------------------------------------------------

// part (gridDim.y, 2, C): sums of g' and of g' * (x - mean) (the latter only when x is given; x is given when
// Act masks g).
template <BnAct Act, class T, int V>
HT_DEV void bn_bwd_reduce_cl_body(const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C, ClGrid g,
                                 BnChannels ch, double* __restrict__ part) {
  using A = bn_t<T>;
  __shared__ A red[2 * V * kThreads];
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int ty = threadIdx.y, TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  A s1[V], s2[V], mu[V], sc[V], sh[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = mu[j] = sc[j] = sh[j] = A(0);
  if (cv < g.CV) {
    const int64_t col = cv * V;
    if (x) {
      bn_channel_consts<Act, A, V>(ch, col, mu, sc, sh);
      int64_t r = r0 + ty;
      for (; r + TY < r1; r += 2 * TY) {
        const Pack<T, V> g0 = load_pack<T, V>(gr + col + r * C), g1 = load_pack<T, V>(gr + col + (r + TY) * C);
        const Pack<T, V> x0 = load_pack<T, V>(x + col + r * C), x1 = load_pack<T, V>(x + col + (r + TY) * C);
        const Pack<T, V> q0 = load_res<Act, T, V>(ch, col + r * C), q1 = load_res<Act, T, V>(ch, col + (r + TY) * C);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A xa = convert<A>(x0.v[j]), xb = convert<A>(x1.v[j]);
          const A ga = bn_masked_g<Act, T>(convert<A>(g0.v[j]), xa, sc[j], sh[j], q0.v[j]);
          const A gb = bn_masked_g<Act, T>(convert<A>(g1.v[j]), xb, sc[j], sh[j], q1.v[j]);
          s1[j] += ga + gb;
          s2[j] += ga * (xa - mu[j]) + gb * (xb - mu[j]);
        }
      }
      if (r < r1) {
        const Pack<T, V> g0 = load_pack<T, V>(gr + col + r * C), x0 = load_pack<T, V>(x + col + r * C);
        const Pack<T, V> q0 = load_res<Act, T, V>(ch, col + r * C);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A ga = bn_masked_g<Act, T>(convert<A>(g0.v[j]), convert<A>(x0.v[j]), sc[j], sh[j], q0.v[j]);
          s1[j] += ga;
          s2[j] += ga * (convert<A>(x0.v[j]) - mu[j]);
        }
      }
    } else {
      int64_t r = r0 + ty;
      for (; r + 3 * TY < r1; r += 4 * TY) {
        Pack<T, V> p[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) p[u] = load_pack<T, V>(gr + col + (r + u * TY) * C);
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int j = 0; j < V; ++j) s1[j] += convert<A>(p[u].v[j]);
      }
      for (; r < r1; r += TY) {
        const Pack<T, V> p = load_pack<T, V>(gr + col + r * C);
#pragma unroll
        for (int j = 0; j < V; ++j) s1[j] += convert<A>(p.v[j]);
      }
    }
  }
  column_sums_to<A, V>(s1, s2, red, cv, g.CV, C, part);
}
// Compiled for kClBlocks<Act> resident blocks per SM (its grid: one wave of them).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, kClBlocks<Act>)
    bn_bwd_reduce_cl(const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C, ClGrid g,
                     BnChannels ch, double* __restrict__ part) {
  bn_bwd_reduce_cl_body<Act, T, V>(gr, x, M, C, g, ch, part);
}

// Fin: the last block of channel c adds the channel's partial sums as bn_bwd_finalize does.
template <BnAct Act, class T, int V, bool Fin>
HT_DEV void bn_bwd_reduce_cf_body(const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch,
                                  double* __restrict__ part, unsigned* __restrict__ tickets, BnBackwardSums out) {
  using A = bn_t<T>;
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * g.chunk, j1 = std::min(g.per_channel, j0 + g.chunk);
  const A mu = x ? static_cast<A>(ch.mean[c]) : A(0);
  A sc = A(0), sh = A(0);
  if constexpr (Act != BnAct::none) {
    double a, b;
    affine_of(ch, c, a, b);
    sc = static_cast<A>(a);
    sh = static_cast<A>(b);
  }
  A s1 = A(0), s2 = A(0);
  int64_t j = j0 + threadIdx.x;
  if (x) {
    for (; j + kThreads < j1; j += 2 * kThreads) {
      const int64_t o0 = cf_offset(s, g, c, j, V), o1 = cf_offset(s, g, c, j + kThreads, V);
      const Pack<T, V> g0 = load_pack<T, V>(gr + o0), g1 = load_pack<T, V>(gr + o1);
      const Pack<T, V> x0 = load_pack<T, V>(x + o0), x1 = load_pack<T, V>(x + o1);
      const Pack<T, V> q0 = load_res<Act, T, V>(ch, o0), q1 = load_res<Act, T, V>(ch, o1);
#pragma unroll
      for (int u = 0; u < V; ++u) {
        const A xa = convert<A>(x0.v[u]), xb = convert<A>(x1.v[u]);
        const A ga = bn_masked_g<Act, T>(convert<A>(g0.v[u]), xa, sc, sh, q0.v[u]);
        const A gb = bn_masked_g<Act, T>(convert<A>(g1.v[u]), xb, sc, sh, q1.v[u]);
        s1 += ga + gb;
        s2 += ga * (xa - mu) + gb * (xb - mu);
      }
    }
    if (j < j1) {
      const int64_t o0 = cf_offset(s, g, c, j, V);
      const Pack<T, V> g0 = load_pack<T, V>(gr + o0), x0 = load_pack<T, V>(x + o0);
      const Pack<T, V> q0 = load_res<Act, T, V>(ch, o0);
#pragma unroll
      for (int u = 0; u < V; ++u) {
        const A ga = bn_masked_g<Act, T>(convert<A>(g0.v[u]), convert<A>(x0.v[u]), sc, sh, q0.v[u]);
        s1 += ga;
        s2 += ga * (convert<A>(x0.v[u]) - mu);
      }
    }
  } else {
    for (; j + kThreads < j1; j += 2 * kThreads) {
      const Pack<T, V> g0 = load_pack<T, V>(gr + cf_offset(s, g, c, j, V));
      const Pack<T, V> g1 = load_pack<T, V>(gr + cf_offset(s, g, c, j + kThreads, V));
#pragma unroll
      for (int u = 0; u < V; ++u) s1 += convert<A>(g0.v[u]) + convert<A>(g1.v[u]);
    }
    if (j < j1) {
      const Pack<T, V> g0 = load_pack<T, V>(gr + cf_offset(s, g, c, j, V));
#pragma unroll
      for (int u = 0; u < V; ++u) s1 += convert<A>(g0.v[u]);
    }
  }
  const double a1 = block_sum(static_cast<double>(s1), scratch);
  const double a2 = block_sum(static_cast<double>(s2), scratch);
  if (threadIdx.x == 0) {
    part[(static_cast<int64_t>(blockIdx.y) * 2) * s.C + c] = a1;
    part[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * s.C + c] = a2;
  }
  if constexpr (Fin) {
    if (last_block_of_channel(tickets, c) && threadIdx.x < 32)
      bwd_finalize_channel(part, static_cast<int>(gridDim.y), s.C, ch.invstd, out, c);
  }
}
// Fallback without tickets (as bn_stats_cf_split): partial sums only, added by bn_bwd_finalize.
template <BnAct Act, class T, int V>
__global__ void bn_bwd_reduce_cf_split(const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g,
                                       BnChannels ch, double* __restrict__ part) {
  bn_bwd_reduce_cf_body<Act, T, V, false>(gr, x, s, g, ch, part, nullptr, BnBackwardSums{});
}
// Compiled for 8 (6 with a fused activation) resident blocks per SM.
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, (Act == BnAct::none ? 8 : 6))
    bn_bwd_reduce_cf(const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch,
                     double* __restrict__ part, unsigned* __restrict__ tickets, BnBackwardSums out) {
  bn_bwd_reduce_cf_body<Act, T, V, true>(gr, x, s, g, ch, part, tickets, out);
}

__global__ void bn_bwd_finalize(const double* __restrict__ part, int splits, int64_t C,
                                const double* __restrict__ invstd, BnBackwardSums out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= C) return;
  bwd_finalize_channel(part, splits, C, invstd, out, c);
}

}  // namespace

void stats_split(const StatsArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const int64_t M = s.N * s.S;
  const double eps = a.eps;
  const BnRunning running = a.running;
  double* mean = a.mean;
  double* invstd = a.invstd;
  visit_bn(a.dt, s, {a.x}, [&](auto tag, auto vtag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    const T* xp = static_cast<const T*>(a.x);
    const unsigned fb = finalize_blocks(s.C);
    if (M == 0) {  // no values: NaN statistics, as on the CPU
      bn_stats_finalize<T><<<fb, kThreads, 0, stream>>>(nullptr, 0, xp, 1, s.C, 0, eps, running, mean, invstd);
    } else if (s.S == 1) {
      const ClGrid g = cl_grid(M, s.C, V, kTargetBlocksCl);
      const Scratch part(part_bytes(g.grid.y, s.C), stream);
      bn_stats_cl<T, V><<<g.grid, g.block, 0, stream>>>(xp, M, s.C, g, part.get());
      HT_CHECK_LAUNCH("bn_stats_cl");
      bn_stats_finalize<T><<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(g.grid.y), xp, 1, s.C, M,
                                                        eps, running, mean, invstd);
    } else {
      const CfGrid g = cf_grid(s, V);
      const Scratch part(part_bytes(g.grid.y, s.C), stream);
      if (unsigned* tickets = bn_tickets(s.C, stream)) {
        bn_stats_cf<T, V><<<g.grid, kThreads, 0, stream>>>(xp, s, g, part.get(), tickets, eps, running, mean,
                                                           invstd);
        HT_CHECK_LAUNCH("bn_stats_cf");
        return;
      }
      bn_stats_cf_split<T, V><<<g.grid, kThreads, 0, stream>>>(xp, s, g, part.get());
      HT_CHECK_LAUNCH("bn_stats_cf_split");
      bn_stats_finalize<T><<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(g.grid.y), xp, s.S, s.C, M,
                                                        eps, running, mean, invstd);
    }
  });
}

void bwd_reduce_split(const ReduceArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  const BnBackwardSums& out = a.out;
  const int64_t M = s.N * s.S;
  const unsigned fb = finalize_blocks(s.C);
  if (M == 0) {  // empty sums are 0
    bn_bwd_finalize<<<fb, kThreads, 0, stream>>>(nullptr, 0, s.C, ch.invstd, out);
    return;
  }
  visit_bn_act(a.dt, s, {a.g, a.x, ch.residual}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const T* gp = static_cast<const T*>(a.g);
    const T* xp = static_cast<const T*>(a.x);
    if (s.S == 1) {
      const ClGrid cg = cl_grid(M, s.C, V, 132 * kClBlocks<Act>);
      const Scratch part(part_bytes(cg.grid.y, s.C), stream);
      bn_bwd_reduce_cl<Act, T, V><<<cg.grid, cg.block, 0, stream>>>(gp, xp, M, s.C, cg, ch, part.get());
      HT_CHECK_LAUNCH("bn_bwd_reduce_cl");
      bn_bwd_finalize<<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(cg.grid.y), s.C, ch.invstd, out);
    } else {
      const CfGrid cg = cf_grid(s, V);
      const Scratch part(part_bytes(cg.grid.y, s.C), stream);
      if (unsigned* tickets = bn_tickets(s.C, stream)) {
        bn_bwd_reduce_cf<Act, T, V><<<cg.grid, kThreads, 0, stream>>>(gp, xp, s, cg, ch, part.get(), tickets, out);
        HT_CHECK_LAUNCH("bn_bwd_reduce_cf");
        return;
      }
      bn_bwd_reduce_cf_split<Act, T, V><<<cg.grid, kThreads, 0, stream>>>(gp, xp, s, cg, ch, part.get());
      HT_CHECK_LAUNCH("bn_bwd_reduce_cf_split");
      bn_bwd_finalize<<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(cg.grid.y), s.C, ch.invstd, out);
    }
  });
}

}  // namespace ht::kernels::bn

namespace ht::kernels {

void launch_bn_eval_stats(BnParam running_mean, BnParam running_var, int64_t C, double eps, double* mean,
                          double* invstd, cudaStream_t stream) {
  if (C == 0) return;
  bn::bn_eval_stats_kernel<<<cuda::grid_for(C), cuda::kBlock, 0, stream>>>(running_mean, running_var, C, eps, mean,
                                                                         invstd);
  HT_CHECK_LAUNCH("batch_norm eval stats");
}

}  // namespace ht::kernels
