// The staged layer_norm / rms_norm forward (parameters in shared memory or in registers: Note [Staged norm
// kernels] in rows_staged.cuh, Note [Norm kernels] in rows_norm.cu) and the staged launch shape that the backward
// (rows_norm_staged_bwd.cu) shares: the per-device limits and occupancies, the stage count and grid
// (staged_grid), and the cluster backward's cluster size (pick_cluster).
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cuda/kernels/rows_staged.cuh"

namespace ht::kernels::rk {
namespace {

template <class T, int NP, int kPm>
__global__ void __launch_bounds__(kRowBlock, (kStagedMinBlocks<NP, kPm>)) norm_staged_kernel(NormArgs a, int tpr, int stages) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  constexpr bool kReg = kPm != static_cast<int>(NormParamsAt::smem);
  constexpr bool kNarrowReg = kPm == static_cast<int>(NormParamsAt::reg_narrow);
  // The thread's packs of the row, then the row's first pack (the shift), unless shfl_shift (rows of at most a
  // warp: lane 0 holds the first pack and shuffles it).
  const bool shfl_shift = staged_shfl_shift(tpr);
  const int slots = NP + (shfl_shift ? 0 : 1);
  // bf16 / f16: the statistics from one reduction of sums shifted by the row's first element; f32 / f64: two
  // reductions, the mean then the sum of squares about it
  constexpr bool one_pass = kHalfPack<T>;
  extern __shared__ __align__(16) unsigned char norm_dyn_smem[];
  __shared__ A red[2][2][kRowBlock / 32];
  const int64_t d = a.dim;
  const int packs = static_cast<int>(d / V);
  const bool layer = a.kind == NormKind::layer;
  // (D) weight (1 without one), then (D) bias (0 without), unless kReg; then the stages [stages][slots][block]
  A* ws = reinterpret_cast<A*>(norm_dyn_smem);
  A* bs = ws + d;
  P* stage = reinterpret_cast<P*>(norm_dyn_smem + (kReg ? 0 : 2 * d * static_cast<int64_t>(sizeof(A))));
  const StagedRows sr(a.rows, tpr);
  const int tid = static_cast<int>(threadIdx.x);
  const T* xp = static_cast<const T*>(a.x);
  auto issue = [&](int64_t grp, int st) {
    if (grp < sr.groups) {
      const int64_t r0 = sr.row_of(grp);
      const T* src = xp + (r0 < a.rows ? r0 : a.rows - 1) * d;
      P* dst = stage + st * slots * kRowBlock + tid;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int q = sr.lane + i * tpr;
        if (q < packs) cp_async16(dst + i * kRowBlock, src + static_cast<int64_t>(q) * V);
      }
      // (kReg: lane 0 of each warp only; it shuffles the shift to its warp, groups being whole warps here)
      if (one_pass && layer && !shfl_shift && (!kReg || tid % 32 == 0)) cp_async16(dst + NP * kRowBlock, src);
    }
    cp_async_commit();
  };
  for (int s = 0; s + 1 < stages; ++s) issue(blockIdx.x + static_cast<int64_t>(s) * gridDim.x, s);
  // the parameters, while the first row groups load
  const Param<T, A> w{a.weight, a.weight_narrow};
  const Param<T, A> b{a.bias, a.bias_narrow};
  A wr[kReg && !kNarrowReg ? NP : 1][V], br[kReg && !kNarrowReg ? NP : 1][V];
  P wn[kNarrowReg ? NP : 1], bn[kNarrowReg ? NP : 1];
  bool params_finite;
  if constexpr (kNarrowReg) {
    // the parameters' own bf16 / f16 packs (the host checks that every given one is narrow), widened per row
    params_finite = reg_params_narrow<T, NP>(wn, w, d, sr.lane, tpr);
    params_finite = reg_params_narrow<T, NP>(bn, b, d, sr.lane, tpr) && params_finite;
  } else if constexpr (kReg) {
    // per thread: a thread's results use its own parameter values only (no barrier before the first row)
    params_finite = reg_params<T, A, NP, V>(wr, w, d, sr.lane, tpr, A(1));
    params_finite = reg_params<T, A, NP, V>(br, b, d, sr.lane, tpr, A(0)) && params_finite;
  } else {
    bool fin = stage_param(ws, w, d, A(1));
    fin = stage_param(bs, b, d, A(0)) && fin;
    params_finite = __syncthreads_and(fin) != 0;
  }
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
    const P* src = stage + st * slots * kRowBlock + tid;
    st = st + 1 == stages ? 0 : st + 1;
    // The row's values of pack i: unpacked once into registers, or with kReg (whose registers hold the
    // parameters) from the stage at every use.
    A x[kReg ? 1 : NP][V];
    if constexpr (!kReg) {
#pragma unroll
      for (int i = 0; i < NP; ++i)
        if (sr.lane + i * tpr < packs) unpack(src[i * kRowBlock], x[i]);
    }
    auto xpack = [&](int i, A(&xv)[V]) {
      if constexpr (kReg) {
        unpack(src[i * kRowBlock], xv);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) xv[k] = x[i][k];
      }
    };
    A m = A(0), var, s1 = A(0), s2 = A(0);
    if constexpr (one_pass) {
      // one reduction of the sums shifted by the row's first element (see the note)
      A shift = A(0);
      if (layer) {  // uniform across the block
        if (shfl_shift) {  // lane 0 holds pack 0 of the row
          A x0[V];
          xpack(0, x0);
          shift = __shfl_sync(kFull, x0[0], 0, tpr);
        }
        else if (kReg) shift = __shfl_sync(kFull, tid % 32 == 0 ? convert<A>(src[NP * kRowBlock].v[0]) : A(0), 0);
        else shift = convert<A>(src[NP * kRowBlock].v[0]);
      }
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        if (sr.lane + i * tpr >= packs) continue;
        A xv[V];
        xpack(i, xv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A t = xv[k] - shift;
          s1 += t;
          s2 = d_fma(t, t, s2);
        }
      }
      group_sum2(s1, s2, tpr, red, phase);  // uniform across the block
      if (layer) {
        const A ms = over_d(s1);
        m = shift + ms;
        var = over_d(s2) - ms * ms;
        var = var < A(0) ? A(0) : var;  // keeps NaN
      } else {
        var = over_d(s2);
      }
    } else {
      // the mean, then the sum of squares about it (two reductions, as the CPU reference)
      A unused = A(0);
      if (layer) {  // uniform across the block
#pragma unroll
        for (int i = 0; i < NP; ++i) {
          if (sr.lane + i * tpr >= packs) continue;
          A xv[V];
          xpack(i, xv);
#pragma unroll
          for (int k = 0; k < V; ++k) s1 += xv[k];
        }
        group_sum2(s1, unused, tpr, red, phase);
        m = over_d(s1);
      }
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        if (sr.lane + i * tpr >= packs) continue;
        A xv[V];
        xpack(i, xv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A t = xv[k] - m;
          s2 = d_fma(t, t, s2);
        }
      }
      group_sum2(s2, unused, tpr, red, phase);
      var = over_d(s2);
    }
    if (!valid) continue;
    A r;
    if constexpr (kHalfPack<T>) r = fast_rsqrt(var + static_cast<A>(a.eps));
    else r = A(1) / d_sqrt(var + static_cast<A>(a.eps));
    if (sr.lane == 0) {
      if (a.mean) static_cast<A*>(a.mean)[row] = m;
      static_cast<A*>(a.rstd)[row] = r;
    }
    // Finite sums, statistics and parameters: every x is finite, so no result is NaN (pack_cast unchecked).
    const bool finite = params_finite && d_finite(s2) && d_finite(s1) && d_finite(r);
    const A mr = m * r;
    auto f = [&](int i, A(&o)[V]) {
      A wv[V], bv[V];
      if constexpr (kNarrowReg) {
        if (w) {
          unpack(wn[i], wv);
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) wv[k] = A(1);
        }
        if (b) {
          unpack(bn[i], bv);
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) bv[k] = A(0);
        }
      } else if constexpr (kReg) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          wv[k] = wr[i][k];
          bv[k] = br[i][k];
        }
      } else {
        const int j = (sr.lane + i * tpr) * V;
        load_params<A, V>(ws, j, A(1), wv);
        load_params<A, V>(bs, j, A(0), bv);
      }
      A xv[V];
      xpack(i, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        A xh;
        if constexpr (kHalfPack<T>) xh = d_fma(xv[k], r, -mr);
        else xh = (xv[k] - m) * r;
        o[k] = d_fma(xh, wv[k], bv[k]);
      }
    };
    T* y = static_cast<T*>(a.out) + row * d;
    if (finite) store_packs<false, T, NP>(y, packs, sr.lane, tpr, f);
    else store_packs<true, T, NP>(y, packs, sr.lane, tpr, f);
  }
  cp_async_wait(0);
}

