// HLA projection kernel (see hla.cuh). The slab of one (sample, block p, column tile) lives in shared memory as
// f32 rows of `stride` = tile + 1 floats (the pad spreads the column reads of the channels layout over the
// banks). The butterfly runs up to three stages per pass in registers (Note [HLA butterfly passes]): the first
// pass is fused with the load from global memory through a loader (strided columns, or the im2col columns of
// an image: Note [HLA loaders]), the others read and write the slab, separated by __syncthreads. Every element
// sees the same adds and subtracts in the same stage order as the CPU (__fadd_rn / __fsub_rn, no contraction),
// so the bits equal the CPU reference's, for every loader below.
//
// Note [HLA butterfly passes]
// A pass of G stages h = 2^h_log ... 2^(h_log + G − 1) gives each thread item (k, c) the 2^G rows
// j0 + m·2^h_log (m < 2^G) of column c, j0 = (k >> h_log) << (h_log + G) | (k & (2^h_log − 1)); the items are
// disjoint and closed under those stages, so the pass needs no barrier inside, and each element sees stage h
// before stage 2h exactly as in the stage-by-stage definition (the pair (a, b) at stage h depends only on the
// values that stage h/2 left in a and b). Any split of the n_log stages into consecutive passes therefore
// gives the same bits. Here: the first pass, min(3, n_log) stages, fused with the load, then passes of up to 3
// stages over the slab, then the kept rows are read from the slab (n = 1024: 3 + 3 + 3 + 1, four slab writes
// and four reads). Measured against a kernel with the same passes without a loader and two register forms
// with up to 5 or 4 stages a pass that write the kept rows from registers: the same bits, this one the
// fastest (docs/gradient_pipelines.md, "CUDA kernel").
//
// Note [HLA loaders]
// The first pass loads rows j0 ... j0 + 2^G − 1 (consecutive positions l = p·n + j) of one column of the CTA's
// tile through a loader: StridedColumns reads x (B, L, C) with element strides; Im2colColumns reads the image
// through unfold2d's index map (include/hadatrain/ops/unfold.h): column k = ch·kh·kw + i·kw + j at position
// l = oh·OW + ow is x[n, ch, oh·sh − ph + i·dh, ow·sw − pw + j·dw], +0 in the padding. The composition
// hla_project(unfold2d(x)) copies those very values (dtype T, +0 in the padding) into the columns and converts
// them to f32 before the butterfly; the fused loader converts the same T values at the same (position,
// column): the butterfly inputs are the same floats, hence the same bits.
//
// Note [HLA im2col tiles]
// A CTA of the im2col loader owns `tile` consecutive columns k0 ... k0 + tile − 1 (the strided loader's
// mapping; at n = 1024 the slab bounds tile to 16, the taps of 1–3 channels of a 3x3 conv): each kept row is
// written as one contiguous run of the output row, and a warp's image reads are spread over those taps (for a
// channels-last image ~9 pixels, mostly L1 hits since neighbouring positions' taps overlap). The other mapping,
// `taps` (one tap of 16+ consecutive channels a CTA: coalesced channels-last reads, output columns kh·kw floats
// apart), is slower on one H200 (bench_hla unfolded rows, bf16 channels-last, batch 256, ms unfold2d +
// projection / runs / taps: C64 32x32 0.679 / 0.739 / 0.763, C128 16x16 0.244 / 0.234 / 0.369, C512 4x4
// 0.094 / 0.0745 / 0.1065; ResNet-34 HLQ step 21.44 / 21.55 / 23.31).
#include <algorithm>
#include <type_traits>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/cp_async.cuh"
#include "cuda/kernels/hla.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

constexpr int kHlaThreads = 256;
constexpr int64_t kHlaSlabFloats = 16384;  // n · tile target: 64 KiB of f32
constexpr int kRadix = 3;                  // butterfly stages in registers per shared-memory pass

struct HlaGeometry {
  int tile_log;         // columns per CTA: tile = 2^tile_log (the last tile may hold fewer real columns)
  int n_log;            // n = 2^n_log
  int stride;           // floats per slab row in shared memory
  size_t smem;          // bytes: slab + kept indices
  int64_t slab_floats;  // (n, stride)
  int64_t tiles;        // CTAs per (sample, block): column tiles
  // Slab offset of (row, column c).
  __device__ __forceinline__ int at(int row, int c) const { return row * stride + c; }
};

