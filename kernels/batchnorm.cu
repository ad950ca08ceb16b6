// Batch-norm kernels: train statistics with the running-stat update, eval invstd, normalise + affine, and
// the backward (per-channel sums of g and g * x_hat, then dx). Formulas follow the CPU reference
// (src/ops/batch_norm.cpp) and its op-based backward node.
//
// Two layouts of x (N, C, S), each with its own grid so that every access is coalesced and no element
// needs a 64-bit division:
//  - channels last (S == 1, x is an (M, C) matrix, e.g. an NHWC activation viewed as (N*H*W, C)): a 2-D
//    block, threadIdx.x along C (one 16-byte pack of V channels per thread), threadIdx.y along rows;
//    blockIdx.x tiles C, blockIdx.y splits the rows. A thread keeps its channels' constants (or sums) in
//    registers.
//  - channels first (S > 1): blockIdx.x is the channel, blockIdx.y splits the channel's N*S values; a
//    block walks (n, s) with 16-byte packs along s (when S is a multiple of the pack) and a 32-bit
//    multiply-shift division by S/V.
// Reductions (statistics and the backward sums) write per-block partial sums in double to a scratch
// buffer ((splits, 2, C)); a finalize kernel adds them in a fixed order (one warp per channel), so results
// are deterministic. Statistics are one pass: sums of (x - K) and (x - K)^2 with K = the channel's first
// value (a sample of the data, so the shifted sums do not cancel), var = E[(x-K)^2] - E[x-K]^2.
// Arithmetic: per-thread sums (and the in-block column sums of the channels-last kernels) and the elementwise
// maps run in float for bf16/f16 and in double for f32/f64; per-block partial sums, statistics and
// per-channel constants are double. Weight, bias and running stats are read in their own dtype (BnParam).
// Fused ReLU (BnAct::relu): the forward writes relu(round(x * scale + shift)); the backward recomputes the
// same value from x with the same per-channel constants and the same fma (bn_affine), so its mask
// (round(v) > 0) is exactly the forward's, and masks g before the sums and dx. BnAct::add_relu adds a
// residual r (x's layout) before the relu, as the add op rounds it; its backward reads r for the mask and
// writes r's gradient (the masked g) next to dx.
// Note [Batch-norm kernels]: the channels-first reductions are finalised by their last block (an atomic
// ticket per channel, bn_tickets; no finalize launch), with bn_*_cf_split + the finalize kernel as the
// fallback when there are no tickets (C > kTicketSlot, or the first use inside a graph capture); both add the
// same partial sums in the same order. The normalize / dx passes walk each block's range backwards (walk: they
// first read what the reduction just read, still in L2). Channels-first kernels are compiled for 8 resident
// 256-thread blocks per SM (6 for dx and sums with a fused activation), channels-last ones for 4 (3 for dx
// and for sums with a fused activation), channels-last grids being one wave of those. (Measured against the
// previous kernels on an H200, bf16: equal or faster on every benchmarked shape; docs/cuda_backend.md.)
// Note [Batch-norm plane kernels]: channels-first variants (bn_cf_variant(), HADATRAIN_BN_CF_KERNEL; variant 1
// is the split grids above; variant 3, the default since run 22, is variant 1 with 16-byte stores). Variant 2 (planes): x (N, C, S) is read as
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
// Channels-last reduction variant 2 (tickets; Note [Batch-norm channels-last tickets]) is the default from 128
// channels up (cl_variant_for; run 24). Helper bn12's channels-first variant 4 (deeper reductions) lost to
// variant 3 in run 24 and was deleted.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "kernels/batchnorm.h"
#include "kernels/variant.h"
#include "kernels/map.cuh"  // Pack, kVec, convert

namespace ht::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTargetBlocks = 132 * 8;  // about one wave of resident 256-thread blocks on an H200
// Channels-last grids: one wave of the 4 blocks per SM their launch bounds allow (half the partial
// rows of kTargetBlocks, the channels-first target, for the finalize kernel to add).
constexpr int64_t kTargetBlocksCl = 132 * 4;
// Resident blocks per SM of the channels-last backward kernels (fewer registers would spill): dx 3,
// the sums 4 (3 with a fused activation, which needs the forward's constants too).
template <BnAct Act>
inline constexpr int kClBlocks = Act == BnAct::none ? 4 : 3;
constexpr int64_t kTargetBlocksClDx = 132 * 3;

// Arithmetic type of the per-element work: float for the 16-bit types, double otherwise.
template <class T>
using bn_t = std::conditional_t<sizeof(T) == 2, float, double>;

template <class T, int V>
HT_DEV Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <class T, int V>
HT_DEV void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}
// 16-byte packs moved as uint4 (one 16-byte load / store instruction whatever the element type's copy
// lowering; narrower packs as they are).
template <class T, int V>
HT_DEV Pack<T, V> plane_load(const T* p) {
  if constexpr (sizeof(Pack<T, V>) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    Pack<T, V> v;
    memcpy(&v, &u, 16);
    return v;
  } else {
    return load_pack<T, V>(p);
  }
}
// The 16-byte store is spelled in PTX: with a plain uint4 store NVVM still split variant 3's into 2 x 2-byte
// st.global.v2.u16 (its alignment of the address gets lost through the index arithmetic).
template <class T, int V>
HT_DEV void plane_store(T* p, const Pack<T, V>& v) {
  if constexpr (sizeof(Pack<T, V>) == 16) {
    uint4 u;
    memcpy(&u, &v, 16);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
                 : "memory");
  } else {
    store_pack<T, V>(p, v);
  }
}
// Variant 3's stores (Note [Batch-norm plane kernels]): VS, 16-byte packs as uint4; else store_pack.
template <bool VS, class T, int V>
HT_DEV void cf_store(T* p, const Pack<T, V>& v) {
  if constexpr (VS) plane_store<T, V>(p, v);
  else store_pack<T, V>(p, v);
}
template <BnAct Act, class T, int V>
HT_DEV Pack<T, V> plane_res(const BnChannels& ch, int64_t o) {
  if constexpr (Act == BnAct::add_relu) return plane_load<T, V>(static_cast<const T*>(ch.residual) + o);
  else return Pack<T, V>{};
}

template <class T, class A>
HT_DEV T bn_store(A v) {
  return store_cast<T>(v);
}

HT_DEV double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a 1-D block of kThreads threads; thread 0 gets the result.
HT_DEV double block_sum(double v, double* scratch /* 32 */) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    v = lane < kThreads / 32 ? scratch[lane] : 0.0;
    v = warp_sum(v);
  }
  return v;
}