struct DeviceLimits {
  std::size_t optin = 0, per_sm = 0, reserved = 0;
  int sms = 0;
};

// Per-device limits and per-(kernel, device, shared memory) occupancies, queried once each. The first query
// of a kernel on a device also raises its dynamic shared memory limit to the opt-in maximum.
std::mutex g_staged_mutex;
std::map<int, DeviceLimits> g_limits;
std::map<std::tuple<const void*, int, std::size_t>, int> g_occupancy;
// pick_cluster's cluster occupancies per (kernel, device, shared memory, cluster size).
std::map<std::tuple<const void*, int, std::size_t, unsigned>, int> g_cluster_occupancy;

bool device_limits(int dev, DeviceLimits& out) {
  std::lock_guard<std::mutex> lock(g_staged_mutex);
  if (auto it = g_limits.find(dev); it != g_limits.end()) {
    out = it->second;
    return out.sms > 0;
  }
  int optin = 0, per_sm = 0, reserved = 0, sms = 0;
  DeviceLimits l;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) {
    l = {static_cast<std::size_t>(optin), static_cast<std::size_t>(per_sm), static_cast<std::size_t>(reserved), sms};
  } else {
    (void)cudaGetLastError();
  }
  g_limits[dev] = l;
  out = l;
  return l.sms > 0;
}