int log2_of(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

// columns: the output columns the tiles cover (C, or C·kh·kw for the im2col loader).
HlaGeometry hla_geometry(int64_t block, int64_t kept, int64_t columns) {
  HlaGeometry g{};
  g.n_log = log2_of(block);
  // Columns per CTA: 4096 / n for n <= 64 (at most 256), so that a CTA has at least 4096 elements to work on (with
  // 2048, the 56x56 maps' n = 64 gave 112 896 CTAs of 8 elements a thread for a ResNet-50 3x3 conv, whose fixed
  // work — the loader's divisions, the kept rows, three barriers — ran the kernel at 0.5 TB/s); 32 for larger n;
  // at most kHlaSlabFloats / n (at least 1) for large n.
  int64_t cap = 4096 / block;
  cap = cap < 32 ? 32 : (cap > 256 ? 256 : cap);
  int64_t tile = kHlaSlabFloats / block;
  tile = tile < 1 ? 1 : (tile > cap ? cap : tile);
  const int64_t c_pow2 = int64_t{1} << log2_of(columns);
  if (tile > c_pow2) tile = c_pow2;
  g.tile_log = log2_of(tile);
  g.tiles = (columns + tile - 1) / tile;
  g.stride = static_cast<int>(tile > 1 ? tile + 1 : 1);
  g.slab_floats = block * g.stride;
  g.smem = static_cast<size_t>(g.slab_floats) * sizeof(float) + static_cast<size_t>(kept) * sizeof(int16_t);
  return g;
}

// What every CTA writes: out (B, R, K) rows or (B, K, R) channels, R = (L / n)·r.
struct HlaOutput {
  int64_t B = 0, L = 0, K = 0;  // samples, positions, output columns
  int64_t block = 1, kept = 1;  // n, r
  bool channels = false;
  float* out;
  float* absmax;
};

// The 2^G-point butterfly on registers: stages 1, 2, ..., 2^(G-1) in order, (a, b) <- (a + b, a - b).
template <int G>
__device__ __forceinline__ void butterfly(float* v) {
#pragma unroll
  for (int s = 0; s < G; ++s)
#pragma unroll
    for (int m = 0; m < (1 << G); ++m)
      if (((m >> s) & 1) == 0) {
        const float a = v[m], b = v[m + (1 << s)];
        v[m] = __fadd_rn(a, b);
        v[m + (1 << s)] = __fsub_rn(a, b);
      }
}

// ---- loaders (Note [HLA loaders]) ----
// Each is built per CTA from its parameters and (sample b, first position l0 = p·n, tile index ti); it knows
// the tile's real width and where its columns go in the output: column c of the tile is output column
// out_base + c. kMinBlocks: the CTAs per SM its kernel's registers must allow (ptxas -v, sm_90a,
// CUDA 12): 6 for both loaders (40 registers with no spill; 6 for small n, where shared memory allows more).
// Without a bound they take 45–61.

struct StridedParams {
  const void* x;  // (B, L, C), element strides sb, sl, sc
  int64_t sb, sl, sc, C;
};

template <class T>
struct StridedColumns {
  using Params = StridedParams;
  static constexpr int kMinBlocks = 6;
  const T* x;  // at (b, l0, c0)
  int64_t sl, sc;
  int width;
  int64_t out_base;

  __device__ StridedColumns(const Params& q, const HlaGeometry& g, int64_t b, int64_t l0, int64_t ti) {
    const int64_t tile = int64_t{1} << g.tile_log, c0 = ti * tile;
    x = static_cast<const T*>(q.x) + b * q.sb + l0 * q.sl + c0 * q.sc;
    sl = q.sl;
    sc = q.sc;
    width = static_cast<int>(q.C - c0 < tile ? q.C - c0 : tile);
    out_base = c0;
  }
  // v[m] = x at position l0 + j0 + m, column c of the tile (0 past the tile's width).
  template <int M>
  __device__ __forceinline__ void load(float* v, int j0, int c) const {
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = c < width ? convert<float>(x[(j0 + m) * sl + c * sc]) : 0.0f;
  }
};

struct Im2colParams {
  const void* x;  // (N, C, H, W), element strides sn, sc, sh, sw; offsets inside one sample fit int32
  int64_t sn;
  int sc, sh, sw;
  int C, H, W, OW, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

template <class T>
struct Im2colColumns {
  using Params = Im2colParams;
  static constexpr int kMinBlocks = 6;
  const T* x;  // image of sample b
  Params q;  // by value (kernel parameters: the compiler reads them from the parameter space)
  int64_t l0;
  int kk;  // kh·kw
  int k0;  // first column (Note [HLA im2col tiles])
  int width;
  int64_t out_base;

  __device__ Im2colColumns(const Params& p, const HlaGeometry& g, int64_t b, int64_t l0_, int64_t ti) : q(p) {
    const int tile = 1 << g.tile_log;
    x = static_cast<const T*>(p.x) + b * p.sn;
    l0 = l0_;
    kk = p.kh * p.kw;
    k0 = static_cast<int>(ti) * tile;
    width = p.C * kk - k0 < tile ? p.C * kk - k0 : tile;
    out_base = k0;
  }
  template <int M>
  __device__ __forceinline__ void load(float* v, int j0, int c) const {
    if (c >= width) {
#pragma unroll
      for (int m = 0; m < M; ++m) v[m] = 0.0f;
      return;
    }
    const int ch = (k0 + c) / kk, t = k0 + c - ch * kk;
    const int i = t / q.kw, j = t - i * q.kw;
    const int dy = i * q.dil_h - q.pad_h, dx = j * q.dil_w - q.pad_w;
    const T* xc = x + ch * q.sc;
    const int l = static_cast<int>(l0) + j0;  // L = OH·OW < 2^31
    int oh = l / q.OW, ow = l - oh * q.OW;
    int iy = oh * q.stride_h + dy, ix = ow * q.stride_w + dx;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const bool in = iy >= 0 && iy < q.H && ix >= 0 && ix < q.W;
      v[m] = in ? convert<float>(xc[iy * q.sh + ix * q.sw]) : 0.0f;  // 32-bit offsets: see Im2colParams
      if (++ow == q.OW) {  // next output row
        ow = 0;
        ix = dx;
        iy += q.stride_h;
      } else {
        ix += q.stride_w;
      }
    }
  }
};

// Where the CTA's kept rows go (HlaOutput's layout, the loader's columns).
struct CtaOutput {
  float* o;        // rows: out + (b·R + p·r)·K + out_base; channels: out + (b·K + out_base)·R + p·r
  int64_t row;     // rows: K (the next kept row); channels: 1
  int64_t col;     // rows: 1; channels: R
  __device__ void put(int i, int c, float v, float& amax) const {
    o[i * row + c * col] = v;
    amax = fmaxf(amax, fabsf(v));
  }
};

// Where the kept rows of sample b, block p go, for a loader whose columns start at output column out_base.
__device__ __forceinline__ CtaOutput output_of(const HlaOutput& a, int64_t b, int64_t p, int64_t out_base) {
  const int64_t r = a.kept, R = a.L / a.block * r;
  CtaOutput out;
  if (!a.channels) {
    out.o = a.out + (b * R + p * r) * a.K + out_base;
    out.row = a.K;
    out.col = 1;
  } else {
    out.o = a.out + (b * a.K + out_base) * R + p * r;
    out.row = 1;
    out.col = R;
  }
  return out;
}

// Folds each thread's max |written value| into *a.absmax when asked: a warp maximum, then one atomicMax on the
// bits per warp (non-negative floats order like them), skipped when *a.absmax, read from the L2, already holds at
// least that much (it only grows: a stale read costs an atomic that changes nothing, never a lost maximum; the
// atomics on one address are serialised in the L2). Called by every thread of the CTA.
__device__ __forceinline__ void fold_amax(const HlaOutput& a, float amax) {
  if (!a.absmax) return;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (threadIdx.x % 32 == 0 && amax > 0.0f && amax > __ldcg(a.absmax))
    atomicMax(reinterpret_cast<unsigned int*>(a.absmax), __float_as_uint(amax));
}

// One pass of G stages from h = 2^h_log (Note [HLA butterfly passes]). kLoad: the rows come from the loader
// (h_log = 0, the first pass), else from the slab; they go back to the slab.
template <int G, bool kLoad, class Loader>
__device__ __forceinline__ void hla_pass(float* slab, const HlaGeometry& g, int h_log, const Loader& ld) {
  const int tile_mask = (1 << g.tile_log) - 1, items = (1 << (g.n_log - G)) << g.tile_log;
  for (int q = threadIdx.x; q < items; q += blockDim.x) {
    const int c = q & tile_mask, k = q >> g.tile_log;
    const int j0 = ((k >> h_log) << (h_log + G)) | (k & ((1 << h_log) - 1));
    float v[1 << G];
    if constexpr (kLoad) {
      ld.template load<(1 << G)>(v, j0, c);
    } else {
#pragma unroll
      for (int m = 0; m < (1 << G); ++m) v[m] = slab[g.at(j0 + (m << h_log), c)];
    }
    butterfly<G>(v);
#pragma unroll
    for (int m = 0; m < (1 << G); ++m) slab[g.at(j0 + (m << h_log), c)] = v[m];
  }
}

// Runs f(std::integral_constant<int, G>) for the runtime G in [kMin, kRadix] (only those are instantiated).
template <int kMin, class F>
__device__ __forceinline__ void with_stages(int G, F&& f) {
  static_assert(kMin == 0 || kMin == 1);
  switch (G) {
    case 0: if constexpr (kMin == 0) f(std::integral_constant<int, 0>{}); break;
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
  }
}

// What the slab kernels' CTA works on: sample b, block p (of P per sample) and column tile ti.
struct CtaBlock {
  int64_t b, p, ti;
};
__device__ __forceinline__ CtaBlock cta_block(const HlaGeometry& g, int64_t P) {
  const int64_t cta = blockIdx.x;
  const int64_t ti = cta % g.tiles, p = (cta / g.tiles) % P, b = cta / (g.tiles * P);
  return {b, p, ti};
}

// The whole butterfly of the CTA's block into the slab: the first pass from the loader, then passes of up to
// kRadix stages over the slab (Note [HLA butterfly passes]); the slab is complete when it returns.
template <class Loader>
__device__ __forceinline__ void butterfly_slab(float* slab, const HlaGeometry& g, const Loader& ld) {
  const int first = g.n_log < kRadix ? g.n_log : kRadix;
  with_stages<0>(first, [&](auto gc) { hla_pass<decltype(gc)::value, true>(slab, g, 0, ld); });
  for (int h_log = first; h_log < g.n_log;) {
    const int stages = g.n_log - h_log < kRadix ? g.n_log - h_log : kRadix;
    __syncthreads();
    with_stages<1>(stages, [&](auto gc) { hla_pass<decltype(gc)::value, false>(slab, g, h_log, ld); });
    h_log += stages;
  }
  __syncthreads();
}

template <class T, class Loader>
__global__ void __launch_bounds__(kHlaThreads, Loader::kMinBlocks)
    hla_project_kernel(HlaOutput a, typename Loader::Params lp, HlaGeometry g, const __grid_constant__ HlaRows rows) {
  extern __shared__ float slab[];                                      // (n, stride)
  int16_t* kept = reinterpret_cast<int16_t*>(slab + g.slab_floats);  // (r)
  const int n = static_cast<int>(a.block), r = static_cast<int>(a.kept), tile = 1 << g.tile_log;
  const auto [b, p, ti] = cta_block(g, a.L / n);
  const Loader ld(lp, g, b, p * n, ti);
  const CtaOutput out = output_of(a, b, p, ld.out_base);
  float amax = 0.0f;  // max |value| this thread wrote (fmaxf: NaN never wins)

  for (int k = threadIdx.x; k < r; k += blockDim.x) kept[k] = rows.idx[k];
  butterfly_slab(slab, g, ld);
  const int width = ld.width;
  if (!a.channels) {  // out (B, R, K): row i's columns, contiguous
    for (int e = threadIdx.x; e < (r << g.tile_log); e += blockDim.x) {
      const int i = e >> g.tile_log, c = e & (tile - 1);
      if (c < width) out.put(i, c, slab[g.at(kept[i], c)], amax);
    }
  } else {  // out (B, K, R): runs of r contiguous floats per column
    for (int e = threadIdx.x; e < r * width; e += blockDim.x) {
      const int c = e / r, i = e - c * r;
      out.put(i, c, slab[g.at(kept[i], c)], amax);
    }
  }
  fold_amax(a, amax);
}

// ---- the back-projection (launch_hla_back_project) ----
// The first pass loads row j of the block from g's kept row inv[j] (zeros at the rows not kept); inv, the kept
// position of each natural index or −1, sits in shared memory after the slab. The passes are the projection's,
// so the butterfly is the CPU's; the CTA then writes all n rows of its tile, mult times each, rounded once.
struct KeptRows {
  const float* g;  // at (b, p·r, c0)
  int64_t sr, sc;
  int width;
  const int16_t* inv;
  template <int M>
  __device__ __forceinline__ void load(float* v, int j0, int c) const {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int i = inv[j0 + m];
      v[m] = (c < width && i >= 0) ? g[i * sr + c * sc] : 0.0f;
    }
  }
};