// Channels-last column sums: adds s1 and s2 (V values each) over the blockDim.y threads of every column
// (a fixed tree over threadIdx.y, all V values per step) and writes them as double to part (splits, 2, C)
// at split blockIdx.y, channels cv * V ... Every thread of the block must call it.
template <class A, int V>
HT_DEV void column_sums_to(const A (&s1)[V], const A (&s2)[V], A* red /* [2][V][kThreads] */, int64_t cv,
                           int64_t CV, int64_t C, double* part) {
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int tid = ty * TX + tx;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    red[(0 * V + j) * kThreads + tid] = s1[j];
    red[(1 * V + j) * kThreads + tid] = s2[j];
  }
  __syncthreads();
  int top = 1;
  while (top < TY) top <<= 1;
  for (int st = top / 2; st > 0; st >>= 1) {
    if (ty < st && ty + st < TY) {
#pragma unroll
      for (int j = 0; j < 2 * V; ++j) red[j * kThreads + tid] += red[j * kThreads + tid + st * TX];
    }
    __syncthreads();
  }
  if (ty == 0 && cv < CV) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t c = cv * V + j;
      part[(static_cast<int64_t>(blockIdx.y) * 2) * C + c] = static_cast<double>(red[(0 * V + j) * kThreads + tx]);
      part[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * C + c] = static_cast<double>(red[(1 * V + j) * kThreads + tx]);
    }
  }
}

// ---- launch geometry ------------------------------------------------------------------------------------

// Channels last: x (M, C), C = CV packs of V.
struct ClGrid {
  int64_t CV = 0;
  int64_t rows_per_block = 0;
  dim3 block, grid;
};

ClGrid cl_grid(int64_t M, int64_t C, int V, int64_t target_blocks) {
  ClGrid g;
  g.CV = C / V;
  const int tx = static_cast<int>(std::min<int64_t>(g.CV, kThreads));
  const int ty = kThreads / tx;
  g.block = dim3(tx, ty);
  const int64_t gx = (g.CV + tx - 1) / tx;
  const int64_t target = std::max<int64_t>(1, target_blocks / gx);
  int64_t rpb = std::max<int64_t>((M + target - 1) / target, 2 * ty);  // at least two rows per thread
  rpb = std::max<int64_t>(rpb, (M + 65534) / 65535);
  const int64_t gy = std::max<int64_t>(1, (M + rpb - 1) / rpb);
  g.rows_per_block = rpb;
  g.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  return g;
}

// Channels first: channel c's values are N planes of S; SV = S / V packs per plane.
struct CfGrid {
  int64_t SV = 0, per_channel = 0, chunk = 0;  // packs per plane, per channel, per block
  FastDiv div_sv;
  bool fast = false;  // per_channel < 2^31: FastDiv applies
  dim3 grid;
};

CfGrid cf_grid(const BnShape& s, int V) {
  CfGrid g;
  g.SV = s.S / V;
  g.per_channel = s.N * g.SV;
  g.fast = g.per_channel < (int64_t{1} << 31) && g.SV < (int64_t{1} << 31);
  if (g.fast) g.div_sv = FastDiv(static_cast<uint32_t>(std::max<int64_t>(g.SV, 1)));
  int64_t splits = std::max<int64_t>(1, kTargetBlocks / std::max<int64_t>(s.C, 1));
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, g.per_channel / (kThreads * 4)));  // >= 4 packs a thread
  splits = std::min<int64_t>(splits, 65535);
  g.chunk = std::max<int64_t>(1, (g.per_channel + splits - 1) / splits);
  const int64_t gy = std::max<int64_t>(1, (g.per_channel + g.chunk - 1) / g.chunk);
  g.grid = dim3(static_cast<unsigned>(s.C), static_cast<unsigned>(gy));
  return g;
}

// Element offset of pack j (of channel c) in x (N, C, S).
HT_DEV int64_t cf_offset(const BnShape& s, const CfGrid& g, int64_t c, int64_t j, int V) {
  int64_t n, sv;
  if (g.fast) {
    const uint32_t q = g.div_sv.div(static_cast<uint32_t>(j));
    n = q;
    sv = j - static_cast<int64_t>(q) * g.SV;
  } else {
    n = j / g.SV;
    sv = j - n * g.SV;
  }
  return (n * s.C + c) * s.S + sv * V;
}

// The items first + k * step (k >= 0) below hi of one thread, two at a time (two(i, j) loads both before
// computing) and a last single one, walking the block's units of `step` items (unit u = [lo + u * step,
// lo + (u + 1) * step), first - lo < step) from the top down, so that an elementwise pass after a reduction
// over the same range first reads what the reduction read last (still in L2).
template <class Two, class One>
HT_DEV void walk(int64_t lo, int64_t first, int64_t hi, int64_t step, Two two, One one) {
  int64_t u = (hi - lo + step - 1) / step - 1;  // the top unit (possibly partial)
  for (; u >= 1; u -= 2) {
    const int64_t i = first + u * step;
    if (i < hi) two(i, i - step);
    else one(i - step);
  }
  if (u == 0 && first < hi) one(first);
}

// ---- per-channel constants ------------------------------------------------------------------------------

// Value c of a per-channel parameter as double, or dflt when absent.
HT_DEV double param_at(const BnParam& p, int64_t c, double dflt) {
  if (!p.data) return dflt;
  switch (p.dtype) {
    case DType::f64: return static_cast<const double*>(p.data)[c];
    case DType::bf16: return to_double(static_cast<const bf16*>(p.data)[c]);
    case DType::f16: return to_double(static_cast<const f16*>(p.data)[c]);
    default: return to_double(static_cast<const float*>(p.data)[c]);
  }
}
HT_DEV void param_store(void* data, DType dt, int64_t c, double v) {
  switch (dt) {
    case DType::f64: static_cast<double*>(data)[c] = v; break;
    case DType::bf16: static_cast<bf16*>(data)[c] = convert<bf16>(v); break;
    case DType::f16: static_cast<f16*>(data)[c] = convert<f16>(v); break;
    default: static_cast<float*>(data)[c] = convert<float>(v); break;
  }
}

// y = x * scale + shift.
HT_DEV void affine_of(const BnChannels& ch, int64_t c, double& scale, double& shift) {
  const double w = param_at(ch.weight, c, 1.0), b = param_at(ch.bias, c, 0.0);
  scale = ch.invstd[c] * w;
  shift = b - ch.mean[c] * scale;
}

