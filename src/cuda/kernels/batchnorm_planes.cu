// Channels-first variant 2, the plane kernels (Note [Batch-norm plane kernels]; batchnorm_launch.cuh): the
// statistics, normalize, backward sums and dx with a warp per (n, c) plane of x (N, C, S).
// Note [Batch-norm plane kernels]: channels-first variants (bn_cf_variant(), HADATRAIN_BN_CF_KERNEL; variant 1
// is the split grids of batchnorm_reduce.cu and batchnorm_map.cu; variant 3, the default since run 22, is
// variant 1 with 16-byte stores). Variant 2 (planes): x (N, C, S) is read as
// P = N*C planes of S contiguous values, a warp per plane (lanes along S, 4 packs of a lane in flight: 8 in the
// statistics, two planes at once when a plane is at most 4 packs a lane; 2 with
// a residual), a grid of one wave of 2 or 4 resident 256-thread blocks per SM whose W warps take planes w, w + W,
// ...: the GPU streams the tensor in address order (the split grids give each block planes C*S apart), with
// no block-wide reduction or __syncthreads. The reductions keep one partial pair per plane (the split layout
// with N splits) in a lane register of their warp (at most 32 planes a warp) and write them after the loop
// (one fence per lane, then the tickets: a channel's N planes), so the loop has no fence or atomic; the warp that
// took a channel's last ticket adds its N partials in the finalize kernel's fixed order. Normalize and dx walk
// the planes from the last one down (the reduction's last planes are still in L2). Taken when 2048 <= N*C <=
// 67584 (32 planes a warp of the reductions' grid), S >= 32 and C <= 4096 (a ticket slot, and the ticket
// buffer exists); otherwise variant 1's kernels run.
// 16-byte packs are loaded as uint4 and stored with an explicit st.global.v4.u32 (plane_load / plane_store):
// NVVM lowers variant 1's Pack stores in bn_normalize_cf / bn_dx_cf (bf16 / f16) to eight 2-byte
// st.global.u16 (run 21's profile: normalize 89 us, L2-bound on 8x the write sectors; a plain uint4 store
// still became st.global.v2.u16 there). Variant 3 (HADATRAIN_BN_CF_KERNEL = vstore, the default) is variant 1 with those
// stores as plane_store (cf_store<true>), bit-identical results. Run 22 (H200, bf16 256x64x32x32, ms fwd / bwd):
// split 0.1026 / 0.1037, planes 0.0512 / 0.0734, vstore 0.0351 / 0.0515 (0.674 / 0.765 of copy); with relu and
// add+relu vstore is also the fastest, so it became the default.
#include <atomic>

#include "cuda/kernels/batchnorm_common.cuh"