template <class Out>
__global__ void __launch_bounds__(kHlaThreads) hla_back_project_kernel(HlaBackArgs a, HlaGeometry g,
                                                                       const __grid_constant__ HlaRows rows) {
  extern __shared__ float slab[];                                     // (n, stride)
  int16_t* inv = reinterpret_cast<int16_t*>(slab + g.slab_floats);  // (n)
  const int n = static_cast<int>(a.block), r = static_cast<int>(a.kept), tile = 1 << g.tile_log;
  const auto [b, p, ti] = cta_block(g, a.L / n);
  const int64_t c0 = ti * tile;
  const int width = static_cast<int>(a.C - c0 < tile ? a.C - c0 : tile);
  for (int j = threadIdx.x; j < n; j += blockDim.x) inv[j] = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < r; i += blockDim.x) inv[rows.idx[i]] = static_cast<int16_t>(i);
  __syncthreads();
  const KeptRows ld{a.g + b * a.sb + p * r * a.sr + c0 * a.sc, a.sr, a.sc, width, inv};
  butterfly_slab(slab, g, ld);
  Out* o = static_cast<Out*>(a.out) + (b * a.L + p * n) * a.C + c0;
  for (int e = threadIdx.x; e < (n << g.tile_log); e += blockDim.x) {
    const int j = e >> g.tile_log, c = e & (tile - 1);
    if (c < width) o[j * a.C + c] = store_cast<Out>(__fmul_rn(slab[g.at(j, c)], a.mult));
  }
}

