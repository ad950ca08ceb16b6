// layer_norm / rms_norm (see rows.cuh): the choice of the norm kernels (Notes [Norm kernels] and [Norm backward,
// clusters] below), the public launchers, which run the staged kernels
// (rows_norm_staged_fwd.cu, rows_norm_staged_bwd.cu), the register-resident ones (rows_norm_cached.cu) or the
// multi-pass kernels here, and the parameter-gradient kernels: the multi-pass backward's column sums and the
// finalize that adds the partial rows of the fused backward kernels. Row groups as in rows.cu.
#include <atomic>

#include "cuda/kernels/rows_common.cuh"

namespace ht::kernels {
namespace {
using namespace rk;

// ---- layer_norm / rms_norm -------------------------------------------------------------------------------

template <class T>
__global__ void norm_kernel(NormArgs a, int tpr) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  const int64_t d = a.dim;
  const Param<T, A> w{a.weight, a.weight_narrow};
  const Param<T, A> b{a.bias, a.bias_narrow};
  const bool layer = a.kind == NormKind::layer;
  for_each_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = static_cast<const T*>(a.x) + row * d;
    A m = A(0);
    if (layer) {  // uniform across the block: every thread reduces
      // bf16 / f16: the mean as K + mean(x - K), K the row's first element (Note [Shifted row mean])
      const A shift = kShiftMean<T> && valid ? convert<A>(x[0]) : A(0);
      A s = A(0);
      if (valid)
        row_read(x, d, lane, tpr, [&](int64_t, T v) { s += convert<A>(v) - shift; });
      m = shift + group_reduce(s, tpr, smem, Sum{}) / static_cast<A>(d);
    }
    A ss = A(0);
    if (valid)
      row_read(x, d, lane, tpr, [&](int64_t, T v) {
        const A cx = convert<A>(v) - m;
        ss += cx * cx;
      });
    ss = group_reduce(ss, tpr, smem, Sum{});
    if (!valid) return;
    const A r = A(1) / d_sqrt(ss / static_cast<A>(d) + static_cast<A>(a.eps));
    T* y = static_cast<T*>(a.out) + row * d;
    row_write(y, x, d, lane, tpr, [&](int64_t j, T v) {
      const A xh = (convert<A>(v) - m) * r;
      return (w ? xh * w[j] : xh) + (b ? b[j] : A(0));
    });
    if (lane == 0) {
      if (a.mean) static_cast<A*>(a.mean)[row] = m;
      static_cast<A*>(a.rstd)[row] = r;
    }
  });
}

template <class T>
__global__ void norm_backward_kernel(NormBackwardArgs a, int tpr) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  const int64_t d = a.dim;
  const Param<T, A> w{a.weight, a.weight_narrow};
  const bool layer = a.kind == NormKind::layer;
  for_each_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = static_cast<const T*>(a.x) + row * d;
    const T* g = static_cast<const T*>(a.g) + row * d;
    const A m = layer ? static_cast<const A*>(a.mean)[row] : A(0);
    const A r = static_cast<const A*>(a.rstd)[row];
    A s_gh = A(0), s_ghx = A(0);
    if (valid)
      row_read2(g, x, d, lane, tpr, [&](int64_t j, T gv, T xv) {
        const A gh = w ? convert<A>(gv) * w[j] : convert<A>(gv);
        s_gh += gh;
        s_ghx += gh * ((convert<A>(xv) - m) * r);
      });
    if (layer) s_gh = group_reduce(s_gh, tpr, smem, Sum{});  // uniform across the block
    s_ghx = group_reduce(s_ghx, tpr, smem, Sum{});
    if (!valid) return;
    const A mean_gh = layer ? s_gh / static_cast<A>(d) : A(0), mean_ghx = s_ghx / static_cast<A>(d);
    T* gx = static_cast<T*>(a.gx) + row * d;
    row_write2(gx, g, x, d, lane, tpr, [&](int64_t j, T gv, T xv) {
      const A gh = w ? convert<A>(gv) * w[j] : convert<A>(gv);
      const A xh = (convert<A>(xv) - m) * r;
      const A v = r * ((gh - mean_gh) - xh * mean_ghx);
      return a.accumulate ? v + convert<A>(gx[j]) : v;  // the same thread reads gx[j] before it writes it
    });
  });
}