// Resident blocks per SM of kernel with `smem` bytes of dynamic shared memory (0 when it cannot run). The
// first query of a kernel on a device raises its dynamic shared memory limit to the opt-in maximum less its
// static shared memory (g_max_dynamic; 0 when that failed).
std::map<std::pair<const void*, int>, std::size_t> g_max_dynamic;

int staged_occupancy(const void* kernel, int dev, std::size_t smem, std::size_t optin) {
  std::lock_guard<std::mutex> lock(g_staged_mutex);
  const auto key = std::make_tuple(kernel, dev, smem);
  if (auto it = g_occupancy.find(key); it != g_occupancy.end()) return it->second;
  auto raised = g_max_dynamic.find({kernel, dev});
  if (raised == g_max_dynamic.end()) {
    std::size_t max_dynamic = 0;
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && optin > fa.sharedSizeBytes &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(optin - fa.sharedSizeBytes)) == cudaSuccess)
      max_dynamic = optin - fa.sharedSizeBytes;
    else
      (void)cudaGetLastError();
    raised = g_max_dynamic.emplace(std::make_pair(kernel, dev), max_dynamic).first;
  }
  int n = 0;
  if (smem > raised->second || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kRowBlock, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  g_occupancy[key] = n;
  return n;
}
}  // namespace

// kernels[np - 1] is the instantiation for np packs per thread. acc: sizeof(S); backward: the backward kernel's
// shared-memory layout (weight, g / x / statistics slots) instead of the forward's (weight and bias, x slots,
// the shift slot unless the row group is at most a warp); kernels[np - 1] for np <= reg_np keep no parameters
// in shared memory (the forward's StagedKind::reg).
StagedGrid staged_grid(int64_t rows, int64_t len, int vec, std::size_t acc, StagedPass pass, int reg_np,
                       std::initializer_list<const void*> ptrs, const void* const (&kernels)[4]) {
  StagedGrid g;
  if (len <= 0 || len % vec != 0) return g;
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return g;
  const int64_t packs = len / vec;
  if (packs > 4 * kRowBlock) return g;
  int tpr = 1;
  while (static_cast<int64_t>(tpr) * 4 < packs) tpr *= 2;
  const int np = static_cast<int>((packs + tpr - 1) / tpr);
  int dev = 0;
  DeviceLimits lim;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return g;
  }
  if (!device_limits(dev, lim)) return g;
  const bool backward = pass == StagedPass::backward;
  const bool shfl_shift = !backward && staged_shfl_shift(tpr);
  const std::size_t slots = backward ? 2 * np + 1 : np + (shfl_shift ? 0 : 1);
  const std::size_t fixed = np <= reg_np ? 0
                            : backward   ? (static_cast<std::size_t>(len) * acc + 15) / 16 * 16
                                         : 2 * static_cast<std::size_t>(len) * acc;
  const std::size_t static_smem = 2 * 2 * (kRowBlock / 32) * acc;
  auto smem_of = [&](int s) { return fixed + static_cast<std::size_t>(s) * slots * kRowBlock * 16; };
  // the most stages (2..4) with which two blocks are resident per SM (by the shared-memory arithmetic and then
  // the occupancy query); two stages when none is
  const void* kernel = kernels[np - 1];
  int stages = 2, per_sm = 0;
  for (int s = 4; s >= 2; --s) {
    if (s > 2 && 2 * (smem_of(s) + static_smem + lim.reserved) > lim.per_sm) continue;
    if (smem_of(s) + static_smem > lim.optin) continue;
    const int n = staged_occupancy(kernel, dev, smem_of(s), lim.optin);
    if (n >= 2 || s == 2) {
      stages = s;
      per_sm = n;
      break;
    }
  }
  if (per_sm < 1) return g;
  const int64_t per_block = kRowBlock / tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  const int64_t wave = static_cast<int64_t>(per_sm) * lim.sms;
  g.np = np;
  g.tpr = tpr;
  g.stages = stages;
  g.smem = smem_of(stages);
  g.blocks = static_cast<unsigned>(groups < 1 ? 1 : (groups > wave ? wave : groups));
  g.wave = wave;
  return g;
}