// Note [HLA small blocks]
// For n <= 16 every butterfly stage fits one thread's registers: hla_project_small_kernel gives each thread
// whole items (block p, column c): it loads the n rows of column c through the loader, runs the same butterfly
// as the slab kernel's first pass (stages h = 1, 2, ..., n/2 in order: the same bits), and writes the kept rows
// from registers, with no shared memory and no barrier. A CTA owns `blocks` consecutive blocks of one sample
// and column tile (about 32 elements per thread), where the slab kernel gave each (sample, block, tile) a CTA
// of its own: at n = 4 that was 2 KiB of input per CTA. Rows layout only: a thread's kept rows are K floats
// apart there, so a warp writes whole runs; in the channels layout its r values are contiguous but the warp's
// writes are R floats apart, and the slab kernel (which writes runs of r) is faster. Measured (H200, bench_hla,
// bf16, ms, small / slab): ViT-B (256, 196 of 197, 3072) n 4 rows 0.344 / 0.560, channels 2.08 /
// 0.650; (256, 208, 768) n 16 rows 0.096 / 0.126; im2col C256 14x14 n 4 0.180 / 0.271, C512 4x4 n 16 0.077 /
// 0.073. HLQ's projections use the rows layout: split_extra's 196 tokens (n = 4), pad's multiples of 16 and
// the 14×14 and 4×4 maps of ResNet-50 and the CIFAR ResNets.
constexpr int kHlaSmallMaxLog = 4;

template <int G, class T, class Loader>
__device__ __forceinline__ void hla_small_items(const HlaOutput& a, const typename Loader::Params& lp,
                                                const HlaGeometry& g, const HlaRows& rows, int64_t b,
                                                int64_t p_first, int64_t p_count, int64_t ti, float& amax) {
  constexpr int n = 1 << G;
  const int r = static_cast<int>(a.kept), tile_mask = (1 << g.tile_log) - 1;
  for (int64_t q = threadIdx.x; q < (p_count << g.tile_log); q += blockDim.x) {
    const int c = static_cast<int>(q & tile_mask);
    const int64_t p = p_first + (q >> g.tile_log);
    const Loader ld(lp, g, b, p * n, ti);
    if (c >= ld.width) continue;
    float v[n];
    ld.template load<n>(v, 0, c);
    butterfly<G>(v);
    const CtaOutput out = output_of(a, b, p, ld.out_base);
    for (int i = 0; i < r; ++i) {
      const int k = rows.idx[i];
      float o = v[0];
#pragma unroll
      for (int m = 1; m < n; ++m)
        if (m == k) o = v[m];  // a select per row: no dynamic indexing of the register array
      out.put(i, c, o, amax);
    }
  }
}