// 32 x 8 block: threadIdx.x picks a column, threadIdx.y a lane over the rows of split blockIdx.y.
template <class T>
__global__ void norm_param_grad_kernel(NormParamGradArgs a, int64_t chunk) {
  using A = acc_t<T>;
  __shared__ A part_w[8][33], part_b[8][33];
  const int64_t d = a.dim;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk, r1 = r0 + chunk < a.rows ? r0 + chunk : a.rows;
  const bool layer = a.kind == NormKind::layer;
  A sw = A(0), sb = A(0);
  if (j < d)
    for (int64_t row = r0 + threadIdx.y; row < r1; row += 8) {
      const A g = convert<A>(static_cast<const T*>(a.g)[row * d + j]);
      const A m = layer ? static_cast<const A*>(a.mean)[row] : A(0);
      const A xh = (convert<A>(static_cast<const T*>(a.x)[row * d + j]) - m) * static_cast<const A*>(a.rstd)[row];
      sw += g * xh;
      sb += g;
    }
  part_w[threadIdx.y][threadIdx.x] = sw;
  part_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || j >= d) return;
#pragma unroll
  for (int y = 1; y < 8; ++y) {
    sw += part_w[y][threadIdx.x];
    sb += part_b[y][threadIdx.x];
  }
  const int64_t at = static_cast<int64_t>(blockIdx.y) * d + j;
  if (a.gw_partial) static_cast<A*>(a.gw_partial)[at] = sw;
  if (a.gb_partial) static_cast<A*>(a.gb_partial)[at] = sb;
}

// Adds the (parts, D) partial sums of the parameter gradients in part order (blockIdx.y: 0 weight, 1 bias)
// and stores the totals in their own dtypes. 32 x 8 block: threadIdx.x picks a column, threadIdx.y a lane
// over the parts; the 8 lanes' sums are combined in order (deterministic).
template <class A>
HT_DEV void store_as(void* dst, DType dt, int64_t j, A v) {
  switch (dt) {
    case DType::f32: static_cast<float*>(dst)[j] = convert<float>(v); break;
    case DType::f64: static_cast<double*>(dst)[j] = convert<double>(v); break;
    case DType::bf16: static_cast<bf16*>(dst)[j] = convert<bf16>(v); break;
    case DType::f16: static_cast<f16*>(dst)[j] = convert<f16>(v); break;
    default: break;  // excluded on the host
  }
}

// The finalize of the parameter gradients: a 32 x 32 block per 32 columns, lane y adding parts y, y + 32, ...
// (two interleaved accumulators, so two loads are in flight per step), then the 32 lanes' sums in a fixed tree
// order (deterministic). (A 32 x 8 block would keep only 48 blocks of 8 lanes for (264, 768) partial sums, each
// walking 33 parts one load at a time.)
template <class A>
__global__ void __launch_bounds__(1024) norm_param_finalize_wide_kernel(NormParamFinalizeArgs a) {
  __shared__ A part[32][33];
  const A* src = static_cast<const A*>(blockIdx.y == 0 ? a.gw_partial : a.gb_partial);
  void* dst = blockIdx.y == 0 ? a.gw : a.gb;
  if (!src || !dst) return;  // uniform across the block
  const int64_t d = a.dim;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A acc0 = A(0), acc1 = A(0);
  if (j < d) {
    int64_t s = threadIdx.y;
#pragma unroll 4
    for (; s + 32 < a.parts; s += 64) {
      acc0 += src[s * d + j];
      acc1 += src[(s + 32) * d + j];
    }
    if (s < a.parts) acc0 += src[s * d + j];
  }
  part[threadIdx.y][threadIdx.x] = acc0 + acc1;
  __syncthreads();
#pragma unroll
  for (int h = 16; h > 0; h >>= 1) {
    if (static_cast<int>(threadIdx.y) < h) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + h][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && j < d) store_as(dst, blockIdx.y == 0 ? a.gw_dtype : a.gb_dtype, j, part[0][threadIdx.x]);
}