// The forward's per-element map before the activation, one explicit fma so that forward and backward (which
// recomputes it for the ReLU mask) round identically.
template <class A>
HT_DEV A bn_affine(A x, A scale, A shift) {
  if constexpr (std::is_same_v<A, float>) return __fmaf_rn(x, scale, shift);
  else return __fma_rn(x, scale, shift);
}
// The value the activation sees: round(x * scale + shift), plus the residual r (add_relu) added as the add op
// does (in acc_t<T>, rounded to T).
template <BnAct Act, class T, class A>
HT_DEV T bn_pre(A x, A scale, A shift, T r) {
  const T y = bn_store<T>(bn_affine(x, scale, shift));
  if constexpr (Act == BnAct::add_relu) {
    using R = acc_t<T>;
    return store_cast<T>(convert<R>(y) + convert<R>(r));
  } else {
    return y;
  }
}
// The forward's output element: act(bn_pre).
template <BnAct Act, class T, class A>
HT_DEV T bn_out(A x, A scale, A shift, T r) {
  const T y = bn_pre<Act, T>(x, scale, shift, r);
  if constexpr (Act != BnAct::none) {
    const A v = convert<A>(y);
    return (v > A(0) || v != v) ? y : T(0.0f);  // NaN propagates, as relu does
  } else {
    return y;
  }
}
// g times the fused relu's derivative (bn_pre > 0 ? 1 : 0), a product as relu's own backward forms it (so a
// non-finite g gives the same NaN).
template <BnAct Act, class T, class A>
HT_DEV A bn_masked_g(A g, A x, A scale, A shift, T r) {
  if constexpr (Act != BnAct::none) return g * (convert<A>(bn_pre<Act, T>(x, scale, shift, r)) > A(0) ? A(1) : A(0));
  else return g;
}
// The residual's pack at element offset o (add_relu), or zeros.
template <BnAct Act, class T, int V>
HT_DEV Pack<T, V> load_res(const BnChannels& ch, int64_t o) {
  if constexpr (Act == BnAct::add_relu) return load_pack<T, V>(static_cast<const T*>(ch.residual) + o);
  else return Pack<T, V>{};
}

// gx = g * a + (x - m) * b + k (train) or g * a (eval; b = k = 0).
struct DxCoef {
  double a, b, k, m;
};
HT_DEV DxCoef dx_coef_of(BnMode mode, const BnChannels& ch, const double* sum_g, const double* sum_gxhat,
                         double inv_m, int64_t c) {
  const double w = param_at(ch.weight, c, 1.0), is = ch.invstd[c];
  DxCoef r{w * is, 0.0, 0.0, 0.0};
  if (mode == BnMode::train) {
    r.b = -w * is * is * sum_gxhat[c] * inv_m;
    r.k = -w * is * sum_g[c] * inv_m;
    r.m = ch.mean[c];
  }
  return r;
}

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

HT_DEV void stats_finalize_channel(const double* part, int splits, double k, int64_t C, int64_t M, double eps,
                                   const BnRunning& running, double* mean, double* invstd, int64_t c);
HT_DEV void stats_write(double a1, double a2, double k, int64_t M, double eps, const BnRunning& running, double* mean,
                        double* invstd, int64_t c);
HT_DEV bool last_block_of_channel(unsigned* tickets, int64_t c);

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

// Adds the partial sums of channel c (one warp per channel, lanes over the splits, a fixed order).
HT_DEV void finalize_sums(const double* part, int splits, int64_t C, int64_t c, double& a1, double& a2) {
  const int lane = threadIdx.x % 32;
  a1 = 0.0;
  a2 = 0.0;
  // __ldcg: written by other blocks of the same kernel (Fin). Unrolled: 8 loads of a lane in flight, added
  // in the same order.
#pragma unroll 8
  for (int y = lane; y < splits; y += 32) {
    a1 += __ldcg(part + (static_cast<int64_t>(y) * 2) * C + c);
    a2 += __ldcg(part + (static_cast<int64_t>(y) * 2 + 1) * C + c);
  }
  a1 = warp_sum(a1);
  a2 = warp_sum(a2);
}

// The ticket: called by every thread of a block after thread 0 wrote the block's partial sums of
// channel c; true in every thread of the last block of the channel to get here, which has reset the ticket
// for the next launch. The fences order the partial-sum stores before the ticket and the last block's reads
// after it (the threadFenceReduction pattern).
HT_DEV bool last_block_of_channel(unsigned* tickets, int64_t c) {
  __shared__ bool last;
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    const unsigned t = atomicAdd(tickets + c, 1u);
    last = t == gridDim.y - 1;
    if (last) {
      tickets[c] = 0u;  // every block of this launch has taken its ticket
      __threadfence();
    }
  }
  __syncthreads();
  return last;
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

// One warp: channel c's statistics from the partial sums of (x - k) and (x - k)^2 (lane 0 writes).
HT_DEV void stats_finalize_channel(const double* part, int splits, double k, int64_t C, int64_t M, double eps,
                                   const BnRunning& running, double* mean, double* invstd, int64_t c) {
  double a1, a2;
  finalize_sums(part, splits, C, c, a1, a2);
  if (threadIdx.x % 32 != 0) return;
  stats_write(a1, a2, k, M, eps, running, mean, invstd, c);
}

// Channel c's statistics from its sums a1, a2 of (x - k) and (x - k)^2 (one thread).
HT_DEV void stats_write(double a1, double a2, double k, int64_t M, double eps, const BnRunning& running, double* mean,
                        double* invstd, int64_t c) {
  const double m = static_cast<double>(M);
  const double d = a1 / m;
  double var = a2 / m - d * d;  // biased
  if (var < 0.0) var = 0.0;
  const double mu = k + d;
  mean[c] = mu;
  invstd[c] = 1.0 / sqrt(var + eps);
  if (running.mean) {
    const double mo = running.momentum, unbias = m / (m - 1.0);
    const double rm = param_at(BnParam{running.mean, running.dtype}, c, 0.0);
    const double rv = param_at(BnParam{running.var, running.dtype}, c, 0.0);
    param_store(running.mean, running.dtype, c, (1.0 - mo) * rm + mo * mu);
    param_store(running.var, running.dtype, c, (1.0 - mo) * rv + mo * var * unbias);
  }
}

__global__ void bn_eval_stats_kernel(BnParam running_mean, BnParam running_var, int64_t C, double eps,
                                     double* __restrict__ mean, double* __restrict__ invstd) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    mean[c] = param_at(running_mean, c, 0.0);
    invstd[c] = 1.0 / sqrt(param_at(running_var, c, 1.0) + eps);
  }
}

// ---- normalize ------------------------------------------------------------------------------------------

