// The channels-last ticket reductions (Note [Batch-norm channels-last tickets] below; batchnorm_launch.cuh):
// the statistics and backward sums of x (M, C) in one launch each, finalised through two levels of tickets.
#include <atomic>

#include "cuda/kernels/batchnorm_common.cuh"

namespace ht::kernels::bn {
namespace {

// ---- channels-last ticket reductions (Note [Batch-norm channels-last tickets]) --------------------------
// Note [Batch-norm channels-last tickets]: bn_stats_cl2 / bn_bwd_reduce_cl2 read x (M, C) in the split kernels' block
// shape (threadIdx.x along C, one pack of V channels a thread; threadIdx.y along rows) with a grid of one wave
// of kCl2Blocks blocks a SM, and kCl2U 16-byte packs of a thread in flight (the sums: kCl2U / 2 rows of g and
// x; the split kernels have 4 packs of x, 2 rows of g and x, at 4 blocks a SM: 64 B a thread, 2x less). The tail rows
// of a thread go through the same guarded batch. The block's rows are added with shuffles inside each warp
// (when blockDim.x is a power of two below 32: 32 / blockDim.x rows a warp), then over the warps in shared
// memory in a fixed order (the split kernels: a shared-memory tree with a barrier per level), and written as one
// double partial row (gy, 2, C). No finalize launch: the partial rows of a column of blocks (blockIdx.x) are
// added in two ticket levels: the last block of each group of `group` consecutive rows (about sqrt(gy)) adds
// them (a thread a channel, all loads in flight) to a group row (groups, 2, C); the last group to finish adds
// the group rows and writes the statistics / sums. The split kernels' finalize kernel instead reads all 2 * gy * C
// partials with a warp a channel (a 32-byte sector per 8-byte load). Fixed order at both levels:
// deterministic. Tickets: bn_tickets' slot, counters [bx * (groups + 1) + group] and [bx * (groups + 1) +
// groups]; reset to 0 by the blocks that take the last ticket.
constexpr int kCl2Blocks = 2;  // resident 256-thread blocks a SM (launch bounds; the grid is one wave)
constexpr int kCl2U = 8;       // packs of a thread in flight

struct Cl2Grid {
  ClGrid g;
  int group = 1, groups = 1;  // partial rows a group, groups
  int64_t tickets = 0;        // counters used
};

Cl2Grid cl2_grid(int64_t M, int64_t C, int V) {
  Cl2Grid r;
  r.g = cl_grid(M, C, V, int64_t{132} * kCl2Blocks);
  const int gy = static_cast<int>(r.g.grid.y);
  int group = 1;
  while (group * group < gy) ++group;
  r.group = group;
  r.groups = (gy + group - 1) / group;
  r.tickets = static_cast<int64_t>(r.g.grid.x) * (r.groups + 1);
  return r;
}

// The block's column sums of s1, s2 (V values a thread) over its rows, written as double to part row
// blockIdx.y: part[(blockIdx.y * 2 + {0, 1}) * C + c]. red: 2 * V * kThreads values. Every thread calls it.
template <class A, int V>
HT_DEV void cl2_column_sums(const A (&s1)[V], const A (&s2)[V], A* red, int64_t CV, int64_t C, double* part) {
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  A v1[V], v2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    v1[j] = s1[j];
    v2[j] = s2[j];
  }
  // Rows of one warp (blockDim.x * blockDim.y == kThreads: every warp is full): lanes tx, tx + TX, ...
  const bool shfl = TX < 32 && (TX & (TX - 1)) == 0;
  const int rg = shfl ? 32 / TX : 1;
  if (shfl) {
    for (int o = TX; o < 32; o <<= 1) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        v1[j] += __shfl_xor_sync(0xffffffffu, v1[j], o);
        v2[j] += __shfl_xor_sync(0xffffffffu, v2[j], o);
      }
    }
  }
  const int R = TY / rg, grp = ty / rg;  // row groups (warps when shfl)
  if (ty % rg == 0) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      red[(j * R + grp) * TX + tx] = v1[j];
      red[((V + j) * R + grp) * TX + tx] = v2[j];
    }
  }
  __syncthreads();
  for (int q = ty * TX + tx; q < 2 * V * TX; q += TX * TY) {
    const int j = q / TX, x = q - j * TX;  // value j of pack x: sum j / V, channel j % V
    A a = A(0);
    for (int k = 0; k < R; ++k) a += red[(j * R + k) * TX + x];
    const int64_t cv = static_cast<int64_t>(blockIdx.x) * TX + x;
    if (cv < CV)
      part[(static_cast<int64_t>(blockIdx.y) * 2 + j / V) * C + cv * V + j % V] = static_cast<double>(a);
  }
}