namespace ht::kernels::bn {
namespace {

// ---- plane kernels (channels first, variant 2; Note [Batch-norm plane kernels]) -------------------------
// x (N, C, S) as P = N*C planes of S contiguous values, plane p = n * C + c at element p * S. A warp takes
// one plane at a time (lanes along S, U packs of V a lane in flight), the grid's W warps stride over the
// planes: warp w takes planes w, w + W, ... (reductions, from the first plane up) or P-1-w, P-1-w-W, ...
// (normalize / dx, from the last plane down: they first read what the reduction read last, still in L2).
// The reductions write one partial pair per plane at part[(n * 2 + {0, 1}) * C + c] (the split layout with
// N splits), a warp's planes in batches of 32 after its loop (flush_planes), and the warp holding the last
// plane of a channel (a ticket per channel counting N planes) adds the channel's N partials in the finalize
// kernel's fixed order.

constexpr int kPlaneThreads = 256, kPlaneWarps = kPlaneThreads / 32;
constexpr int64_t kPlaneMinPlanes = 2048, kPlaneMinS = 32;
// Resident blocks per SM the kernels are compiled for (their grids: one wave of them): normalize 4 (64
// registers), the reductions and dx 2 (128; with 8 packs of a lane in flight they spilled at 64 and 80).
constexpr int kPlaneBlocksNorm = 4, kPlaneBlocksRed = 2;
// Most planes the reductions take: 32 a warp of their grid (keep_plane).
constexpr int64_t kPlaneMaxPlanes = int64_t{32} * 132 * kPlaneBlocksRed * kPlaneWarps;

// Packs in flight per lane: 4, 2 when the residual is read too.
template <BnAct Act>
inline constexpr int kPlaneU = Act == BnAct::add_relu ? 2 : 4;

HT_DEV int plane_lane() { return static_cast<int>(threadIdx.x % 32); }
HT_DEV int64_t plane_warp() { return static_cast<int64_t>(blockIdx.x) * kPlaneWarps + threadIdx.x / 32; }
HT_DEV int64_t plane_warps() { return static_cast<int64_t>(gridDim.x) * kPlaneWarps; }

// A warp's plane partial sums: lane k keeps those of the warp's k-th plane (p), until flush_planes writes
// them (partials at part[(n * 2 + {0, 1}) * C + c]) and takes their tickets, all at once after the loop.
struct PlaneSlot {
  double a1 = 0.0, a2 = 0.0;
  int64_t p = 0;
};
// Writes the count kept partial pairs, then the ticket of each plane's channel (the threadFenceReduction
// pattern per lane); the warp then finalises (fin(c), every lane) each channel whose last plane it held. Not
// inlined (once per warp).
template <class Fin>
__device__ __noinline__ void flush_planes(const PlaneSlot& slot, int count, const BnShape& s, double* part,
                                         unsigned* tickets, Fin&& fin) {
  const int lane = plane_lane();
  bool last = false;
  int64_t c = 0;
  if (lane < count) {
    const int64_t n = slot.p / s.C;
    c = slot.p - n * s.C;
    part[(n * 2) * s.C + c] = slot.a1;
    part[(n * 2 + 1) * s.C + c] = slot.a2;
    __threadfence();
    const unsigned t = atomicAdd(tickets + c, 1u);
    last = t == static_cast<unsigned>(s.N) - 1u;
    if (last) {
      tickets[c] = 0u;  // every plane of the channel has taken its ticket
      __threadfence();
    }
  }
  unsigned mask = __ballot_sync(0xffffffffu, last);
  while (mask != 0u) {
    const int k = __ffs(mask) - 1;
    mask &= mask - 1u;
    fin(__shfl_sync(0xffffffffu, c, k));
  }
}
// Keeps the warp's sums (a1, a2: lane 0's are the plane's) of plane p as its count-th. A warp has at most 32
// planes (use_planes: N*C <= kPlaneMaxPlanes), flushed once after its loop: no call, fence
// or atomic in the loop.
HT_DEV void keep_plane(PlaneSlot& slot, int& count, int64_t p, double a1, double a2) {
  a1 = __shfl_sync(0xffffffffu, a1, 0);
  a2 = __shfl_sync(0xffffffffu, a2, 0);
  if (count >= 32) __trap();  // more planes than the launcher allows
  if (plane_lane() == count) {
    slot.a1 = a1;
    slot.a2 = a2;
    slot.p = p;
  }
  ++count;
}

// Sums of (x - k) and (x - k)^2 over one plane (this lane's share).
template <class T, int V, int U, class A>
HT_DEV void plane_stats(const T* __restrict__ xp, int64_t SV, A k, A& s1, A& s2) {
  #pragma unroll 1
  for (int64_t i0 = plane_lane(); i0 < SV; i0 += 32 * U) {
    Pack<T, V> p[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * 32 < SV) p[u] = plane_load<T, V>(xp + (i0 + u * 32) * V);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * 32 < SV) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A d = convert<A>(p[u].v[j]) - k;
          s1 += d;
          s2 += d * d;
        }
      }
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kPlaneThreads, kPlaneBlocksRed)
    bn_stats_planes(const T* __restrict__ x, BnShape s, double* __restrict__ part, unsigned* __restrict__ tickets,
                    double eps, BnRunning running, double* __restrict__ mean, double* __restrict__ invstd) {
  using A = bn_t<T>;
  const int64_t P = s.N * s.C, SV = s.S / V, W = plane_warps();
  auto fin = [&](int64_t c) {
    stats_finalize_channel(part, static_cast<int>(s.N), to_double(x[c * s.S]), s.C, s.N * s.S, eps, running, mean,
                           invstd, c);
  };
  PlaneSlot slot;
  int count = 0;
  int64_t p = plane_warp();
  if (SV <= 32 * 4) {
    // A plane is at most 4 packs a lane: two planes (p and p + W) loaded at once, 8 packs of a lane in flight.
    #pragma unroll 1
    for (; p + W < P; p += 2 * W) {
      const int64_t p2 = p + W, c = p % s.C, c2 = p2 % s.C;
      const T* x1 = x + p * s.S;
      const T* x2 = x + p2 * s.S;
      Pack<T, V> a[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = plane_lane() + u * 32;
        if (i < SV) {
          a[u] = plane_load<T, V>(x1 + i * V);
          b[u] = plane_load<T, V>(x2 + i * V);
        }
      }
      const A k = convert<A>(x[c * s.S]), k2 = convert<A>(x[c2 * s.S]);
      A s1 = A(0), s2 = A(0), t1 = A(0), t2 = A(0);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (plane_lane() + u * 32 < SV) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A d = convert<A>(a[u].v[j]) - k, e = convert<A>(b[u].v[j]) - k2;
            s1 += d;
            s2 += d * d;
            t1 += e;
            t2 += e * e;
          }
        }
      keep_plane(slot, count, p, warp_sum(static_cast<double>(s1)), warp_sum(static_cast<double>(s2)));
      keep_plane(slot, count, p2, warp_sum(static_cast<double>(t1)), warp_sum(static_cast<double>(t2)));
    }
  }
  #pragma unroll 1
  for (; p < P; p += W) {
    const int64_t c = p % s.C;
    const A k = convert<A>(x[c * s.S]);
    A s1 = A(0), s2 = A(0);
    plane_stats<T, V, 4, A>(x + p * s.S, SV, k, s1, s2);
    keep_plane(slot, count, p, warp_sum(static_cast<double>(s1)), warp_sum(static_cast<double>(s2)));
  }
  if (count > 0) flush_planes(slot, count, s, part, tickets, fin);
}

