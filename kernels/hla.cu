// HLA projection kernel, the classic variant (see hla.h; the default, measured on the H200; the session-9
// variants and the fused im2col path are in kernels/hla_variants.cu). The slab of one (sample, block p, channel tile) lives in shared memory as
// f32 rows of `stride` = tile + 1 floats (the pad spreads the column reads of the channels layout over the
// banks). The butterfly runs up to three stages per pass in registers (radix 8): the first pass is fused with
// the load from global memory, the others read and write the slab, separated by __syncthreads. Every element
// sees the same adds and subtracts in the same stage order as the CPU (__fadd_rn / __fsub_rn, no
// contraction), so the bits equal the CPU reference's.
#include "kernels/convert.cuh"
#include "kernels/hla.h"
#include "kernels/launch.h"
#include "kernels/variant.h"

namespace ht::kernels {
namespace {

constexpr int kHlaThreads = 256;
constexpr int64_t kHlaSlabFloats = 16384;  // n · tile target: 64 KiB of f32
constexpr int kRadix = 3;                  // butterfly stages done in registers per shared-memory pass

struct HlaGeometry {
  int tile_log;     // channels per CTA: tile = 2^tile_log (the last tile may hold fewer real channels)
  int n_log;        // n = 2^n_log
  int stride;       // floats per slab row in shared memory
  int64_t tiles;    // ceil(C / tile)
  size_t smem;      // bytes: slab + kept indices
};

int log2_of(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

HlaGeometry hla_geometry(const HlaProjectArgs& a) {
  HlaGeometry g;
  g.n_log = log2_of(a.block);
  // Up to 32 channels for n >= 64; small blocks take more channels (2048 / n, at most 256) so that a CTA has
  // at least 2048 elements to work on; at most kHlaSlabFloats / n (at least 1) for large n.
  int64_t cap = 2048 / a.block;
  cap = cap < 32 ? 32 : (cap > 256 ? 256 : cap);
  int64_t tile = kHlaSlabFloats / a.block;
  tile = tile < 1 ? 1 : (tile > cap ? cap : tile);
  int64_t c_pow2 = int64_t{1} << log2_of(a.C);
  if (tile > c_pow2) tile = c_pow2;
  g.tile_log = log2_of(tile);
  g.tiles = (a.C + tile - 1) / tile;
  g.stride = static_cast<int>(tile > 1 ? tile + 1 : 1);
  g.smem = static_cast<size_t>(a.block * g.stride) * sizeof(float) + static_cast<size_t>(a.kept) * sizeof(int16_t);
  return g;
}

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

// Stages h = 2^h_log ... 2^(h_log + G - 1) on the slab. Thread item (k, c): the 2^G rows j0 + m·h (m < 2^G)
// of channel c, j0 = (k >> h_log) << (h_log + G) | (k & (h - 1)); the items are disjoint, so no barrier is
// needed inside a pass. Same operations, same order per element as the stage-by-stage definition.
template <int G>
__device__ void radix_pass(float* slab, const HlaGeometry& g, int h_log) {
  const int tile_mask = (1 << g.tile_log) - 1, items = (1 << (g.n_log - G)) << g.tile_log;
  for (int q = threadIdx.x; q < items; q += blockDim.x) {
    const int c = q & tile_mask, k = q >> g.tile_log;
    const int j0 = ((k >> h_log) << (h_log + G)) | (k & ((1 << h_log) - 1));
    float v[1 << G];
#pragma unroll
    for (int m = 0; m < (1 << G); ++m) v[m] = slab[(j0 + (m << h_log)) * g.stride + c];
    butterfly<G>(v);
#pragma unroll
    for (int m = 0; m < (1 << G); ++m) slab[(j0 + (m << h_log)) * g.stride + c] = v[m];
  }
}

// The first pass, fused with the load: rows k·2^G ... k·2^G + 2^G − 1 of channel c read from x (strided,
// converted to f32; channels past the tile's width read 0), stages 1 ... 2^(G-1), stored to the slab.
template <int G, class T>
__device__ void load_pass(float* slab, const HlaGeometry& g, const T* x, int64_t sl, int64_t sc, int width) {
  const int tile_mask = (1 << g.tile_log) - 1, items = (1 << (g.n_log - G)) << g.tile_log;
  for (int q = threadIdx.x; q < items; q += blockDim.x) {
    const int c = q & tile_mask, j0 = (q >> g.tile_log) << G;
    float v[1 << G];
#pragma unroll
    for (int m = 0; m < (1 << G); ++m) v[m] = c < width ? convert<float>(x[(j0 + m) * sl + c * sc]) : 0.0f;
    butterfly<G>(v);
#pragma unroll
    for (int m = 0; m < (1 << G); ++m) slab[(j0 + m) * g.stride + c] = v[m];
  }
}

template <class T>
__global__ void __launch_bounds__(kHlaThreads)
    hla_project_kernel(HlaProjectArgs a, HlaGeometry g, const __grid_constant__ HlaRows rows) {
  extern __shared__ float slab[];  // (n, stride)
  int16_t* kept = reinterpret_cast<int16_t*>(slab + a.block * g.stride);
  const int n = static_cast<int>(a.block), r = static_cast<int>(a.kept), tile = 1 << g.tile_log;
  const int64_t P = a.L / n, R = P * r;
  const int64_t cta = blockIdx.x;
  const int64_t ti = cta % g.tiles, p = (cta / g.tiles) % P, b = cta / (g.tiles * P);
  const int64_t c0 = ti * tile;
  const int width = static_cast<int>((a.C - c0) < tile ? (a.C - c0) : tile);  // real channels of this tile
  const T* x = static_cast<const T*>(a.x) + b * a.sb + p * n * a.sl + c0 * a.sc;

  for (int k = threadIdx.x; k < r; k += blockDim.x) kept[k] = rows.idx[k];
  const int first = g.n_log < kRadix ? g.n_log : kRadix;
  switch (first) {
    case 0: load_pass<0>(slab, g, x, a.sl, a.sc, width); break;
    case 1: load_pass<1>(slab, g, x, a.sl, a.sc, width); break;
    case 2: load_pass<2>(slab, g, x, a.sl, a.sc, width); break;
    default: load_pass<3>(slab, g, x, a.sl, a.sc, width); break;
  }
  for (int h_log = first; h_log < g.n_log;) {
    const int stages = g.n_log - h_log < kRadix ? g.n_log - h_log : kRadix;
    __syncthreads();
    switch (stages) {
      case 1: radix_pass<1>(slab, g, h_log); break;
      case 2: radix_pass<2>(slab, g, h_log); break;
      default: radix_pass<3>(slab, g, h_log); break;
    }
    h_log += stages;
  }
  __syncthreads();
  float amax = 0.0f;  // max |value| this thread wrote (fmaxf: NaN never wins)
  if (!a.channels) {  // out (B, R, C): rows of `width` contiguous floats
    float* o = a.out + (b * R + p * r) * a.C + c0;
    for (int e = threadIdx.x; e < (r << g.tile_log); e += blockDim.x) {
      const int i = e >> g.tile_log, c = e & (tile - 1);
      if (c < width) {
        const float v = slab[kept[i] * g.stride + c];
        o[i * a.C + c] = v;
        amax = fmaxf(amax, fabsf(v));
      }
    }
  } else {  // out (B, C, R): runs of r contiguous floats per channel
    float* o = a.out + (b * a.C + c0) * R + p * r;
    for (int e = threadIdx.x; e < r * width; e += blockDim.x) {
      const int c = e / r, i = e - c * r;
      const float v = slab[kept[i] * g.stride + c];
      o[c * R + i] = v;
      amax = fmaxf(amax, fabsf(v));
    }
  }
  if (a.absmax) {  // a warp maximum, then one atomicMax on the bits (non-negative floats order like them)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    if (threadIdx.x % 32 == 0 && amax > 0.0f)
      atomicMax(reinterpret_cast<unsigned int*>(a.absmax), __float_as_uint(amax));
  }
}

}  // namespace

HlaKernel hla_kernel_default() {
  static const int v = env_variant("HADATRAIN_HLA_KERNEL", {{"slab", 1}, {"reg32", 2}, {"reg16", 3}, {"classic", 4}}, 4, 4);
  return static_cast<HlaKernel>(v);
}

bool hla_im2col_enabled() {
  static const bool on = env_variant("HADATRAIN_HLA_IM2COL", {{"runs", 1}, {"taps", 2}, {"auto", 3}}, 0, 0) != 0;
  return on;
}

void launch_hla_project(const HlaProjectArgs& a, const HlaRows& rows, cudaStream_t stream) {
  if (a.B == 0 || a.L == 0 || a.C == 0) return;
  const HlaKernel variant = a.variant == HlaKernel::automatic ? hla_kernel_default() : a.variant;
  if (variant != HlaKernel::classic) {  // the session-9 variants (kernels/hla_variants.cu)
    HlaProjectArgs v = a;
    v.variant = variant;
    launch_hla_project_variant(v, rows, stream);
    return;
  }
  const HlaGeometry g = hla_geometry(a);
  const int64_t ctas = a.B * (a.L / a.block) * g.tiles;
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = hla_project_kernel<T>;
    if (g.smem > 48 * 1024)
      HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.smem)));
    kernel<<<static_cast<unsigned>(ctas), kHlaThreads, g.smem, stream>>>(a, g, rows);
    HT_CHECK_LAUNCH("hla_project");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("hla_project", a.dtype);
}

}  // namespace ht::kernels