// After cl2_column_sums: the two ticket levels (the Note). fin(c, a1, a2) runs once per channel c of the
// block's column, in the block that finishes the column, with the channel's sums.
template <class Fin>
HT_DEV void cl2_finish(const double* part, double* part2, unsigned* tickets, int group, int groups, int64_t C,
                       int64_t c0, int64_t nc, Fin&& fin) {
  __shared__ bool last;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
  unsigned* t = tickets + static_cast<int64_t>(blockIdx.x) * (groups + 1);
  const int gy = static_cast<int>(gridDim.y), grp = static_cast<int>(blockIdx.y) / group;
  const int y0 = grp * group, y1 = min(gy, y0 + group);
  __threadfence();  // every thread's partial stores before the ticket
  __syncthreads();
  if (tid == 0) {
    const unsigned k = atomicAdd(t + grp, 1u);
    last = k == static_cast<unsigned>(y1 - y0 - 1);
    if (last) t[grp] = 0u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t c = c0 + tid; c < c0 + nc; c += nt) {
    double a1 = 0.0, a2 = 0.0;
#pragma unroll 8
    for (int y = y0; y < y1; ++y) {
      a1 += __ldcg(part + (static_cast<int64_t>(y) * 2) * C + c);
      a2 += __ldcg(part + (static_cast<int64_t>(y) * 2 + 1) * C + c);
    }
    part2[(static_cast<int64_t>(grp) * 2) * C + c] = a1;
    part2[(static_cast<int64_t>(grp) * 2 + 1) * C + c] = a2;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned k = atomicAdd(t + groups, 1u);
    last = k == static_cast<unsigned>(groups - 1);
    if (last) t[groups] = 0u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t c = c0 + tid; c < c0 + nc; c += nt) {
    double a1 = 0.0, a2 = 0.0;
#pragma unroll 8
    for (int q = 0; q < groups; ++q) {
      a1 += __ldcg(part2 + (static_cast<int64_t>(q) * 2) * C + c);
      a2 += __ldcg(part2 + (static_cast<int64_t>(q) * 2 + 1) * C + c);
    }
    fin(c, a1, a2);
  }
}

// Statistics, as bn_stats_cl + bn_stats_finalize (K = x[0, c]).
template <class T, int V>
__global__ void __launch_bounds__(kThreads, kCl2Blocks)
    bn_stats_cl2(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, int group, int groups,
                 double* __restrict__ part, double* __restrict__ part2, unsigned* __restrict__ tickets, double eps,
                 BnRunning running, double* __restrict__ mean, double* __restrict__ invstd) {
  using A = bn_t<T>;
  __shared__ A red[2 * V * kThreads];
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  A s1[V], s2[V], k[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = k[j] = A(0);
  if (cv < g.CV) {
    const T* col = x + cv * V;
    const Pack<T, V> p0 = plane_load<T, V>(col);
#pragma unroll
    for (int j = 0; j < V; ++j) k[j] = convert<A>(p0.v[j]);
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kCl2U * TY) {
      Pack<T, V> p[kCl2U];
#pragma unroll
      for (int u = 0; u < kCl2U; ++u)
        if (r + u * TY < r1) p[u] = plane_load<T, V>(col + (r + u * TY) * C);
#pragma unroll
      for (int u = 0; u < kCl2U; ++u)
        if (r + u * TY < r1) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A d = convert<A>(p[u].v[j]) - k[j];
            s1[j] += d;
            s2[j] += d * d;
          }
        }
    }
  }
  cl2_column_sums<A, V>(s1, s2, red, g.CV, C, part);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x * V;
  cl2_finish(part, part2, tickets, group, groups, C, c0, std::min<int64_t>(C - c0, int64_t{blockDim.x} * V),
             [&](int64_t c, double a1, double a2) {
               stats_write(a1, a2, to_double(x[c]), M, eps, running, mean, invstd, c);
             });
}