template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kPlaneThreads, kPlaneBlocksNorm)
    bn_normalize_planes(const T* __restrict__ x, BnShape s, BnChannels ch, T* __restrict__ y) {
  using A = bn_t<T>;
  constexpr int U = kPlaneU<Act>;
  const int64_t P = s.N * s.C, SV = s.S / V, W = plane_warps();
  #pragma unroll 1
  for (int64_t k = plane_warp(); k < P; k += W) {
    const int64_t p = P - 1 - k, c = p % s.C, base = p * s.S;
    double a, b;
    affine_of(ch, c, a, b);
    const A sc = static_cast<A>(a), sh = static_cast<A>(b);
    #pragma unroll 1
    for (int64_t i0 = plane_lane(); i0 < SV; i0 += 32 * U) {
      Pack<T, V> q[U], r[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + u * 32 < SV) {
          const int64_t o = base + (i0 + u * 32) * V;
          q[u] = plane_load<T, V>(x + o);
          r[u] = plane_res<Act, T, V>(ch, o);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + u * 32 < SV) {
          Pack<T, V> o;
#pragma unroll
          for (int j = 0; j < V; ++j) o.v[j] = bn_out<Act, T>(convert<A>(q[u].v[j]), sc, sh, r[u].v[j]);
          plane_store<T, V>(y + base + (i0 + u * 32) * V, o);
        }
    }
  }
}