template <BnAct Act, class T, int V>
HT_DEV void bn_normalize_cl_body(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, BnChannels ch,
                                T* __restrict__ y) {
  using A = bn_t<T>;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= g.CV) return;
  A sc[V], sh[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    double a, b;
    affine_of(ch, cv * V + j, a, b);
    sc[j] = static_cast<A>(a);
    sh[j] = static_cast<A>(b);
  }
  const int TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  const T* xc = x + cv * V;
  T* yc = y + cv * V;
  walk(
      r0, r0 + threadIdx.y, r1, TY,
      [&](int64_t r, int64_t q2) {
        const Pack<T, V> p = load_pack<T, V>(xc + r * C), q = load_pack<T, V>(xc + q2 * C);
        const Pack<T, V> rp = load_res<Act, T, V>(ch, cv * V + r * C), rq = load_res<Act, T, V>(ch, cv * V + q2 * C);
        Pack<T, V> o, u;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          o.v[j] = bn_out<Act, T>(convert<A>(p.v[j]), sc[j], sh[j], rp.v[j]);
          u.v[j] = bn_out<Act, T>(convert<A>(q.v[j]), sc[j], sh[j], rq.v[j]);
        }
        store_pack<T, V>(yc + r * C, o);
        store_pack<T, V>(yc + q2 * C, u);
      },
      [&](int64_t r) {
        const Pack<T, V> p = load_pack<T, V>(xc + r * C), rp = load_res<Act, T, V>(ch, cv * V + r * C);
        Pack<T, V> o;
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = bn_out<Act, T>(convert<A>(p.v[j]), sc[j], sh[j], rp.v[j]);
        store_pack<T, V>(yc + r * C, o);
      });
}
// Compiled for 4 resident blocks per SM (its grid: one wave of them, cl_grid's kTargetBlocksCl).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, 4)
    bn_normalize_cl(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, BnChannels ch, T* __restrict__ y) {
  bn_normalize_cl_body<Act, T, V>(x, M, C, g, ch, y);
}

template <BnAct Act, class T, int V, bool VS>
HT_DEV void bn_normalize_cf_body(const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch, T* __restrict__ y) {
  using A = bn_t<T>;
  const int64_t c = blockIdx.x;
  double a, b;
  affine_of(ch, c, a, b);
  const A sc = static_cast<A>(a), sh = static_cast<A>(b);
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * g.chunk, j1 = std::min(g.per_channel, j0 + g.chunk);
  walk(
      j0, j0 + threadIdx.x, j1, kThreads,
      [&](int64_t ja, int64_t jb) {
        const int64_t o0 = cf_offset(s, g, c, ja, V), o1 = cf_offset(s, g, c, jb, V);
        const Pack<T, V> p = load_pack<T, V>(x + o0), q = load_pack<T, V>(x + o1);
        const Pack<T, V> rp = load_res<Act, T, V>(ch, o0), rq = load_res<Act, T, V>(ch, o1);
        Pack<T, V> o, u;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          o.v[k] = bn_out<Act, T>(convert<A>(p.v[k]), sc, sh, rp.v[k]);
          u.v[k] = bn_out<Act, T>(convert<A>(q.v[k]), sc, sh, rq.v[k]);
        }
        cf_store<VS, T, V>(y + o0, o);
        cf_store<VS, T, V>(y + o1, u);
      },
      [&](int64_t ja) {
        const int64_t o0 = cf_offset(s, g, c, ja, V);
        const Pack<T, V> p = load_pack<T, V>(x + o0), rp = load_res<Act, T, V>(ch, o0);
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = bn_out<Act, T>(convert<A>(p.v[k]), sc, sh, rp.v[k]);
        cf_store<VS, T, V>(y + o0, o);
      });
}
// Compiled for 8 resident blocks per SM.
// VS: variant 3 (16-byte stores).
template <BnAct Act, class T, int V, bool VS = false>
__global__ void __launch_bounds__(kThreads, 8)
    bn_normalize_cf(const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch, T* __restrict__ y) {
  bn_normalize_cf_body<Act, T, V, VS>(x, s, g, ch, y);
}

// ---- backward sums --------------------------------------------------------------------------------------

// The mean (mu) and, with a fused activation, the forward's per-channel scale / shift (sc, sh: what
// bn_masked_g recomputes y from) of the V channels col.. , in the compute type A (the channels-last reductions).
template <BnAct Act, class A, int V>
HT_DEV void bn_channel_consts(const BnChannels& ch, int64_t col, A (&mu)[V], A (&sc)[V], A (&sh)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mu[j] = static_cast<A>(ch.mean[col + j]);
    if constexpr (Act != BnAct::none) {
      double a, b;
      affine_of(ch, col + j, a, b);
      sc[j] = static_cast<A>(a);
      sh[j] = static_cast<A>(b);
    }
  }
}

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

HT_DEV void bwd_finalize_channel(const double* part, int splits, int64_t C, const double* invstd,
                                 const BnBackwardSums& out, int64_t c);
HT_DEV void bwd_write(double a1, double a2, const double* invstd, const BnBackwardSums& out, int64_t c);

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

// One warp: channel c's backward sums (lane 0 writes).
HT_DEV void bwd_finalize_channel(const double* part, int splits, int64_t C, const double* invstd,
                                 const BnBackwardSums& out, int64_t c) {
  double a1, a2;
  finalize_sums(part, splits, C, c, a1, a2);
  if (threadIdx.x % 32 != 0) return;
  bwd_write(a1, a2, invstd, out, c);
}

// Channel c's backward sums from a1 = sum g', a2 = sum g' * (x - mean) (one thread).
HT_DEV void bwd_write(double a1, double a2, const double* invstd, const BnBackwardSums& out, int64_t c) {
  const double sgx = a2 * invstd[c];
  if (out.sum_g) out.sum_g[c] = a1;
  if (out.sum_gxhat) out.sum_gxhat[c] = sgx;
  if (out.grad_bias.data) param_store(out.grad_bias.data, out.grad_bias.dtype, c, a1);
  if (out.grad_weight.data) param_store(out.grad_weight.data, out.grad_weight.dtype, c, sgx);
}

// ---- channels-last reductions, variant 2 (Note [Batch-norm channels-last tickets]) ---------------------
// Note [Batch-norm channels-last tickets]: bn_stats_cl2 / bn_bwd_reduce_cl2 read x (M, C) in variant 1's block
// shape (threadIdx.x along C, one pack of V channels a thread; threadIdx.y along rows) with a grid of one wave
// of kCl2Blocks blocks a SM, and kCl2U 16-byte packs of a thread in flight (the sums: kCl2U / 2 rows of g and
// x; variant 1 had 4 packs of x, 2 rows of g and x, at 4 blocks a SM: 64 B a thread, 2x less). The tail rows
// of a thread go through the same guarded batch. The block's rows are added with shuffles inside each warp
// (when blockDim.x is a power of two below 32: 32 / blockDim.x rows a warp), then over the warps in shared
// memory in a fixed order (variant 1: a shared-memory tree with a barrier per level), and written as one
// double partial row (gy, 2, C). No finalize launch: the partial rows of a column of blocks (blockIdx.x) are
// added in two ticket levels: the last block of each group of `group` consecutive rows (about sqrt(gy)) adds
// them (a thread a channel, all loads in flight) to a group row (groups, 2, C); the last group to finish adds
// the group rows and writes the statistics / sums. Variant 1's finalize kernel instead read all 2 * gy * C
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

// ---- dx -------------------------------------------------------------------------------------------------