template <class T, class Loader>
__global__ void __launch_bounds__(kHlaThreads)  // 64 registers (ptxas -v, sm_90a); a bound of 5 or 6 CTAs spills
    hla_project_small_kernel(HlaOutput a, typename Loader::Params lp, HlaGeometry g, int64_t blocks,
                             const __grid_constant__ HlaRows rows) {
  const int64_t P = a.L / a.block, groups = (P + blocks - 1) / blocks;
  const int64_t cta = blockIdx.x;
  const int64_t ti = cta % g.tiles, pg = (cta / g.tiles) % groups, b = cta / (g.tiles * groups);
  const int64_t p_first = pg * blocks, p_count = P - p_first < blocks ? P - p_first : blocks;
  float amax = 0.0f;  // max |value| this thread wrote (fmaxf: NaN never wins)
  switch (g.n_log) {
    case 0: hla_small_items<0, T, Loader>(a, lp, g, rows, b, p_first, p_count, ti, amax); break;
    case 1: hla_small_items<1, T, Loader>(a, lp, g, rows, b, p_first, p_count, ti, amax); break;
    case 2: hla_small_items<2, T, Loader>(a, lp, g, rows, b, p_first, p_count, ti, amax); break;
    case 3: hla_small_items<3, T, Loader>(a, lp, g, rows, b, p_first, p_count, ti, amax); break;
    case 4: hla_small_items<4, T, Loader>(a, lp, g, rows, b, p_first, p_count, ti, amax); break;
  }
  fold_amax(a, amax);
}

// Note [HLA wide blocks]
// For 256 <= n <= 2048 in the rows layout (the token axis of an LLaMA at 2048 tokens, n = 2048; a CIFAR ResNet's
// 32×32 and 16×16 maps), with 8 contiguous 16-byte-aligned columns per tile, the slab kernel reads 8 columns of a
// row as eight 2-byte loads and runs four barrier-separated passes over a 2048 × 8 slab: 0.75 TB/s of its minimal
// bytes at LLaMA shapes (bench_kernels --only hla on the H200: (4, 2048, 4096) bf16 0.136 ms). This kernel gives
// each of its n / 8 threads 8 rows × 8 columns of a tile (64 floats in registers) and runs the butterfly in
// phases of three stages: phase p holds row bits base(p) ... base(p) + 2 in a thread's registers (base = 3p, or
// n_log − 3 for the last phase, whose lower bits are then already done) and the other row bits in the thread index
// (wide_thread_rows), runs the stages of row bits 3p ... 3p + 2 in registers, and hands the values to the next
// phase through a shared-memory slab (n rows × 8 floats: one write and one read of 16-byte units per value,
// between two barriers). n = 2048 takes four phases (3 + 3 + 3 + 2 stages), 256 three. Each element sees the
// stages in order h = 1, 2, ..., n/2 with __fadd_rn / __fsub_rn (lower + upper, lower − upper), so the bits are
// the CPU's (Note [HLA butterfly passes]). A thread then writes each of its rows that is kept (inv[row], a
// natural-to-kept table in shared memory) as two 16-byte stores.
// Blocks are persistent (occupancy × SMs of them, each walking the tiles gridDim.x apart) and stage the next tile
// with cp.async into a buffer of the raw input as soon as every thread has read the current one, so its loads
// land while the current tile computes. A thread copies and reads only its own rows of that buffer (phase 0's rows
// 8t ... 8t + 7). Both the buffer's and the slab's 16-byte units are permuted inside each 128-byte line
// (wide_in_unit, wide_slab_unit) so that the 8 lanes of a 16-byte phase fall in 8 different bank groups, both
// for phase 0's rows (differing in row bits 3 ... 5 across lanes) and for the later phases' (consecutive rows).
// Shared memory at n = 2048, bf16: 32 KiB buffer + 64 KiB slab + 4 KiB table, two blocks of 256 threads an SM.
// Earlier forms, all slower on the H200 ((4, 2048, 4096) / (4, 2048, 14336) bf16, ms): row bits 3 ... 7 across
// the lanes of a warp by shuffles, one exchange for the rest, non-persistent (0.085 / 0.271; ncu: 80 % of the L1
// pipe, DRAM 18 %); the same with half the shuffles (a lane pair swaps half its values) and persistent blocks with
// a cp.async double buffer (0.075 / 0.238; 24 % occupancy; its PTX has about 39 instructions a value, the shuffle
// stages' selects and shuffles were the most); 32 rows × 2 columns a thread with one exchange (0.099 / 0.315:
// latency-bound on its 4-byte loads); shuffles for two stages, then an exchange (0.105 / 0.339); and these phases
// on tiles of 4 columns (32 floats and 64 registers a thread, four blocks an SM, 8-byte cp.async rows for bf16;
// git branch hla-4col): its bits passed test_gpu_grad_hla, but it took 0.149 / 0.535 ms, twice this kernel's time.
constexpr int kWideCols = 8;
constexpr int kWideMinLog = 8, kWideMaxLog = 11;