// Note [Norm kernels]
// launch_norm and launch_norm_backward take the staged kernels (Note [Staged norm kernels] in rows_staged.cuh)
// for every packable row of at most 256 x 4 packs, else the register-resident kernels (norm_cached_kernel,
// norm_backward_cached_kernel; rows_norm_cached.cu), else the multi-pass kernels here; the partial rows of the
// parameter gradients are added by norm_param_finalize_wide_kernel. The staged kernels by row width:
// - forward, rows below kRegForwardMinDim (2048) elements: the parameters staged into shared memory by 16-byte
//   loads (stage_param); from 2048 up: the parameters in registers (NormParamsAt::reg / reg_narrow): a thread's
//   columns are the same in every row (packs lane, lane + tpr, ...), so it loads its own parameter values once,
//   straight from global memory, as packs of the row dtype for bf16 / f16 rows with bf16 / f16 (or no)
//   parameters (4 registers a pack and parameter), else as S, for rows of up to kRegNp packs per thread. That
//   removes per element of a bf16 row 8 of the 12 bytes of shared-memory traffic, per block the staging of
//   the parameters and its barrier, and per SM 2 D S of shared memory (32 KB at 4096-wide rows). Measured on
//   the H200 (bf16, ms shared memory / registers): layer_norm 16384x4096 0.0850 / 0.0806, rms_norm 0.0811 /
//   0.0797, but layer_norm 768 wide 0.0467 / 0.0480;
// - backward, rows below kClusterBackwardMinDim (2048): the weight in shared memory, one partial row of the
//   parameter gradients per block; from 2048 up: the cluster kernel (Note [Norm backward, clusters]; layer_norm
//   16384x4096 0.1142 against 0.1235 ms, rms_norm 0.1145 against 0.1167; at 768 wide the two are within 1.5 %
//   either way and at 384 wide the block kernel is faster, 0.0196 against 0.0214).
// The staged forward keeps the bf16 / f16 layer_norm shift (the row's first element) shuffled from lane 0 of
// the row group (of each warp for rows of more than a warp) instead of a cp.async per thread; the backward adds
// its per-block column sums over the row slots in a tree (log2(rows per block) barrier steps). ptxas (sm_90a,
// 256 threads, two blocks per SM, no spills in any instantiation), registers at 1 / 2 / 3 / 4 packs per thread,
// bf16: forward with the parameters in shared memory 62 / 79 / 80 / 95, in registers as bf16 packs 72 / 80 /
// 79 / 124 (the 3-pack kernel bounded to three blocks per SM, kStagedMinBlocks: 94 registers, two blocks,
// without), as float 77 / 95 / 120 / 125; backward 89 / 91 / 111 / 123. Every kernel is deterministic; the two
// forwards give the same bits, the two backwards the same gx (parameter gradients within rounding: another
// order of the block sums).
//
// Note [Norm backward, clusters]
// The backward of rows of at least 2048 elements is the staged backward (weight in shared memory) with three
// changes, aimed at the 16384 x 4096 bf16 layer_norm backward (0.766 of copy without them; rms_norm, which
// writes and finalizes half the partial sums, 0.823 on the same rows):
// - the dgamma / dbeta partial sums: the block kernel writes one (2, D) float row per block, 264 blocks x 2 x
//   4096 x 4 bytes = 8.7 MB at the end of the kernel (all blocks finish together: nothing overlaps that burst),
//   which the finalize reads back: 17 MB, 4 % of the 403 MB the backward streams, plus a finalize over 264
//   parts. Here the grid is launched in thread block clusters of 4 (or 2, whichever the device holds in one
//   wave with no block lost: pick_cluster, cudaOccupancyMaxActiveClusters) and the blocks of a cluster add
//   their sums into block 0 of the cluster through distributed shared memory (rank order: deterministic)
//   before it stores one row: 4 (or 2) times fewer rows to write and finalize. norm_backward_partials reports
//   the cluster count.
// - the row groups of more than a warp (D > 1024 bf16) reduce their two row sums at a named barrier of their
//   own (bar.sync 1 + row slot, tpr threads) instead of the block-wide __syncthreads, so the two 4096-wide rows
//   of a block do not wait for each other every iteration (at 2 blocks per SM, 16 warps, a block-wide barrier
//   stalls half the SM's warps until the slowest warp of the block has reduced);
// - the row statistics (mean, rstd) are copied once per warp (lane 0 of each row group of up to a warp) and
//   shuffled, instead of two 4- or 8-byte cp.async per thread (at 4096-wide rows, 2 of the 10 copy
//   instructions per warp and row group; the 8 others are the 16-byte g and x packs); the partial row is
//   stored with 16-byte stores.
// gx is bit-identical to the block kernel's (the same sums in the same order), the parameter gradients differ
// in rounding (another order of the block sums). ptxas (sm_90a): no spills; bf16 94 / 96 / 128 / 128 registers
// at 1 / 2 / 3 / 4 packs per thread, 5 barriers; two blocks per SM (launch bound and shared memory: 2 stages at
// 4096-wide rows).
std::atomic<int64_t> g_staged_forward{0}, g_staged_backward{0};