// Sums of g' and g' * (x - mean) (the latter when x is given) a plane, finalised by the channel's last warp.
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kPlaneThreads, kPlaneBlocksRed)
    bn_bwd_reduce_planes(const T* __restrict__ gr, const T* __restrict__ x, BnShape s, BnChannels ch,
                         double* __restrict__ part, unsigned* __restrict__ tickets, BnBackwardSums out) {
  using A = bn_t<T>;
  constexpr int U = kPlaneU<Act>;
  const int64_t P = s.N * s.C, SV = s.S / V, W = plane_warps();
  auto fin = [&](int64_t c) { bwd_finalize_channel(part, static_cast<int>(s.N), s.C, ch.invstd, out, c); };
  PlaneSlot slot;
  int count = 0;
  #pragma unroll 1
  for (int64_t p = plane_warp(); p < P; p += W) {
    const int64_t c = p % s.C, base = p * s.S;
    const A mu = x ? static_cast<A>(ch.mean[c]) : A(0);
    A sc = A(0), sh = A(0);
    if constexpr (Act != BnAct::none) {
      double a, b;
      affine_of(ch, c, a, b);
      sc = static_cast<A>(a);
      sh = static_cast<A>(b);
    }
    A s1 = A(0), s2 = A(0);
    #pragma unroll 1
    for (int64_t i0 = plane_lane(); i0 < SV; i0 += 32 * U) {
      Pack<T, V> gp[U], xp[U], rp[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + u * 32 < SV) {
          const int64_t o = base + (i0 + u * 32) * V;
          gp[u] = plane_load<T, V>(gr + o);
          if (x) xp[u] = plane_load<T, V>(x + o);
          rp[u] = plane_res<Act, T, V>(ch, o);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + u * 32 < SV) {
          if (x) {
#pragma unroll
            for (int j = 0; j < V; ++j) {
              const A xa = convert<A>(xp[u].v[j]);
              const A ga = bn_masked_g<Act, T>(convert<A>(gp[u].v[j]), xa, sc, sh, rp[u].v[j]);
              s1 += ga;
              s2 += ga * (xa - mu);
            }
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) s1 += convert<A>(gp[u].v[j]);
          }
        }
    }
    keep_plane(slot, count, p, warp_sum(static_cast<double>(s1)), warp_sum(static_cast<double>(s2)));
  }
  if (count > 0) flush_planes(slot, count, s, part, tickets, fin);
}

// dx (and the residual's gradient) a plane, from the last plane down; x is read in train mode and whenever
// Act masks g (otherwise it may be null).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kPlaneThreads, kPlaneBlocksRed)
    bn_dx_planes(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, BnShape s, BnChannels ch,
                 const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat, T* __restrict__ gx) {
  using A = bn_t<T>;
  constexpr int U = kPlaneU<Act>;
  const bool read_x = mode == BnMode::train || Act != BnAct::none;
  const int64_t P = s.N * s.C, SV = s.S / V, W = plane_warps();
  const double inv_m = 1.0 / static_cast<double>(s.N * s.S);
  #pragma unroll 1
  for (int64_t k = plane_warp(); k < P; k += W) {
    const int64_t p = P - 1 - k, c = p % s.C, base = p * s.S;
    const DxCoef dc = dx_coef_of(mode, ch, sum_g, sum_gxhat, inv_m, c);
    const A ca = static_cast<A>(dc.a), cb = static_cast<A>(dc.b), ck = static_cast<A>(dc.k), cm = static_cast<A>(dc.m);
    A sc = A(0), sh = A(0);
    if constexpr (Act != BnAct::none) {
      double a, b;
      affine_of(ch, c, a, b);
      sc = static_cast<A>(a);
      sh = static_cast<A>(b);
    }
    #pragma unroll 1
    for (int64_t i0 = plane_lane(); i0 < SV; i0 += 32 * U) {
      Pack<T, V> gp[U], xp[U], rp[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        xp[u] = Pack<T, V>{};
        if (i0 + u * 32 < SV) {
          const int64_t o = base + (i0 + u * 32) * V;
          gp[u] = plane_load<T, V>(gr + o);
          if (read_x) xp[u] = plane_load<T, V>(x + o);
          rp[u] = plane_res<Act, T, V>(ch, o);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + u * 32 < SV) {
          const int64_t o = base + (i0 + u * 32) * V;
          Pack<T, V> yv, ev;
#pragma unroll
          for (int j = 0; j < V; ++j)
            dx_elem<Act, T, A>(mode, gp[u].v[j], xp[u].v[j], rp[u].v[j], ca, cb, ck, cm, sc, sh, yv.v[j], ev.v[j]);
          plane_store<T, V>(gx + o, yv);
          if constexpr (Act == BnAct::add_relu) plane_store<T, V>(static_cast<T*>(ch.residual_grad) + o, ev);
        }
    }
  }
}

// Launches of the plane kernels (bn_plane_launches).
std::atomic<int64_t> g_plane_launches{0};

// The grid of a plane-kernel launch (one wave of blocks_per_sm blocks a SM, at most one warp a plane);
// counts the launch.
unsigned plane_grid(const BnShape& s, int blocks_per_sm) {
  g_plane_launches.fetch_add(1, std::memory_order_relaxed);
  return static_cast<unsigned>(
      std::min<int64_t>(int64_t{132} * blocks_per_sm, (s.N * s.C + kPlaneWarps - 1) / kPlaneWarps));
}

}  // namespace