namespace {
using NormFwdKernel = void (*)(NormArgs, int, int);
template <class T, int kPm>
NormFwdKernel norm_fwd_kernel(int np) {
  return np == 1   ? norm_staged_kernel<T, 1, kPm>
         : np == 2 ? norm_staged_kernel<T, 2, kPm>
         : np == 3 ? norm_staged_kernel<T, 3, kPm>
                   : norm_staged_kernel<T, 4, kPm>;
}

// Where the forward with np packs per thread keeps the parameters (registers only for StagedKind::reg).
template <class T>
NormParamsAt fwd_params_at(const NormArgs& a, int np, StagedKind kind) {
  if (kind != StagedKind::reg) return NormParamsAt::smem;
  if (np > kRegNp) return NormParamsAt::smem;
  if constexpr (sizeof(T) == 2) {
    if ((!a.weight || a.weight_narrow) && (!a.bias || a.bias_narrow)) return NormParamsAt::reg_narrow;
  }
  return NormParamsAt::reg;
}

template <class T>
NormFwdKernel fwd_kernel_of(NormParamsAt pm, int np) {
  switch (pm) {
    case NormParamsAt::reg: return norm_fwd_kernel<T, 1>(np);
    case NormParamsAt::reg_narrow:
      if constexpr (sizeof(T) == 2) return norm_fwd_kernel<T, 2>(np);
      break;
    default: break;
  }
  return norm_fwd_kernel<T, 0>(np);
}

// The staged forward's launch for StagedKind smem or reg. The grid is sized with the kernel that will run.
template <class T>
StagedGrid norm_fwd_staged_grid_of(const NormArgs& a, StagedKind kind) {
  const void* k[4];
  int reg_np = 0;  // the np up to which the parameters are not in shared memory
  for (int np = 1; np <= 4; ++np) {
    const NormParamsAt pm = fwd_params_at<T>(a, np, kind);
    k[np - 1] = reinterpret_cast<const void*>(fwd_kernel_of<T>(pm, np));
    if (pm != NormParamsAt::smem) reg_np = np;
  }
  StagedGrid g = staged_grid(a.rows, a.dim, kVec<T>, sizeof(acc_t<T>), StagedPass::forward, reg_np, {a.out, a.x}, k);
  if (g.np > 0) g.pm = fwd_params_at<T>(a, g.np, kind);
  return g;
}
}  // namespace

// The cluster size for a staged backward grid g of the cluster kernel (Note [Norm backward, clusters]): the
// largest of 4 and 2 whose clusters, as many as the device holds at once, take the whole grid (g.blocks
// rounded up to the cluster size, at most the wave rounded down); 1 (a plain launch) when neither does or the
// query fails. Sets g.cluster and rounds g.blocks to a multiple of it (the extra blocks get no rows and add
// zero sums).
void pick_cluster(StagedGrid& g, const void* kernel) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  for (const unsigned c : {4u, 2u}) {
    int clusters = 0;
    {
      std::lock_guard<std::mutex> lock(g_staged_mutex);
      const auto key = std::make_tuple(kernel, dev, g.smem, c);
      if (auto it = g_cluster_occupancy.find(key); it != g_cluster_occupancy.end()) {
        clusters = it->second;
      } else {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(c, 1, 1);
        cfg.blockDim = dim3(kRowBlock, 1, 1);
        cfg.dynamicSmemBytes = g.smem;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = c;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
          (void)cudaGetLastError();
          clusters = 0;
        }
        g_cluster_occupancy[key] = clusters;
      }
    }
    const int64_t want = (static_cast<int64_t>(g.blocks) + c - 1) / c * c;  // the grid in whole clusters
    const int64_t fit = g.wave / c * c;                                        // the most resident at once
    const int64_t need = want < fit ? want : fit;
    if (need < c || static_cast<int64_t>(clusters) * c < need) continue;
    g.cluster = c;
    g.blocks = static_cast<unsigned>(need);
    return;
  }
}

StagedGrid norm_fwd_staged_grid(const NormArgs& a, StagedKind kind) {
  StagedGrid g;
  visit_kernel_float(a.dtype, [&](auto tag) { g = norm_fwd_staged_grid_of<decltype(tag)>(a, kind); });
  return g;
}

void launch_norm_staged(const NormArgs& a, const StagedGrid& sg, cudaStream_t stream) {
  visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const NormFwdKernel kernel = fwd_kernel_of<T>(sg.pm, sg.np);
    kernel<<<sg.blocks, kRowBlock, sg.smem, stream>>>(a, sg.tpr, sg.stages);
    HT_CHECK_LAUNCH("norm_staged_kernel");
  });
}

}  // namespace ht::kernels::rk