// The staged forward's kernel for rows of `dim` elements (Note [Norm kernels]).
constexpr int64_t kRegForwardMinDim = 2048;
StagedKind forward_kind(int64_t dim) { return dim >= kRegForwardMinDim ? StagedKind::reg : StagedKind::smem; }

// The staged backward's kernel for rows of `dim` elements (Note [Norm kernels]).
constexpr int64_t kClusterBackwardMinDim = 2048;
StagedKind backward_kind(int64_t dim) {
  return dim >= kClusterBackwardMinDim ? StagedKind::cluster : StagedKind::smem;
}
}  // namespace
NormStagedCounts norm_staged_counts() { return {g_staged_forward.load(), g_staged_backward.load()}; }

void launch_norm(const NormArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (const StagedGrid sg = norm_fwd_staged_grid(a, forward_kind(a.dim)); sg.np > 0) {
    launch_norm_staged(a, sg, stream);
    g_staged_forward.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (launch_norm_cached(a, stream)) return;
  const RowGrid g = row_grid(a.rows, a.dim);
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    norm_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("norm_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_norm", a.dtype);
}

namespace {
// The backward kernel that launch_norm_backward runs for a (row shape, alignment): staged (np > 0 in staged),
// register-resident (np > 0 in cached) or neither (the multi-pass kernel, no fused partial sums).
struct NormBwdPlan {
  StagedGrid staged;
  BwdGrid cached;
  int partials() const {
    return static_cast<int>(staged.np > 0 ? staged.blocks / staged.cluster : (cached.np > 0 ? cached.blocks : 0));
  }
};
NormBwdPlan norm_bwd_plan(const NormBackwardArgs& a) {
  NormBwdPlan p;
  p.staged = norm_bwd_staged_grid(a, backward_kind(a.dim));
  if (p.staged.np == 0) p.cached = norm_bwd_grid(a);
  return p;
}
}  // namespace

int norm_backward_partials(const NormBackwardArgs& a) {
  if (a.rows == 0) return 0;
  return norm_bwd_plan(a).partials();
}

void launch_norm_backward(const NormBackwardArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const NormBwdPlan plan = norm_bwd_plan(a);
  // gw_partial / gb_partial are only given when norm_backward_partials(a) > 0 (the same plan).
  if (plan.staged.np > 0) {
    launch_norm_backward_staged(a, plan.staged, stream);
    g_staged_backward.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (plan.cached.np > 0) {
    launch_norm_backward_cached(a, plan.cached, stream);
    return;
  }
  const RowGrid g = row_grid(a.rows, a.dim);
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    norm_backward_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("norm_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_norm_backward", a.dtype);
}

int norm_param_splits(int64_t rows, int64_t dim) {
  const int64_t tiles = (dim + 31) / 32;
  const int64_t want = (132 * 8 + tiles - 1) / tiles;  // about 8 blocks per SM in all
  const int64_t most = (rows + 63) / 64;               // at least 64 rows per split
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s < 1 ? 1 : (s > 65535 ? 65535 : s));
}

void launch_norm_param_grad(const NormParamGradArgs& a, cudaStream_t stream) {
  if (a.dim == 0) return;
  const int splits = norm_param_splits(a.rows, a.dim);
  const int64_t chunk = (a.rows + splits - 1) / splits;
  const dim3 grid(static_cast<unsigned>((a.dim + 31) / 32), static_cast<unsigned>(splits));
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    norm_param_grad_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(a, chunk);
    HT_CHECK_LAUNCH("norm_param_grad_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_norm_param_grad", a.dtype);
}

bool norm_param_dtype_ok(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16;
}

void launch_norm_param_finalize(const NormParamFinalizeArgs& a, cudaStream_t stream) {
  if (a.dim == 0) return;
  const dim3 grid(static_cast<unsigned>((a.dim + 31) / 32), 2);
  if (a.stat_dtype == DType::f64) norm_param_finalize_wide_kernel<double><<<grid, dim3(32, 32), 0, stream>>>(a);
  else norm_param_finalize_wide_kernel<float><<<grid, dim3(32, 32), 0, stream>>>(a);
  HT_CHECK_LAUNCH("norm_param_finalize_wide_kernel");
}

}  // namespace ht::kernels