// Whether the plane kernels take x (N, C, S > 1) under the current variant (tickets are taken separately).
bool use_planes(const BnShape& s) {
  return bn_cf_variant() == 2 && s.S >= kPlaneMinS && s.N * s.C >= kPlaneMinPlanes &&
         s.N * s.C <= kPlaneMaxPlanes && s.C <= kTicketSlot;
}

bool stats_planes(const StatsArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  bool launched = false;
  visit_bn(a.dt, s, {a.x}, [&](auto tag, auto vtag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    const T* xp = static_cast<const T*>(a.x);
    if (unsigned* tickets = bn_tickets(s.C, stream)) {
      const Scratch part(part_bytes(static_cast<unsigned>(s.N), s.C), stream);
      const unsigned blocks = plane_grid(s, kPlaneBlocksRed);
      bn_stats_planes<T, V><<<blocks, kPlaneThreads, 0, stream>>>(xp, s, part.get(), tickets, a.eps, a.running,
                                                                  a.mean, a.invstd);
      HT_CHECK_LAUNCH("bn_stats_planes");
      launched = true;
    }
  });
  return launched;
}

bool bwd_reduce_planes(const ReduceArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  bool launched = false;
  visit_bn_act(a.dt, s, {a.g, a.x, ch.residual}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const T* gp = static_cast<const T*>(a.g);
    const T* xp = static_cast<const T*>(a.x);
    if (unsigned* tickets = bn_tickets(s.C, stream)) {
      const Scratch part(part_bytes(static_cast<unsigned>(s.N), s.C), stream);
      const unsigned blocks = plane_grid(s, kPlaneBlocksRed);
      bn_bwd_reduce_planes<Act, T, V><<<blocks, kPlaneThreads, 0, stream>>>(gp, xp, s, ch, part.get(), tickets,
                                                                             a.out);
      HT_CHECK_LAUNCH("bn_bwd_reduce_planes");
      launched = true;
    }
  });
  return launched;
}

void normalize_planes(const NormalizeArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  visit_bn_act(a.dt, s, {a.x, a.y, ch.residual}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const unsigned blocks = plane_grid(s, kPlaneBlocksNorm);
    bn_normalize_planes<Act, T, V><<<blocks, kPlaneThreads, 0, stream>>>(static_cast<const T*>(a.x), s, ch,
                                                                        static_cast<T*>(a.y));
  });
}

void dx_planes(const DxArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  visit_bn_act(a.dt, s, {a.g, a.x, a.gx, ch.residual, ch.residual_grad}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const unsigned blocks = plane_grid(s, kPlaneBlocksRed);
    bn_dx_planes<Act, T, V><<<blocks, kPlaneThreads, 0, stream>>>(a.mode, static_cast<const T*>(a.g),
                                                                   static_cast<const T*>(a.x), s, ch, a.sum_g,
                                                                   a.sum_gxhat, static_cast<T*>(a.gx));
  });
}

}  // namespace ht::kernels::bn

namespace ht::kernels {

int64_t bn_plane_launches() { return bn::g_plane_launches.load(std::memory_order_relaxed); }

}  // namespace ht::kernels