// One element: with g' = the masked g, gx = g' * a + ((x - m) * b + k) (train) or g' * a (eval); the
// residual's gradient (add_relu) is g'.
template <BnAct Act, class T, class A>
HT_DEV void dx_elem(BnMode mode, T gv, T xv, T rv, A ca, A cb, A ck, A cm, A sc, A sh, T& gx, T& gres) {
  const A x = convert<A>(xv);
  const A gm = bn_masked_g<Act, T>(convert<A>(gv), x, sc, sh, rv);
  gx = mode == BnMode::train ? bn_store<T>(gm * ca + ((x - cm) * cb + ck)) : bn_store<T>(gm * ca);
  if constexpr (Act == BnAct::add_relu) gres = bn_store<T>(gm);
}

template <BnAct Act, class T, int V, bool VS = false>
HT_DEV void store_res_grad(const BnChannels& ch, int64_t o, const Pack<T, V>& v) {
  if constexpr (Act == BnAct::add_relu) cf_store<VS, T, V>(static_cast<T*>(ch.residual_grad) + o, v);
}

// Two element offsets o0, o1 (pair) or one (single) of dx: loads, dx_elem, stores.
template <BnAct Act, class T, int V, class A, bool VS = false>
struct DxPacks {
  BnMode mode;
  bool read_x;
  const T* __restrict__ gr;
  const T* __restrict__ x;
  T* __restrict__ gx;
  const BnChannels& ch;
  HT_DEV void pair(int64_t o0, int64_t o1, const A* ca, const A* cb, const A* ck, const A* cm, const A* sc,
                   const A* sh, int cs /* 1: per-element constants (channels last), 0: one set */) const {
    const Pack<T, V> g0 = load_pack<T, V>(gr + o0), g1 = load_pack<T, V>(gr + o1);
    const Pack<T, V> q0 = load_res<Act, T, V>(ch, o0), q1 = load_res<Act, T, V>(ch, o1);
    Pack<T, V> x0{}, x1{};
    if (read_x) {
      x0 = load_pack<T, V>(x + o0);
      x1 = load_pack<T, V>(x + o1);
    }
    Pack<T, V> y0, y1, e0, e1;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = j * cs;
      dx_elem<Act, T, A>(mode, g0.v[j], x0.v[j], q0.v[j], ca[k], cb[k], ck[k], cm[k], sc[k], sh[k], y0.v[j], e0.v[j]);
      dx_elem<Act, T, A>(mode, g1.v[j], x1.v[j], q1.v[j], ca[k], cb[k], ck[k], cm[k], sc[k], sh[k], y1.v[j], e1.v[j]);
    }
    cf_store<VS, T, V>(gx + o0, y0);
    cf_store<VS, T, V>(gx + o1, y1);
    store_res_grad<Act, T, V, VS>(ch, o0, e0);
    store_res_grad<Act, T, V, VS>(ch, o1, e1);
  }
  HT_DEV void single(int64_t o0, const A* ca, const A* cb, const A* ck, const A* cm, const A* sc, const A* sh,
                     int cs) const {
    const Pack<T, V> g0 = load_pack<T, V>(gr + o0), q0 = load_res<Act, T, V>(ch, o0);
    Pack<T, V> x0{};
    if (read_x) x0 = load_pack<T, V>(x + o0);
    Pack<T, V> y0, e0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = j * cs;
      dx_elem<Act, T, A>(mode, g0.v[j], x0.v[j], q0.v[j], ca[k], cb[k], ck[k], cm[k], sc[k], sh[k], y0.v[j], e0.v[j]);
    }
    cf_store<VS, T, V>(gx + o0, y0);
    store_res_grad<Act, T, V, VS>(ch, o0, e0);
  }
};

// x is read in train mode and whenever Act masks g; otherwise it may be null.
template <BnAct Act, class T, int V>
HT_DEV void bn_dx_cl_body(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C,
                         ClGrid g, BnChannels ch, const double* __restrict__ sum_g,
                         const double* __restrict__ sum_gxhat, T* __restrict__ gx) {
  using A = bn_t<T>;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= g.CV) return;
  const int64_t col = cv * V;
  const double inv_m = 1.0 / static_cast<double>(M);
  A ca[V], cb[V], ck[V], cm[V], sc[V], sh[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const DxCoef d = dx_coef_of(mode, ch, sum_g, sum_gxhat, inv_m, col + j);
    ca[j] = static_cast<A>(d.a);
    cb[j] = static_cast<A>(d.b);
    ck[j] = static_cast<A>(d.k);
    cm[j] = static_cast<A>(d.m);
    sc[j] = sh[j] = A(0);
    if constexpr (Act != BnAct::none) {
      double a, b;
      affine_of(ch, col + j, a, b);
      sc[j] = static_cast<A>(a);
      sh[j] = static_cast<A>(b);
    }
  }
  const DxPacks<Act, T, V, A> d{mode, mode == BnMode::train || Act != BnAct::none, gr, x, gx, ch};
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  walk(
      r0, r0 + threadIdx.y, r1, blockDim.y,
      [&](int64_t ra, int64_t rb) { d.pair(col + ra * C, col + rb * C, ca, cb, ck, cm, sc, sh, 1); },
      [&](int64_t ra) { d.single(col + ra * C, ca, cb, ck, cm, sc, sh, 1); });
}
// Compiled for 3 resident blocks per SM (its grid: one wave of them, kTargetBlocksClDx).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, 3)
    bn_dx_cl(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C, ClGrid g,
                BnChannels ch, const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat,
                T* __restrict__ gx) {
  bn_dx_cl_body<Act, T, V>(mode, gr, x, M, C, g, ch, sum_g, sum_gxhat, gx);
}

template <BnAct Act, class T, int V, bool VS>
HT_DEV void bn_dx_cf_body(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g,
                          BnChannels ch, const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat,
                          T* __restrict__ gx) {
  using A = bn_t<T>;
  const int64_t c = blockIdx.x;
  const DxCoef dc = dx_coef_of(mode, ch, sum_g, sum_gxhat, 1.0 / static_cast<double>(s.N * s.S), c);
  const A ca = static_cast<A>(dc.a), cb = static_cast<A>(dc.b), ck = static_cast<A>(dc.k), cm = static_cast<A>(dc.m);
  A sc = A(0), sh = A(0);
  if constexpr (Act != BnAct::none) {
    double a, b;
    affine_of(ch, c, a, b);
    sc = static_cast<A>(a);
    sh = static_cast<A>(b);
  }
  const DxPacks<Act, T, V, A, VS> d{mode, mode == BnMode::train || Act != BnAct::none, gr, x, gx, ch};
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * g.chunk, j1 = std::min(g.per_channel, j0 + g.chunk);
  walk(
      j0, j0 + threadIdx.x, j1, kThreads,
      [&](int64_t ja, int64_t jb) {
        d.pair(cf_offset(s, g, c, ja, V), cf_offset(s, g, c, jb, V), &ca, &cb, &ck, &cm, &sc, &sh, 0);
      },
      [&](int64_t ja) { d.single(cf_offset(s, g, c, ja, V), &ca, &cb, &ck, &cm, &sc, &sh, 0); });
}
// Compiled for 8 (6 with a fused activation) resident blocks per SM.
template <BnAct Act, class T, int V, bool VS = false>
__global__ void __launch_bounds__(kThreads, (Act == BnAct::none ? 8 : 6))
    bn_dx_cf(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch,
                const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat, T* __restrict__ gx) {
  bn_dx_cf_body<Act, T, V, VS>(mode, gr, x, s, g, ch, sum_g, sum_gxhat, gx);
}

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

