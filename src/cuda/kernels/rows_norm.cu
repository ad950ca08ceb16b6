// layer_norm / rms_norm (see rows.cuh): the choice of the norm kernel variant (Notes [Norm kernel variants] and
// [Norm backward, cluster variant] below), the public launchers, which run the staged kernels
// (rows_norm_staged_fwd.cu, rows_norm_staged_bwd.cu), the register-resident ones (rows_norm_cached.cu) or the
// multi-pass kernels here, and the parameter-gradient kernels: the multi-pass backward's column sums and the
// finalize that adds the partial rows of the fused backward kernels. Row groups as in rows.cu.
#include <atomic>

#include "cuda/kernels/rows_common.cuh"
#include "cuda/kernels/variant.h"

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
      return r * ((gh - mean_gh) - xh * mean_ghx);
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

template <class A>
__global__ void norm_param_finalize_kernel(NormParamFinalizeArgs a) {
  __shared__ A part[8][33];
  const A* src = static_cast<const A*>(blockIdx.y == 0 ? a.gw_partial : a.gb_partial);
  void* dst = blockIdx.y == 0 ? a.gw : a.gb;
  if (!src || !dst) return;  // uniform across the block
  const int64_t d = a.dim;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A acc = A(0);
  if (j < d)
    for (int64_t s = threadIdx.y; s < a.parts; s += 8) acc += src[s * d + j];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= d) return;
#pragma unroll
  for (int y = 1; y < 8; ++y) acc += part[y][threadIdx.x];
  store_as(dst, blockIdx.y == 0 ? a.gw_dtype : a.gb_dtype, j, acc);
}