// The 16-byte unit of the staging buffer that holds row `row`, part h < U of its 8 input values (U = 1 for 2-byte,
// 2 for 4-byte elements): the low three bits XOR'd with row bits 3 ... 5, so that the 8 lanes of a 16-byte phase
// (rows 8t + m) read 8 different bank groups.
template <int U>
__device__ __forceinline__ int wide_in_unit(int row, int h) {
  return (U * row + h) ^ ((row >> 3) & 7);
}

// The exchange slab's 16-byte unit of row `row`, columns 4h ... 4h + 3: a permutation inside each 128-byte line
// under which the 8 lanes of a 16-byte phase fall in 8 different bank groups both when they hold rows 8t + m (rows
// differing in bits 3 ... 5: phase 0's writes) and when they hold consecutive rows (every later phase).
__device__ __forceinline__ int wide_slab_unit(int row, int h) {
  return (2 * row + h) ^ ((((row >> 2) ^ (row >> 3)) & 1) | (((row >> 4) & 1) << 1) | (((row >> 5) & 1) << 2));
}

// The 8 values of T in raw (16 or 32 bytes) as floats.
template <class T>
__device__ __forceinline__ void convert8(const uint4* raw, float* v) {
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int c = 0; c < kWideCols; ++c) v[c] = convert<float>(e[c]);
}

// The butterfly stage of register bit k (v[m] with bit k of m clear is the lower row): (a, b) <- (a + b, a − b).
template <int K>
__device__ __forceinline__ void butterfly_bit(float (&v)[8][kWideCols]) {
#pragma unroll
  for (int m = 0; m < 8; ++m)
    if (((m >> K) & 1) == 0)
#pragma unroll
      for (int c = 0; c < kWideCols; ++c) {
        const float a = v[m][c], b = v[m + (1 << K)][c];
        v[m][c] = __fadd_rn(a, b);
        v[m + (1 << K)][c] = __fsub_rn(a, b);
      }
}

// Phase p of the wide kernel: its registers hold row bits wide_base(p) ... + 2 (Note [HLA wide blocks]).
template <int N>
__device__ __forceinline__ constexpr int wide_base(int p) {
  return 3 * p < N - 3 ? 3 * p : N - 3;
}

// The row that v[m] of thread t holds in phase p is wide_thread_rows(p, t) | m << wide_base(p): bits base ...
// base + 2 from m, the others from t in order. The swizzles are XORs of row bits, so a unit's index is the thread's
// base unit XOR a constant of (m, h) (wide_slab_unit(r | m, h) = wide_slab_unit(r, 0) ^ wide_slab_unit(m, h) for
// disjoint bits): one operation per access, and no per-(m, h) addresses for the compiler to keep in registers.
template <int N>
__device__ __forceinline__ int wide_thread_rows(int p, int t) {
  const int b = wide_base<N>(p);
  return (t & ((1 << b) - 1)) | ((t >> b) << (b + 3));
}

// Shared memory of hla_project_wide_kernel<T, N>: the staging buffer (n rows × 8 values of T), the exchange slab
// (n rows × 8 floats), then inv (n int16).
template <class T, int N>
constexpr size_t wide_smem_bytes() {
  return (size_t{1} << N) * (kWideCols * (sizeof(T) + sizeof(float)) + sizeof(int16_t));
}