// ---- host helpers ---------------------------------------------------------------------------------------

// Device scratch memory in `stream`'s order from the device's default memory pool (the pool the caching
// allocator draws from, so freed blocks are cached and reused); freed in the same order at scope exit.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) HT_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
  }
  ~Scratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);  // errors here surface at the next checked call
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  double* get() const { return static_cast<double*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// The pack width to use: kVec<T> when the layout's contiguous run (C channels last, S channels first) is a
// multiple of it and every pointer is 16-byte aligned; 1 otherwise.
template <class T>
bool vectorizable(const BnShape& s, std::initializer_list<const void*> ptrs) {
  constexpr int V = kVec<T>;
  const int64_t run = s.S == 1 ? s.C : s.S;
  if (run % V != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return false;
  return true;
}

// Calls f(T{}, std::integral_constant<int, V>{}) with the pack width chosen by vectorizable.
template <class F>
bool visit_bn(DType dt, const BnShape& s, std::initializer_list<const void*> ptrs, F&& f) {
  return visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (vectorizable<T>(s, ptrs)) f(tag, std::integral_constant<int, kVec<T>>{});
    else f(tag, std::integral_constant<int, 1>{});
  });
}

// Calls f(std::integral_constant<BnAct, act>{}).
template <class F>
void visit_act(BnAct act, F&& f) {
  if (act == BnAct::relu) f(std::integral_constant<BnAct, BnAct::relu>{});
  else if (act == BnAct::add_relu) f(std::integral_constant<BnAct, BnAct::add_relu>{});
  else f(std::integral_constant<BnAct, BnAct::none>{});
}

unsigned finalize_blocks(int64_t C) { return static_cast<unsigned>((C + 7) / 8); }  // 8 warps a block

// Bytes of the partial sums (splits, 2, C).
std::size_t part_bytes(unsigned splits, int64_t C) { return static_cast<std::size_t>(splits) * 2 * C * sizeof(double); }

// ---- the tickets (Note [Batch-norm kernels]) ----
// Every device has one zeroed buffer of kTicketRing * kTicketSlot counters, allocated at its first use; a
// launch takes the next slot of the ring (round robin) and its last blocks leave every counter they used at
// 0. Launches in one stream are ordered, so a slot is free again when its turn comes; a slot is only shared
// by two running kernels when kTicketRing batch-norm reductions run at once on different streams of one
// device (not done by this framework). Null (use the *_split kernels and a finalize launch) when C exceeds a slot, or when the buffer does
// not exist yet and `stream` is being captured into a graph (allocating there is not allowed).
constexpr int64_t kTicketSlot = 4096, kTicketRing = 32;
constexpr int kMaxDevices = 64;

unsigned* bn_tickets(int64_t n, cudaStream_t stream) {
  static std::mutex mu;
  static unsigned* buffers[kMaxDevices] = {};
  static std::atomic<uint32_t> next[kMaxDevices] = {};
  if (n > kTicketSlot) return nullptr;
  int dev = 0;
  HT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return nullptr;
  unsigned* buf = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!buffers[dev]) {
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      HT_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
      if (cs != cudaStreamCaptureStatusNone) return nullptr;
      void* p = nullptr;
      const std::size_t bytes = static_cast<std::size_t>(kTicketSlot * kTicketRing) * sizeof(unsigned);
      HT_CUDA_CHECK(cudaMalloc(&p, bytes));  // kept for the process's lifetime
      HT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
      HT_CUDA_CHECK(cudaStreamSynchronize(stream));  // zero before any other stream can take a slot
      buffers[dev] = static_cast<unsigned*>(p);
    }
    buf = buffers[dev];
  }
  const uint32_t slot = next[dev].fetch_add(1, std::memory_order_relaxed) % kTicketRing;
  return buf + static_cast<int64_t>(slot) * kTicketSlot;
}

// The channels-first variant (batchnorm.h): HADATRAIN_BN_CF_KERNEL read once, set_bn_cf_variant's override.
std::atomic<int> g_cf_variant_override{0};
std::atomic<int64_t> g_plane_launches{0};

int env_cf_variant() {
  // vstore (3): the default since run 22 (Note [Batch-norm plane kernels])
  static const int v = env_variant("HADATRAIN_BN_CF_KERNEL", {{"split", 1}, {"planes", 2}, {"vstore", 3}},
                                   3, 3);
  return v;
}

// The channels-last variant (batchnorm.h): HADATRAIN_BN_CL_KERNEL read once, set_bn_cl_variant's override.
std::atomic<int> g_cl_variant_override{0};
std::atomic<int64_t> g_cl_ticket_launches{0};

int env_cl_variant() {
  // unset: 0, by channel count (cl_variant_for)
  static const int v = env_variant("HADATRAIN_BN_CL_KERNEL", {{"split", 1}, {"tickets", 2}}, 0, 1);
  return v;
}

// The channels-last reduction variant for C channels: bn_cl_variant() when set (override or environment), else
// tickets (2) from kClTicketsMinC channels up, split (1) below. Run 24 (H200, bf16, ms split / tickets): on
// [16384, 256] with relu, forward 0.0301 / 0.0258, backward 0.0412 / 0.0395; on [262144, 64], statistics
// 0.0183 / 0.0171 but backward sums 0.0310 / 0.0326 (whole backward 0.0649 / 0.0677).
constexpr int64_t kClTicketsMinC = 128;
int cl_variant_for(int64_t C) {
  const int o = g_cl_variant_override.load(std::memory_order_relaxed);
  if (o >= 1 && o <= kBnClVariants) return o;
  if (const int e = env_cl_variant(); e != 0) return e;
  return C >= kClTicketsMinC ? 2 : 1;
}

// Variant 2's geometry and ticket slot for x (M, C), or null tickets (then variant 1 runs): counts the launch.
unsigned* cl2_tickets(const Cl2Grid& g, cudaStream_t stream);

// Whether the plane kernels take x (N, C, S > 1) under the current variant (tickets are taken separately).
bool use_planes(const BnShape& s) {
  return bn_cf_variant() == 2 && s.S >= kPlaneMinS && s.N * s.C >= kPlaneMinPlanes &&
         s.N * s.C <= kPlaneMaxPlanes && s.C <= kTicketSlot;
}