// The same sums for norm kernel variant 2 with more threads in flight: a 32 x 32 block per 32 columns, lane y
// adding parts y, y + 32, ... (two interleaved accumulators, so two loads are in flight per step), then the 32
// lanes' sums in a fixed tree order (deterministic). For (264, 768) partial sums the 32 x 8 kernel above keeps
// only 48 blocks of 8 lanes, each walking 33 parts one load at a time.
template <class A>
__global__ void __launch_bounds__(1024) norm_param_finalize_wide_kernel(NormParamFinalizeArgs a) {
  __shared__ A part[32][33];
  grid_dependency_wait();  // the partial sums (a no-op unless launched programmatically: variant 3)
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

// Note [Norm kernel variants]
// 1 ("old"): the register-resident kernels (norm_cached_kernel, norm_backward_cached_kernel) and the 32 x 8
// finalize; 2 ("staged", the default): the staged kernels (Note [Staged norm kernels]) with the parameters in
// shared memory, and the wide finalize; 3 ("reg"): as 2 with the parameters in registers.
// Variant 2 is run 20's variant 3 ("tuned", fastest there on every row: layer_norm bwd 50432 x 768 0.803 of copy
// against 0.560 for the staged kernels of then and 0.429 old, 16640 x 384 0.461 against 0.173 / 0.263, fwd
// 0.72-0.77), folded into the staged kernels (the `tuned` flag and run 20's variant 2 are gone):
// - the backward's per-block column sums added over the row slots in a tree (every thread of the block takes
//   part, log2(rows per block) barrier steps) instead of tpr threads walking per_block slots in a dependent
//   chain per column (at 16640 x 384, 16 threads each ran 48 chains of 16 loads at the end of every block);
// - the forward's shift (bf16 / f16 layer_norm) shuffled from lane 0 of the row group for rows of at most a
//   warp (D <= 1024 bf16) instead of a cp.async of the row's first pack into an extra slot per thread;
// - the parameters staged into shared memory by 16-byte loads (stage_param) instead of element by element.
// Variant 3 (new, unmeasured at the time of writing) removes the parameters from shared memory: a thread's
// columns are the same in every row (packs lane, lane + tpr, ...), so it loads its own parameter values once,
// straight from global memory, into registers: as packs of the row dtype for bf16 / f16 rows with bf16 / f16
// (or no) parameters (NormParamsAt::reg_narrow, 4 registers a pack and parameter), else as S for rows of up to
// kFwdRegNp packs per thread; the backward its weight as S (up to kBwdRegNp). What it removes, per element
// of a bf16 row: the forward's 8 bytes of shared-memory parameter reads (two float loads per element, against
// 2 bytes of staged x; 12 bytes of shared-memory traffic per element become 4) and the backward's 4 of 12;
// per block, the staging of the parameters before the first row and the barrier after it (the forward needs no
// barrier before its first row: a thread's NaN check covers its own parameters only); per SM, 2 D S of
// shared memory (32 KB at 4096-wide rows), which leaves room for more stages. Also, for bf16 / f16 layer_norm
// rows of more than a warp (D > 1024 bf16), only lane 0 of each warp copies the row's first pack (the shift)
// and shuffles it to its warp, instead of every thread copying the same 16 bytes (at 4096-wide rows 128 copies
// per row, a quarter of the row's cp.async requests, become 4); and the finalize after its backward is a
// programmatic dependent launch (the backward blocks signal after their last row, the finalize waits in
// griddepcontrol.wait), hiding the launch gap that weighs at 13 MB shapes. ptxas (sm_90a, 256 threads, two
// blocks per SM, no spills in any instantiation), registers at 1 / 2 / 3 / 4 packs per thread, bf16: forward
// with the parameters in shared memory 62 / 79 / 80 / 95, in registers as bf16 packs 72 / 80 / 79 / 124 (the
// 3-pack kernel bounded to three blocks per SM, kStagedMinBlocks: 94 registers, two blocks, without), as
// float 77 / 95 / 120 / 125; backward 89 / 91 / 111 / 123 and (weight in registers) 76 / 110 / 126 / 128.
// All variants compute the same results within rounding (2 and 3 bit for bit when their backward grids match,
// as they do where both get two blocks per SM: the same arithmetic in the same order, the parameter-gradient
// partial sums being per block); each is deterministic. HADATRAIN_NORM_KERNEL=old (or 1) / staged (or 2; also "tuned") / reg (or
// 3), read once per process, picks the variant; unset, variant 2 runs except for rows of at least 2048
// elements, whose forward is variant 3's (forward_variant; run 22) and backward variant 4's (backward_variant;
// run 24). set_norm_kernel_variant overrides
// the environment (the GPU tests and bench_kernels run every variant). Variant 4: Note [Norm backward, cluster
// variant].
// Rows the staged kernels do not take (not packable, longer than 256 x 4 packs) use the register-resident or
// multi-pass kernels under every variant.
//
// Note [Norm backward, cluster variant]
// Variant 4 ("cluster", HADATRAIN_NORM_KERNEL=cluster or 4; the default backward of rows >= 2048 wide since
// run 24: layer_norm 16384x4096 0.1142 against variant 2's 0.1235 ms, 0.85 of a same-size copy) runs the default's
// forward (forward_variant) and variant 2's staged backward (weight in shared memory) with three changes, aimed
// at the 16384 x 4096 bf16 layer_norm backward (run 22: 0.766 of copy; rms_norm, which writes and finalizes
// half the partial sums, 0.823 on the same rows):
// - the dgamma / dbeta partial sums: variant 2 writes one (2, D) float row per block, 264 blocks x 2 x 4096 x 4
//   bytes = 8.7 MB at the end of the kernel (all blocks finish together: nothing overlaps that burst), which the
//   finalize reads back: 17 MB, 4 % of the 403 MB the backward streams, plus a finalize over 264 parts. Here
//   the grid is launched in thread block clusters of 4 (or 2, whichever the device holds in one wave with no
//   block lost: pick_cluster, cudaOccupancyMaxActiveClusters) and the blocks of a cluster add their sums into
//   block 0 of the cluster through distributed shared memory (rank order: deterministic) before it stores one
//   row: 4 (or 2) times fewer rows to write and finalize. norm_backward_partials reports the cluster count.
// - the row groups of more than a warp (D > 1024 bf16) reduce their two row sums at a named barrier of their
//   own (bar.sync 1 + row slot, tpr threads) instead of the block-wide __syncthreads, so the two 4096-wide rows
//   of a block do not wait for each other every iteration (at 2 blocks per SM, 16 warps, a block-wide barrier
//   stalls half the SM's warps until the slowest warp of the block has reduced);
// - the row statistics (mean, rstd) are copied once per warp (lane 0 of each row group of up to a warp) and
//   shuffled, instead of two 4- or 8-byte cp.async per thread (at 4096-wide rows, 2 of the 10 copy
//   instructions per warp and row group; the 8 others are the 16-byte g and x packs); the partial row is
//   stored with 16-byte stores.
// gx is bit-identical to variant 2's (the same sums in the same order; the GPU test compares the bits), the
// parameter gradients differ in rounding (another order of the block sums). ptxas (sm_90a): no spills; bf16
// 94 / 96 / 128 / 128 registers at 1 / 2 / 3 / 4 packs per thread (variant 2: 89 / 91 / 111 / 123), 5
// barriers; two blocks per SM as variant 2 (launch bound and shared memory: 2 stages at 4096-wide rows).
std::atomic<int> g_norm_variant_override{0};
std::atomic<int64_t> g_staged_forward{0}, g_staged_backward{0};

int env_norm_variant() {
  // unset: 0, by direction and width (forward_variant); "tuned" was variant 3 until run 20, now folded into 2,
  // as is any other value
  static const int v = env_variant("HADATRAIN_NORM_KERNEL",
                                   {{"old", 1}, {"staged", 2}, {"tuned", 2}, {"reg", 3}, {"cluster", 4}}, 0, 2);
  return v;
}
}  // namespace