template <class T, int N>
__global__ void __launch_bounds__((1 << N) / 8, 2 << (kWideMaxLog - N))  // 512 threads an SM: 128 registers
    hla_project_wide_kernel(HlaOutput a, const T* __restrict__ x, int64_t sb, int64_t sl, int64_t tiles,
                            const __grid_constant__ HlaRows rows) {
  constexpr int n = 1 << N, kThreads = n / 8, kPhases = (N + 2) / 3;
  constexpr int U = static_cast<int>(sizeof(T)) / 2;  // 16-byte units of a row's 8 input values
  extern __shared__ uint4 smem[];
  uint4* in = smem;                                       // n·U units
  float4* slab = reinterpret_cast<float4*>(smem + n * U);  // n·8 floats
  int16_t* inv = reinterpret_cast<int16_t*>(slab + 2 * n);
  const int t = static_cast<int>(threadIdx.x);
  const int64_t P = a.L / n, total = a.B * P * tiles;

  // the copies of tile j's rows 8t ... 8t + 7 (each thread copies the units it reads)
  const int in_base = wide_in_unit<U>(8 * t, 0);  // wide_in_unit(8t + m, h) = in_base ^ wide_in_unit(m, h)
  auto stage = [&](int64_t j) {
    const int64_t ti = j % tiles, p = (j / tiles) % P, b = j / (tiles * P);
    const T* src = x + b * sb + (p * n + 8 * t) * sl + ti * kWideCols;
#pragma unroll
    for (int m = 0; m < 8; ++m)
#pragma unroll
      for (int h = 0; h < U; ++h) cp_async16(in + (in_base ^ wide_in_unit<U>(m, h)), src + m * sl + h * (8 / U));
    cp_async_commit();
  };
  int64_t j = blockIdx.x;
  if (j < total) stage(j);
  // the kept-row table, while the first tile's copies are in flight
  for (int i = t; i < n; i += kThreads) inv[i] = -1;
  __syncthreads();
  for (int i = t; i < a.kept; i += kThreads) inv[rows.idx[i]] = static_cast<int16_t>(i);
  // (the first barrier of the loop orders these writes before the reads of inv)

  float amax = 0.0f;
  for (; j < total; j += gridDim.x) {
    cp_async_wait(0);  // this thread's copies of tile j have landed
    float v[8][kWideCols];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      uint4 raw[U];
#pragma unroll
      for (int h = 0; h < U; ++h) raw[h] = in[in_base ^ wide_in_unit<U>(m, h)];
      convert8<T>(raw, v[m]);
    }
    __syncthreads();  // every thread has read the buffer (and the previous tile's slab)
    if (j + gridDim.x < total) stage(j + gridDim.x);  // lands while this tile computes
    butterfly_bit<0>(v);  // phase 0: h = 1, 2, 4
    butterfly_bit<1>(v);
    butterfly_bit<2>(v);
#pragma unroll
    for (int p = 1; p < kPhases; ++p) {
      if (p > 1) __syncthreads();  // the previous exchange's reads are done
      const int wb = wide_slab_unit(wide_thread_rows<N>(p - 1, t), 0);  // write and read bases
      const int rb = wide_slab_unit(wide_thread_rows<N>(p, t), 0);
#pragma unroll
      for (int m = 0; m < 8; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          slab[wb ^ wide_slab_unit(m << wide_base<N>(p - 1), h)] =
              make_float4(v[m][4 * h], v[m][4 * h + 1], v[m][4 * h + 2], v[m][4 * h + 3]);
      __syncthreads();
#pragma unroll
      for (int m = 0; m < 8; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float4 e = slab[rb ^ wide_slab_unit(m << wide_base<N>(p), h)];
          v[m][4 * h] = e.x;
          v[m][4 * h + 1] = e.y;
          v[m][4 * h + 2] = e.z;
          v[m][4 * h + 3] = e.w;
        }
      // the stages of row bits 3p ... 3p + 2 (below N): register bits 3p − base ... 2
      const int first = 3 * p - wide_base<N>(p);
      if (first <= 0) butterfly_bit<0>(v);
      if (first <= 1) butterfly_bit<1>(v);
      butterfly_bit<2>(v);
    }
    const int64_t ti = j % tiles, p = (j / tiles) % P, b = j / (tiles * P);
    const int64_t r = a.kept, R = P * r;
    float* o = a.out + (b * R + p * r) * a.K + ti * kWideCols;
    const int out_rows = wide_thread_rows<N>(kPhases - 1, t);
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int i = inv[out_rows | m << wide_base<N>(kPhases - 1)];
      if (i < 0) continue;
      float4* dst = reinterpret_cast<float4*>(o + i * a.K);
      dst[0] = make_float4(v[m][0], v[m][1], v[m][2], v[m][3]);
      dst[1] = make_float4(v[m][4], v[m][5], v[m][6], v[m][7]);
#pragma unroll
      for (int c = 0; c < kWideCols; ++c) amax = fmaxf(amax, fabsf(v[m][c]));
    }
  }
  fold_amax(a, amax);
}

// Whether the wide kernel takes a strided projection (Note [HLA wide blocks]): rows layout, 256 <= n <= 2048,
// 2- or 4-byte elements, unit column stride, C a multiple of 8 and every 8-column run 16-byte aligned.
bool wide_applies(const HlaProjectArgs& a, const HlaGeometry& g) {
  const int64_t size = a.dtype == DType::f32 ? 4 : (a.dtype == DType::bf16 || a.dtype == DType::f16 ? 2 : 0);
  if (size == 0 || a.channels || a.slab_only || g.n_log < kWideMinLog || g.n_log > kWideMaxLog) return false;
  if (a.sc != 1 || a.C % kWideCols != 0 || (a.sl * size) % 16 != 0 || (a.sb * size) % 16 != 0) return false;
  return reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
}

constinit LaunchCounter g_wide_launches;  // hla_wide_launches()

// Blocks of hla_project_wide_kernel<T, N> resident at once on the device (queried once, after raising the
// kernel's dynamic shared memory limit to what it uses); 0 if the query failed.
template <class T, int N>
int64_t wide_resident() {
  static const int64_t resident = [] {
    auto kernel = hla_project_wide_kernel<T, N>;
    constexpr size_t smem = wide_smem_bytes<T, N>();
    if (smem > 48 * 1024)
      HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return cuda::resident_blocks(reinterpret_cast<const void*>(kernel), (1 << N) / 8, smem);
  }();
  return resident;
}

void launch_wide(const HlaProjectArgs& a, const HlaOutput& o, const HlaRows& rows, int n_log, cudaStream_t stream) {
  g_wide_launches.add();
  const int64_t tiles = a.C / kWideCols, total = a.B * (a.L / a.block) * tiles;
  auto go = [&](auto tag, auto nc) {
    using T = decltype(tag);
    constexpr int N = decltype(nc)::value;
    // persistent: each block walks the tiles gridDim.x apart (one block a tile if the occupancy query failed)
    const int64_t resident = wide_resident<T, N>(), ctas = resident > 0 ? std::min(total, resident) : total;
    hla_project_wide_kernel<T, N><<<static_cast<unsigned>(ctas), (1 << N) / 8, wide_smem_bytes<T, N>(), stream>>>(
        o, static_cast<const T*>(a.x), a.sb, a.sl, tiles, rows);
    HT_CHECK_LAUNCH("hla_project (wide blocks)");
  };
  auto with_n = [&](auto tag) {
    switch (n_log) {
      case 8: go(tag, std::integral_constant<int, 8>{}); break;
      case 9: go(tag, std::integral_constant<int, 9>{}); break;
      case 10: go(tag, std::integral_constant<int, 10>{}); break;
      case 11: go(tag, std::integral_constant<int, 11>{}); break;
    }
  };
  if (a.dtype == DType::bf16) with_n(bf16{});
  else if (a.dtype == DType::f16) with_n(f16{});
  else with_n(float{});
}