// The grid of a plane-kernel launch (one wave of blocks_per_sm blocks a SM, at most one warp a plane);
// counts the launch.
unsigned plane_grid(const BnShape& s, int blocks_per_sm) {
  g_plane_launches.fetch_add(1, std::memory_order_relaxed);
  return static_cast<unsigned>(
      std::min<int64_t>(int64_t{132} * blocks_per_sm, (s.N * s.C + kPlaneWarps - 1) / kPlaneWarps));
}

}  // namespace

int bn_cf_variant() {
  const int o = g_cf_variant_override.load(std::memory_order_relaxed);
  return o >= 1 && o <= kBnCfVariants ? o : env_cf_variant();
}
void set_bn_cf_variant(int variant) { g_cf_variant_override.store(variant, std::memory_order_relaxed); }
int64_t bn_plane_launches() { return g_plane_launches.load(std::memory_order_relaxed); }

// The override or the environment's choice; unset, split (1): the rule's answer below kClTicketsMinC channels.
int bn_cl_variant() { return cl_variant_for(0); }
void set_bn_cl_variant(int variant) { g_cl_variant_override.store(variant, std::memory_order_relaxed); }
int64_t bn_cl_ticket_launches() { return g_cl_ticket_launches.load(std::memory_order_relaxed); }

namespace {
unsigned* cl2_tickets(const Cl2Grid& g, cudaStream_t stream) {
  if (g.tickets > kTicketSlot) return nullptr;  // callers check the variant (cl_variant_for)
  unsigned* t = bn_tickets(g.tickets, stream);
  if (t) g_cl_ticket_launches.fetch_add(1, std::memory_order_relaxed);
  return t;
}
}  // namespace