int norm_kernel_variant() {
  const int o = g_norm_variant_override.load(std::memory_order_relaxed);
  if (o >= 1 && o <= kNormKernelVariants) return o;
  const int e = env_norm_variant();
  return e != 0 ? e : 2;
}

namespace {
// The forward's variant: norm_kernel_variant(), except that with neither an override nor
// HADATRAIN_NORM_KERNEL rows of at least kRegForwardMinDim elements take variant 3's forward (parameters in
// registers), the faster one there in run 22 (layer_norm 16384x4096 0.0806 against 0.0850 ms, rms_norm 0.0797
// against 0.0811), while variant 2 stays faster at 768 wide (0.0467 against 0.0480) and in the backward.
constexpr int64_t kRegForwardMinDim = 2048;
int forward_variant(int64_t dim) {
  const int o = g_norm_variant_override.load(std::memory_order_relaxed);
  if ((o < 1 || o > kNormKernelVariants) && env_norm_variant() == 0 && dim >= kRegForwardMinDim) return 3;
  const int v = norm_kernel_variant();
  // variant 4 changes the backward only; its forward is the default's (the rule above)
  if (v == 4) return dim >= kRegForwardMinDim ? 3 : 2;
  return v;
}

// The backward's variant: norm_kernel_variant(), except that with neither an override nor
// HADATRAIN_NORM_KERNEL rows of at least kClusterBackwardMinDim elements take variant 4's backward (thread
// block clusters), the faster one there in run 24 (layer_norm 16384x4096 0.1142 against 0.1235 ms, rms_norm
// 0.1145 against 0.1167), while at 768 wide the two are within 1.5 % either way (layer_norm 0.0677 against
// 0.0668, rms_norm 0.0669 against 0.0679) and at 384 wide variant 2 is faster (0.0196 against 0.0214).
constexpr int64_t kClusterBackwardMinDim = 2048;
int backward_variant(int64_t dim) {
  const int o = g_norm_variant_override.load(std::memory_order_relaxed);
  if ((o < 1 || o > kNormKernelVariants) && env_norm_variant() == 0 && dim >= kClusterBackwardMinDim) return 4;
  return norm_kernel_variant();
}
}  // namespace
void set_norm_kernel_variant(int variant) { g_norm_variant_override.store(variant, std::memory_order_relaxed); }
NormStagedCounts norm_staged_counts() { return {g_staged_forward.load(), g_staged_backward.load()}; }

void launch_norm(const NormArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const int variant = forward_variant(a.dim);
  if (variant >= 2) {
    if (const StagedGrid sg = norm_fwd_staged_grid(a, staged_kind(variant)); sg.np > 0) {
      launch_norm_staged(a, sg, stream);
      g_staged_forward.fetch_add(1, std::memory_order_relaxed);
      return;
    }
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
// The backward kernel that launch_norm_backward runs for a (variant, row shape, alignment): staged (np > 0 in
// staged), register-resident (np > 0 in cached) or neither (the multi-pass kernel, no fused partial sums).
struct NormBwdPlan {
  StagedGrid staged;
  BwdGrid cached;
  int partials() const {
    return static_cast<int>(staged.np > 0 ? staged.blocks / staged.cluster : (cached.np > 0 ? cached.blocks : 0));
  }
};
NormBwdPlan norm_bwd_plan(const NormBackwardArgs& a) {
  NormBwdPlan p;
  const int variant = backward_variant(a.dim);
  if (variant >= 2) p.staged = norm_bwd_staged_grid(a, staged_kind(variant));
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
  const int variant = norm_kernel_variant();
  if (variant == 3) {
    // A programmatic dependent launch: its blocks may be placed while the backward kernel's last blocks run
    // its epilogue, and wait in grid_dependency_wait (Note [Norm kernel variants]). A normal launch if refused.
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(32, 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e = a.stat_dtype == DType::f64 ? cudaLaunchKernelEx(&cfg, norm_param_finalize_wide_kernel<double>, a)
                                                     : cudaLaunchKernelEx(&cfg, norm_param_finalize_wide_kernel<float>, a);
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
  }
  if (variant >= 2) {
    if (a.stat_dtype == DType::f64) norm_param_finalize_wide_kernel<double><<<grid, dim3(32, 32), 0, stream>>>(a);
    else norm_param_finalize_wide_kernel<float><<<grid, dim3(32, 32), 0, stream>>>(a);
    HT_CHECK_LAUNCH("norm_param_finalize_wide_kernel");
    return;
  }
  if (a.stat_dtype == DType::f64) norm_param_finalize_kernel<double><<<grid, dim3(32, 8), 0, stream>>>(a);
  else norm_param_finalize_kernel<float><<<grid, dim3(32, 8), 0, stream>>>(a);
  HT_CHECK_LAUNCH("norm_param_finalize_kernel");
}

}  // namespace ht::kernels