// Launches hla_project_kernel<T, Loader<T>> for x's dtype.
// n <= 16 in the rows layout (unless slab_only): hla_project_small_kernel (Note [HLA small blocks]).
template <template <class> class Loader, class Params>
void launch(const char* name, DType dtype, const HlaOutput& a, const Params& lp, const HlaGeometry& g,
            const HlaRows& rows, bool slab_only, cudaStream_t stream) {
  const int64_t P = a.L / a.block;
  if (g.n_log <= kHlaSmallMaxLog && !a.channels && !slab_only) {
    // about 32 elements per thread: blocks · tile · n = 32 · kHlaThreads
    int64_t blocks = 32 * kHlaThreads / ((int64_t{1} << g.tile_log) * a.block);
    blocks = blocks < 1 ? 1 : (blocks > P ? P : blocks);
    const int64_t ctas = a.B * ((P + blocks - 1) / blocks) * g.tiles;
    const bool ok = visit_kernel_float(dtype, [&](auto tag) {
      using T = decltype(tag);
      hla_project_small_kernel<T, Loader<T>><<<static_cast<unsigned>(ctas), kHlaThreads, 0, stream>>>(a, lp, g, blocks,
                                                                                                    rows);
      HT_CHECK_LAUNCH(name);
    });
    if (!ok) HT_UNSUPPORTED_DTYPE(name, dtype);
    return;
  }
  const int64_t ctas = a.B * P * g.tiles;
  const bool ok = visit_kernel_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = hla_project_kernel<T, Loader<T>>;
    if (g.smem > 48 * 1024)
      HT_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.smem)));
    kernel<<<static_cast<unsigned>(ctas), kHlaThreads, g.smem, stream>>>(a, lp, g, rows);
    HT_CHECK_LAUNCH(name);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE(name, dtype);
}

}  // namespace

int64_t hla_wide_launches() { return g_wide_launches.get(); }

void launch_hla_project(const HlaProjectArgs& a, const HlaRows& rows, cudaStream_t stream) {
  if (a.B == 0 || a.L == 0 || a.C == 0) return;
  const HlaGeometry g = hla_geometry(a.block, a.kept, a.C);
  const HlaOutput o{a.B, a.L, a.C, a.block, a.kept, a.channels, a.out, a.absmax};
  if (wide_applies(a, g)) return launch_wide(a, o, rows, g.n_log, stream);
  const StridedParams lp{a.x, a.sb, a.sl, a.sc, a.C};
  launch<StridedColumns>("hla_project", a.dtype, o, lp, g, rows, a.slab_only, stream);
}

void launch_hla_project_unfolded(const HlaUnfoldedArgs& a, const HlaRows& rows, cudaStream_t stream) {
  const int64_t kk = a.kh * a.kw, K = a.C * kk, L = a.OH * a.OW;
  if (a.N == 0 || L == 0 || K == 0) return;
  const HlaGeometry g = hla_geometry(a.block, a.kept, K);
  const HlaOutput o{a.N, L, K, a.block, a.kept, a.channels, a.out, a.absmax};
  Im2colParams lp{};
  lp.x = a.x;
  lp.sn = a.sn;
  lp.sc = static_cast<int>(a.sc);
  lp.sh = static_cast<int>(a.sh);
  lp.sw = static_cast<int>(a.sw);
  lp.C = static_cast<int>(a.C);
  lp.H = static_cast<int>(a.H);
  lp.W = static_cast<int>(a.W);
  lp.OW = static_cast<int>(a.OW);
  lp.kh = static_cast<int>(a.kh);
  lp.kw = static_cast<int>(a.kw);
  lp.stride_h = static_cast<int>(a.stride_h);
  lp.stride_w = static_cast<int>(a.stride_w);
  lp.pad_h = static_cast<int>(a.pad_h);
  lp.pad_w = static_cast<int>(a.pad_w);
  lp.dil_h = static_cast<int>(a.dil_h);
  lp.dil_w = static_cast<int>(a.dil_w);
  launch<Im2colColumns>("hla_project_unfolded", a.dtype, o, lp, g, rows, a.slab_only, stream);
}

void launch_hla_back_project(const HlaBackArgs& a, const HlaRows& rows, cudaStream_t stream) {
  if (a.B == 0 || a.L == 0 || a.C == 0) return;
  const HlaGeometry g = hla_geometry(a.block, a.block, a.C);  // shared memory: the slab and inv (n entries)
  const int64_t ctas = a.B * (a.L / a.block) * g.tiles;
  const bool ok = visit_kernel_float(a.out_dtype, [&](auto tag) {
    using Out = decltype(tag);
    auto kernel = hla_back_project_kernel<Out>;
    if (g.smem > 48 * 1024)
      HT_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.smem)));
    kernel<<<static_cast<unsigned>(ctas), kHlaThreads, g.smem, stream>>>(a, g, rows);
    HT_CHECK_LAUNCH("hla_back_project");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("hla_back_project", a.out_dtype);
}

}  // namespace ht::kernels