void launch_bn_stats(DType dt, const void* x, BnShape s, double eps, BnRunning running, double* mean, double* invstd,
                     cudaStream_t stream) {
  if (s.C == 0) return;
  const int64_t M = s.N * s.S;
  if (!visit_bn(dt, s, {x}, [&](auto tag, auto vtag) {
        using T = decltype(tag);
        constexpr int V = decltype(vtag)::value;
        const T* xp = static_cast<const T*>(x);
        const unsigned fb = finalize_blocks(s.C);
        if (M == 0) {  // no values: NaN statistics, as on the CPU
          bn_stats_finalize<T><<<fb, kThreads, 0, stream>>>(nullptr, 0, xp, 1, s.C, 0, eps, running, mean, invstd);
        } else if (s.S == 1) {
          if (cl_variant_for(s.C) == 2) {
            const Cl2Grid g2 = cl2_grid(M, s.C, V);
            if (unsigned* tickets = cl2_tickets(g2, stream)) {
              const Scratch part(part_bytes(g2.g.grid.y + static_cast<unsigned>(g2.groups), s.C), stream);
              double* part2 = part.get() + static_cast<int64_t>(g2.g.grid.y) * 2 * s.C;
              bn_stats_cl2<T, V><<<g2.g.grid, g2.g.block, 0, stream>>>(xp, M, s.C, g2.g, g2.group, g2.groups,
                                                                       part.get(), part2, tickets, eps, running,
                                                                       mean, invstd);
              HT_CHECK_LAUNCH("bn_stats_cl2");
              return;
            }
          }
          const ClGrid g = cl_grid(M, s.C, V, kTargetBlocksCl);
          const Scratch part(part_bytes(g.grid.y, s.C), stream);
          bn_stats_cl<T, V><<<g.grid, g.block, 0, stream>>>(xp, M, s.C, g, part.get());
          HT_CHECK_LAUNCH("bn_stats_cl");
          bn_stats_finalize<T><<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(g.grid.y), xp, 1, s.C, M,
                                                            eps, running, mean, invstd);
        } else {
          if (use_planes(s)) {
            if (unsigned* tickets = bn_tickets(s.C, stream)) {
              const Scratch part(part_bytes(static_cast<unsigned>(s.N), s.C), stream);
              const unsigned blocks = plane_grid(s, kPlaneBlocksRed);
              bn_stats_planes<T, V><<<blocks, kPlaneThreads, 0, stream>>>(xp, s, part.get(), tickets, eps, running,
                                                                          mean, invstd);
              HT_CHECK_LAUNCH("bn_stats_planes");
              return;
            }
          }
          const CfGrid g = cf_grid(s, V);
          const Scratch part(part_bytes(g.grid.y, s.C), stream);
          if (unsigned* tickets = bn_tickets(s.C, stream)) {
            bn_stats_cf<T, V><<<g.grid, kThreads, 0, stream>>>(xp, s, g, part.get(), tickets, eps, running,
                                                                     mean, invstd);
            HT_CHECK_LAUNCH("bn_stats_cf");
            return;
          }
          bn_stats_cf_split<T, V><<<g.grid, kThreads, 0, stream>>>(xp, s, g, part.get());
          HT_CHECK_LAUNCH("bn_stats_cf_split");
          bn_stats_finalize<T><<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(g.grid.y), xp, s.S, s.C, M,
                                                            eps, running, mean, invstd);
        }
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm stats", dt);
  HT_CHECK_LAUNCH("batch_norm stats");
}

void launch_bn_eval_stats(BnParam running_mean, BnParam running_var, int64_t C, double eps, double* mean,
                          double* invstd, cudaStream_t stream) {
  if (C == 0) return;
  bn_eval_stats_kernel<<<cuda::grid_for(C), cuda::kBlock, 0, stream>>>(running_mean, running_var, C, eps, mean,
                                                                         invstd);
  HT_CHECK_LAUNCH("batch_norm eval stats");
}

void launch_bn_normalize(DType dt, const void* x, BnShape s, BnChannels ch, void* y, cudaStream_t stream) {
  const int64_t M = s.N * s.S;
  if (M * s.C == 0) return;
  if (!visit_bn(dt, s, {x, y, ch.residual}, [&](auto tag, auto vtag) {
        using T = decltype(tag);
        constexpr int V = decltype(vtag)::value;
        const T* xp = static_cast<const T*>(x);
        T* yp = static_cast<T*>(y);
        visit_act(ch.act, [&](auto atag) {
          constexpr BnAct Act = decltype(atag)::value;
          if (s.S == 1) {
            const ClGrid g = cl_grid(M, s.C, V, kTargetBlocksCl);
            bn_normalize_cl<Act, T, V><<<g.grid, g.block, 0, stream>>>(xp, M, s.C, g, ch, yp);
          } else if (use_planes(s)) {
            const unsigned blocks = plane_grid(s, kPlaneBlocksNorm);
            bn_normalize_planes<Act, T, V><<<blocks, kPlaneThreads, 0, stream>>>(xp, s, ch, yp);
          } else if (bn_cf_variant() == 3) {  // 16-byte stores
            const CfGrid g = cf_grid(s, V);
            bn_normalize_cf<Act, T, V, true><<<g.grid, kThreads, 0, stream>>>(xp, s, g, ch, yp);
          } else {
            const CfGrid g = cf_grid(s, V);
            bn_normalize_cf<Act, T, V><<<g.grid, kThreads, 0, stream>>>(xp, s, g, ch, yp);
          }
        });
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm", dt);
  HT_CHECK_LAUNCH("batch_norm");
}

void launch_bn_backward_reduce(DType dt, const void* g, const void* x, BnShape s, BnChannels ch, BnBackwardSums out,
                               cudaStream_t stream) {
  if (s.C == 0) return;
  const int64_t M = s.N * s.S;
  if (!x) {  // (the caller passes x whenever ch.act masks g)
    out.sum_gxhat = nullptr;
    out.grad_weight = {};
    ch.act = BnAct::none;
  }
  if (!visit_bn(dt, s, {g, x, ch.residual}, [&](auto tag, auto vtag) {
        using T = decltype(tag);
        constexpr int V = decltype(vtag)::value;
        const T* gp = static_cast<const T*>(g);
        const T* xp = static_cast<const T*>(x);
        const unsigned fb = finalize_blocks(s.C);
        if (M == 0) {  // empty sums are 0
          bn_bwd_finalize<<<fb, kThreads, 0, stream>>>(nullptr, 0, s.C, ch.invstd, out);
          return;
        }
        visit_act(ch.act, [&](auto atag) {
          constexpr BnAct Act = decltype(atag)::value;
          if (s.S == 1) {
            if (cl_variant_for(s.C) == 2) {
              const Cl2Grid g2 = cl2_grid(M, s.C, V);
              if (unsigned* tickets = cl2_tickets(g2, stream)) {
                const Scratch part(part_bytes(g2.g.grid.y + static_cast<unsigned>(g2.groups), s.C), stream);
                double* part2 = part.get() + static_cast<int64_t>(g2.g.grid.y) * 2 * s.C;
                bn_bwd_reduce_cl2<Act, T, V><<<g2.g.grid, g2.g.block, 0, stream>>>(
                    gp, xp, M, s.C, g2.g, ch, g2.group, g2.groups, part.get(), part2, tickets, out);
                HT_CHECK_LAUNCH("bn_bwd_reduce_cl2");
                return;
              }
            }
            const ClGrid cg = cl_grid(M, s.C, V, 132 * kClBlocks<Act>);
            const Scratch part(part_bytes(cg.grid.y, s.C), stream);
            bn_bwd_reduce_cl<Act, T, V><<<cg.grid, cg.block, 0, stream>>>(gp, xp, M, s.C, cg, ch, part.get());
            HT_CHECK_LAUNCH("bn_bwd_reduce_cl");
            bn_bwd_finalize<<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(cg.grid.y), s.C, ch.invstd, out);
          } else {
            if (use_planes(s)) {
              if (unsigned* tickets = bn_tickets(s.C, stream)) {
                const Scratch part(part_bytes(static_cast<unsigned>(s.N), s.C), stream);
                const unsigned blocks = plane_grid(s, kPlaneBlocksRed);
                bn_bwd_reduce_planes<Act, T, V><<<blocks, kPlaneThreads, 0, stream>>>(gp, xp, s, ch, part.get(),
                                                                                       tickets, out);
                HT_CHECK_LAUNCH("bn_bwd_reduce_planes");
                return;
              }
            }
            const CfGrid cg = cf_grid(s, V);
            const Scratch part(part_bytes(cg.grid.y, s.C), stream);
            if (unsigned* tickets = bn_tickets(s.C, stream)) {
              bn_bwd_reduce_cf<Act, T, V><<<cg.grid, kThreads, 0, stream>>>(gp, xp, s, cg, ch, part.get(),
                                                                                 tickets, out);
              HT_CHECK_LAUNCH("bn_bwd_reduce_cf");
              return;
            }
            bn_bwd_reduce_cf_split<Act, T, V><<<cg.grid, kThreads, 0, stream>>>(gp, xp, s, cg, ch, part.get());
            HT_CHECK_LAUNCH("bn_bwd_reduce_cf_split");
            bn_bwd_finalize<<<fb, kThreads, 0, stream>>>(part.get(), static_cast<int>(cg.grid.y), s.C, ch.invstd, out);
          }
        });
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm backward", dt);
  HT_CHECK_LAUNCH("batch_norm backward reduce");
}

void launch_bn_backward_dx(DType dt, BnMode mode, const void* g, const void* x, BnShape s, BnChannels ch,
                           const double* sum_g, const double* sum_gxhat, void* gx, cudaStream_t stream) {
  const int64_t M = s.N * s.S;
  if (M * s.C == 0) return;
  if (mode == BnMode::eval && ch.act == BnAct::none) x = nullptr;
  if (!visit_bn(dt, s, {g, x, gx, ch.residual, ch.residual_grad}, [&](auto tag, auto vtag) {
        using T = decltype(tag);
        constexpr int V = decltype(vtag)::value;
        const T* gp = static_cast<const T*>(g);
        const T* xp = static_cast<const T*>(x);
        T* out = static_cast<T*>(gx);
        visit_act(ch.act, [&](auto atag) {
          constexpr BnAct Act = decltype(atag)::value;
          if (s.S == 1) {
            const ClGrid cg = cl_grid(M, s.C, V, kTargetBlocksClDx);
            bn_dx_cl<Act, T, V><<<cg.grid, cg.block, 0, stream>>>(mode, gp, xp, M, s.C, cg, ch, sum_g, sum_gxhat,
                                                                   out);
          } else if (use_planes(s)) {
            const unsigned blocks = plane_grid(s, kPlaneBlocksRed);
            bn_dx_planes<Act, T, V><<<blocks, kPlaneThreads, 0, stream>>>(mode, gp, xp, s, ch, sum_g, sum_gxhat,
                                                                           out);
          } else if (bn_cf_variant() == 3) {  // 16-byte stores
            const CfGrid cg = cf_grid(s, V);
            bn_dx_cf<Act, T, V, true><<<cg.grid, kThreads, 0, stream>>>(mode, gp, xp, s, cg, ch, sum_g, sum_gxhat,
                                                                        out);
          } else {
            const CfGrid cg = cf_grid(s, V);
            bn_dx_cf<Act, T, V><<<cg.grid, kThreads, 0, stream>>>(mode, gp, xp, s, cg, ch, sum_g, sum_gxhat, out);
          }
        });
      }))
    HT_UNSUPPORTED_DTYPE("batch_norm backward", dt);
  HT_CHECK_LAUNCH("batch_norm backward dx");
}

}  // namespace ht::kernels