// Backward sums, as bn_bwd_reduce_cl + bn_bwd_finalize.
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, kCl2Blocks)
    bn_bwd_reduce_cl2(const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C, ClGrid g,
                      BnChannels ch, int group, int groups, double* __restrict__ part, double* __restrict__ part2,
                      unsigned* __restrict__ tickets, BnBackwardSums out) {
  using A = bn_t<T>;
  constexpr int U = Act == BnAct::add_relu ? 3 : kCl2U / 2;  // rows of g and x (and r) in flight (4: r spilled)
  __shared__ A red[2 * V * kThreads];
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  A s1[V], s2[V], mu[V], sc[V], sh[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = mu[j] = sc[j] = sh[j] = A(0);
  if (cv < g.CV) {
    const int64_t col = cv * V;
    if (x) {
      bn_channel_consts<Act, A, V>(ch, col, mu, sc, sh);
      for (int64_t r = r0 + threadIdx.y; r < r1; r += U * TY) {
        Pack<T, V> gp[U], xp[U], rp[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (r + u * TY < r1) {
            const int64_t o = col + (r + u * TY) * C;
            gp[u] = plane_load<T, V>(gr + o);
            xp[u] = plane_load<T, V>(x + o);
            rp[u] = plane_res<Act, T, V>(ch, o);
          }
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (r + u * TY < r1) {
#pragma unroll
            for (int j = 0; j < V; ++j) {
              const A xa = convert<A>(xp[u].v[j]);
              const A ga = bn_masked_g<Act, T>(convert<A>(gp[u].v[j]), xa, sc[j], sh[j], rp[u].v[j]);
              s1[j] += ga;
              s2[j] += ga * (xa - mu[j]);
            }
          }
      }
    } else {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kCl2U * TY) {
        Pack<T, V> p[kCl2U];
#pragma unroll
        for (int u = 0; u < kCl2U; ++u)
          if (r + u * TY < r1) p[u] = plane_load<T, V>(gr + col + (r + u * TY) * C);
#pragma unroll
        for (int u = 0; u < kCl2U; ++u)
          if (r + u * TY < r1) {
#pragma unroll
            for (int j = 0; j < V; ++j) s1[j] += convert<A>(p[u].v[j]);
          }
      }
    }
  }
  cl2_column_sums<A, V>(s1, s2, red, g.CV, C, part);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x * V;
  cl2_finish(part, part2, tickets, group, groups, C, c0, std::min<int64_t>(C - c0, int64_t{blockDim.x} * V),
             [&](int64_t c, double a1, double a2) { bwd_write(a1, a2, ch.invstd, out, c); });
}

// Launches of the ticket kernels (bn_cl_ticket_launches).
std::atomic<int64_t> g_cl_ticket_launches{0};

// The ticket slot for the grid g, or null (then the split kernels run): counts the launch.
unsigned* cl2_tickets(const Cl2Grid& g, cudaStream_t stream) {
  if (g.tickets > kTicketSlot) return nullptr;  // callers check the channel count (cl_tickets_for)
  unsigned* t = bn_tickets(g.tickets, stream);
  if (t) g_cl_ticket_launches.fetch_add(1, std::memory_order_relaxed);
  return t;
}

}  // namespace

bool stats_cl2(const StatsArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const int64_t M = s.N * s.S;
  bool launched = false;
  visit_bn(a.dt, s, {a.x}, [&](auto tag, auto vtag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    const T* xp = static_cast<const T*>(a.x);
    const Cl2Grid g2 = cl2_grid(M, s.C, V);
    if (unsigned* tickets = cl2_tickets(g2, stream)) {
      const Scratch part(part_bytes(g2.g.grid.y + static_cast<unsigned>(g2.groups), s.C), stream);
      double* part2 = part.get() + static_cast<int64_t>(g2.g.grid.y) * 2 * s.C;
      bn_stats_cl2<T, V><<<g2.g.grid, g2.g.block, 0, stream>>>(xp, M, s.C, g2.g, g2.group, g2.groups, part.get(),
                                                               part2, tickets, a.eps, a.running, a.mean, a.invstd);
      HT_CHECK_LAUNCH("bn_stats_cl2");
      launched = true;
    }
  });
  return launched;
}

bool bwd_reduce_cl2(const ReduceArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  const int64_t M = s.N * s.S;
  bool launched = false;
  visit_bn_act(a.dt, s, {a.g, a.x, ch.residual}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const T* gp = static_cast<const T*>(a.g);
    const T* xp = static_cast<const T*>(a.x);
    const Cl2Grid g2 = cl2_grid(M, s.C, V);
    if (unsigned* tickets = cl2_tickets(g2, stream)) {
      const Scratch part(part_bytes(g2.g.grid.y + static_cast<unsigned>(g2.groups), s.C), stream);
      double* part2 = part.get() + static_cast<int64_t>(g2.g.grid.y) * 2 * s.C;
      bn_bwd_reduce_cl2<Act, T, V><<<g2.g.grid, g2.g.block, 0, stream>>>(
          gp, xp, M, s.C, g2.g, ch, g2.group, g2.groups, part.get(), part2, tickets, a.out);
      HT_CHECK_LAUNCH("bn_bwd_reduce_cl2");
      launched = true;
    }
  });
  return launched;
}

}  // namespace ht::kernels::bn

namespace ht::kernels {

int64_t bn_cl_ticket_launches() { return bn::g_cl_ticket_launches.load(std::memory_order_relaxed); }

}  // namespace ht::kernels
