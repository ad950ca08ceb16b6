// Row kernels (see rows.h): a group of `tpr` threads per row, tpr = 32 (a warp, 8 rows per 256-thread block)
// for rows of at most 256 elements and 256 (the whole block) otherwise. Every thread of a block runs the same
// number of row-group iterations, so the block-wide reductions may synchronise; threads past the last row
// reduce neutral values. Reductions combine the threads in a fixed order (deterministic), except the
// embedding scatter-add, which uses atomicAdd.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "kernels/map.cuh"
#include "kernels/rows.h"
#include "kernels/variant.h"

namespace ht::kernels {
namespace {

constexpr int kRowBlock = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

HT_DEV float d_exp(float x) { return expf(x); }
HT_DEV double d_exp(double x) { return exp(x); }
HT_DEV float d_log(float x) { return logf(x); }
HT_DEV double d_log(double x) { return log(x); }
HT_DEV float d_sqrt(float x) { return sqrtf(x); }
HT_DEV double d_sqrt(double x) { return sqrt(x); }
// exp in the softmax kernels: for bf16 / f16 results the hardware ex2 (__expf, relative error about 1e-6 for
// the arguments x - max <= 0 that occur) instead of the full-precision expf, which made the bf16 softmax
// compute-bound; f32 / f64 keep expf / exp.
template <class T, class A>
HT_DEV A soft_exp(A x) {
  if constexpr ((std::is_same_v<T, bf16> || std::is_same_v<T, f16>) && std::is_same_v<A, float>) return __expf(x);
  else return d_exp(x);
}
HT_DEV float d_max(float a, float b) { return fmaxf(a, b); }  // ignores NaN, as std::max(m, NaN) on the CPU
HT_DEV double d_max(double a, double b) { return fmax(a, b); }

template <class A>
HT_DEV A shfl_xor(A v, int o) {
  return __shfl_xor_sync(kFull, v, o);
}

// Value and index of a max candidate; i = INT64_MAX marks "no element".
template <class A>
struct Best {
  A v;
  long long i;
};
template <class A>
HT_DEV Best<A> shfl_xor(Best<A> b, int o) {
  return {__shfl_xor_sync(kFull, b.v, o), __shfl_xor_sync(kFull, b.i, o)};
}

template <class A>
HT_DEV bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
}

// The preferred of two candidates: NaN first, then the larger value, ties to the lower index.
template <class A>
HT_DEV Best<A> better(Best<A> a, Best<A> b) {
  const bool an = is_nan(a.v), bn = is_nan(b.v);
  if (an || bn) {
    if (an && bn) return a.i <= b.i ? a : b;
    return an ? a : b;
  }
  if (a.v != b.v) return a.v > b.v ? a : b;
  return a.i <= b.i ? a : b;
}

// Combines v over the tpr threads of a row group with f; every thread of the group gets the result.
// smem holds one value per warp of the block.
template <class V, class F>
HT_DEV V group_reduce(V v, int tpr, V* smem, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, shfl_xor(v, o));
  if (tpr > 32) {
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) v = f(v, smem[w]);
    __syncthreads();
  }
  return v;
}

struct Sum {
  template <class A>
  HT_DEV A operator()(A a, A b) const { return a + b; }
};
struct Max {
  template <class A>
  HT_DEV A operator()(A a, A b) const { return d_max(a, b); }
};
struct Better {
  template <class A>
  HT_DEV Best<A> operator()(Best<A> a, Best<A> b) const { return better(a, b); }
};

// Row-group geometry of a launch: threads per row and the grid.
struct RowGrid {
  int tpr;
  unsigned blocks;
};
RowGrid row_grid(int64_t rows, int64_t len) {
  const int tpr = len <= 256 ? 32 : kRowBlock;
  const int64_t per_block = kRowBlock / tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  constexpr int64_t kMaxBlocks = 132 * 64;
  return {tpr, static_cast<unsigned>(groups < 1 ? 1 : (groups > kMaxBlocks ? kMaxBlocks : groups))};
}

// Iterates the row groups of this block: body(row, lane, valid) with every thread taking part.
template <class F>
HT_DEV void for_each_row(int64_t rows, int tpr, F&& body) {
  const int per_block = kRowBlock / tpr;
  const int lane = static_cast<int>(threadIdx.x) % tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = g * per_block + static_cast<int>(threadIdx.x) / tpr;
    body(row < rows ? row : rows - 1, lane, row < rows);
  }
}

// Row loops: each lane walks its elements of a row. When the row's pointers are 16-byte aligned and its
// length is a multiple of a 16-byte pack, lanes move whole packs (one 16-byte load / store for 8 bf16 or 4
// f32); otherwise single elements. The choice depends on the row only, so all lanes of a row agree.
template <class T>
HT_DEV bool packable(const void* p, int64_t len) {
  return len % kVec<T> == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// f(j, x[j]) for this lane's elements of x.
template <class T, class F>
HT_DEV void row_read(const T* x, int64_t len, int lane, int tpr, F&& f) {
  constexpr int V = kVec<T>;
  if (packable<T>(x, len)) {
    for (int64_t p = lane; p < len / V; p += tpr) {
      const Pack<T, V> px = reinterpret_cast<const Pack<T, V>*>(x)[p];
#pragma unroll
      for (int k = 0; k < V; ++k) f(p * V + k, px.v[k]);
    }
  } else {
    for (int64_t j = lane; j < len; j += tpr) f(j, x[j]);
  }
}

// f(j, a[j], b[j]) for this lane's elements.
template <class T, class F>
HT_DEV void row_read2(const T* a, const T* b, int64_t len, int lane, int tpr, F&& f) {
  constexpr int V = kVec<T>;
  if (packable<T>(a, len) && packable<T>(b, len)) {
    for (int64_t p = lane; p < len / V; p += tpr) {
      const Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[p];
      const Pack<T, V> pb = reinterpret_cast<const Pack<T, V>*>(b)[p];
#pragma unroll
      for (int k = 0; k < V; ++k) f(p * V + k, pa.v[k], pb.v[k]);
    }
  } else {
    for (int64_t j = lane; j < len; j += tpr) f(j, a[j], b[j]);
  }
}

// y[j] = f(j, x[j]) (f returns the value in the accumulation type) for this lane's elements.
template <class T, class F>
HT_DEV void row_write(T* y, const T* x, int64_t len, int lane, int tpr, F&& f) {
  constexpr int V = kVec<T>;
  if (packable<T>(x, len) && packable<T>(y, len)) {
    for (int64_t p = lane; p < len / V; p += tpr) {
      const Pack<T, V> px = reinterpret_cast<const Pack<T, V>*>(x)[p];
      Pack<T, V> py;
#pragma unroll
      for (int k = 0; k < V; ++k) py.v[k] = convert<T>(f(p * V + k, px.v[k]));
      reinterpret_cast<Pack<T, V>*>(y)[p] = py;
    }
  } else {
    for (int64_t j = lane; j < len; j += tpr) y[j] = convert<T>(f(j, x[j]));
  }
}

// y[j] = f(j, a[j], b[j]) for this lane's elements.
template <class T, class F>
HT_DEV void row_write2(T* y, const T* a, const T* b, int64_t len, int lane, int tpr, F&& f) {
  constexpr int V = kVec<T>;
  if (packable<T>(a, len) && packable<T>(b, len) && packable<T>(y, len)) {
    for (int64_t p = lane; p < len / V; p += tpr) {
      const Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[p];
      const Pack<T, V> pb = reinterpret_cast<const Pack<T, V>*>(b)[p];
      Pack<T, V> py;
#pragma unroll
      for (int k = 0; k < V; ++k) py.v[k] = convert<T>(f(p * V + k, pa.v[k], pb.v[k]));
      reinterpret_cast<Pack<T, V>*>(y)[p] = py;
    }
  } else {
    for (int64_t j = lane; j < len; j += tpr) y[j] = convert<T>(f(j, a[j], b[j]));
  }
}

// ---- softmax / log_softmax -------------------------------------------------------------------------------

template <class T>
__global__ void softmax_kernel(T* out, const T* in, int64_t rows, int64_t len, int tpr, SoftmaxKind kind) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  for_each_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = in + row * len;
    A m = -std::numeric_limits<A>::infinity();
    if (valid)
      row_read(x, len, lane, tpr, [&](int64_t, T v) { m = d_max(m, convert<A>(v)); });
    m = group_reduce(m, tpr, smem, Max{});
    A s = A(0);
    if (valid)
      row_read(x, len, lane, tpr, [&](int64_t, T v) { s += soft_exp<T>(convert<A>(v) - m); });
    s = group_reduce(s, tpr, smem, Sum{});
    if (!valid) return;
    const A log_s = d_log(s);
    T* y = out + row * len;
    row_write(y, x, len, lane, tpr, [&](int64_t, T v) {
      const A z = convert<A>(v) - m;
      return kind == SoftmaxKind::softmax ? soft_exp<T>(z) / s : z - log_s;
    });
  });
}

template <class T>
__global__ void softmax_backward_kernel(T* gx, const T* g, const T* y, int64_t rows, int64_t len, int tpr,
                                        SoftmaxKind kind) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  const bool soft = kind == SoftmaxKind::softmax;
  for_each_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* gr = g + row * len;
    const T* yr = y + row * len;
    A s = A(0);
    if (valid)
      row_read2(gr, yr, len, lane, tpr,
                [&](int64_t, T gv, T yv) { s += soft ? convert<A>(gv) * convert<A>(yv) : convert<A>(gv); });
    s = group_reduce(s, tpr, smem, Sum{});
    if (!valid) return;
    T* out = gx + row * len;
    row_write2(out, gr, yr, len, lane, tpr, [&](int64_t, T gv, T yv) {
      const A gj = convert<A>(gv), yj = convert<A>(yv);
      return soft ? yj * (gj - s) : gj - soft_exp<T>(yj) * s;
    });
  });
}

// ---- register-resident rows: softmax / log_softmax and layer_norm / rms_norm forward --------------------
// A group of tpr threads (a power of two, 32..512) holds a whole row in registers, NP 16-byte packs per
// thread (NP = 4, or 8 for rows longer than 512 x 4 packs): the row is read from global memory once,
// reduced, and written once (the multi-pass kernels above re-read it for every statistic). Lane l holds
// packs l, l + tpr, ... Used when every row is packable (the length a multiple of a pack, the base pointers
// 16-byte aligned: the host checks, so the kernels have no scalar path) and at most 512 x 8 packs long;
// other rows use the multi-pass kernels. Row-internal indices fit in 32 bits. bf16 / f16 results are
// rounded by the hardware cvt (pack_cast below). Four packs per thread keep the forward kernels at 64
// registers (with the row's floats, or a softmax's exponentials), so four 256-thread blocks share an SM and
// one block's loads overlap another's reductions.
constexpr int kCacheMaxTpr = 512;

template <class T, int NP>
struct RowCache {
  static constexpr int V = kVec<T>;
  Pack<T, V> p[NP];

  HT_DEV void load(const T* x, int packs, int lane, int tpr) {
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int q = lane + i * tpr;
      if (q < packs) p[i] = reinterpret_cast<const Pack<T, V>*>(x)[q];
    }
  }
  // f(value) for every element of the row this lane holds.
  template <class F>
  HT_DEV void each(int packs, int lane, int tpr, F&& f) const {
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      if (lane + i * tpr >= packs) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) f(p[i].v[k]);
    }
  }
};

// Combines v over the tpr threads (a multiple of 32, groups aligned to warps) of a row group with f, in a
// fixed order; every thread of the group gets the result. Every thread of the block must call it.
template <class V, class F>
HT_DEV V tile_reduce(V v, int tpr, V* smem, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, shfl_xor(v, o));
  if (tpr > 32) {
    const int first = static_cast<int>(threadIdx.x) / tpr * (tpr / 32);
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    v = smem[first];
    for (int w = 1; w < tpr / 32; ++w) v = f(v, smem[first + w]);
    __syncthreads();
  }
  return v;
}

// Launch shape of the register-resident kernels: packs per thread (4 or 8; 0 when they do not apply: the
// rows are not packable, i.e. len not a multiple of the pack or a pointer not 16-byte aligned, or are
// longer than 512 x 8 packs), threads per row, block and grid.
struct CacheGrid {
  int np = 0, tpr = 0;
  unsigned block = 0, blocks = 0;
};
CacheGrid cache_grid(int64_t rows, int64_t len, int vec, std::initializer_list<const void*> ptrs) {
  CacheGrid g;
  if (len <= 0 || len % vec != 0) return g;
  for (const void* p : ptrs)
    if (!aligned_to(p, 16)) return g;
  const int64_t packs = len / vec;
  g.np = packs <= 4 * kCacheMaxTpr ? 4 : 8;
  if (packs > static_cast<int64_t>(g.np) * kCacheMaxTpr) return CacheGrid{};
  g.tpr = 32;
  while (static_cast<int64_t>(g.tpr) * g.np < packs) g.tpr *= 2;
  const int block = g.tpr < kRowBlock ? kRowBlock : g.tpr;
  const int64_t per_block = block / g.tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  constexpr int64_t kMaxBlocks = 132 * 64;
  g.block = static_cast<unsigned>(block);
  g.blocks = static_cast<unsigned>(groups < 1 ? 1 : (groups > kMaxBlocks ? kMaxBlocks : groups));
  return g;
}

// Iterates the row groups of this block for the register-resident kernels: body(row, lane, valid), every
// thread of the block running the same number of iterations (the reductions synchronise).
template <class F>
HT_DEV void for_each_cached_row(int64_t rows, int tpr, F&& body) {
  const int per_block = static_cast<int>(blockDim.x) / tpr;
  const int lane = static_cast<int>(threadIdx.x) % tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = g * per_block + static_cast<int>(threadIdx.x) / tpr;
    body(row < rows ? row : rows - 1, lane, row < rows);
  }
}

// ---- pack arithmetic of the register-resident forward kernels ------------------------------------------------
// The forward kernels below are issue-bound when every element costs a dozen instructions (a 4096-wide bf16
// row at 0.75 of copy bandwidth, Nsight: 83 % SM throughput, 51 % DRAM), so bf16 / f16 packs are handled as
// four 32-bit words of two elements (element 2j in the low half of word j): the row max with max.bf16x2 /
// max.f16x2, the conversion to float with a shift or mask (bf16) or cvt.f32.f16, the results rounded two at a
// time. sm_80 and newer; older architectures take the element-wise path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kHalf2Ops = false;
#else
constexpr bool kHalf2Ops = true;
#endif
template <class T>
inline constexpr bool kHalfPack = kHalf2Ops && (std::is_same_v<T, bf16> || std::is_same_v<T, f16>);

template <class T, int V>
HT_DEV void pack_words(const Pack<T, V>& p, uint32_t (&w)[V / 2]) {
  memcpy(w, &p, sizeof w);
}

// The elements of a pack in the accumulation type. f16 uses the hardware cvt.f32.f16, which is exact and gives
// the CPU decoder's value for every non-NaN input (a NaN may get another payload; every use below is
// arithmetic, whose NaN results are the GPU's canonical NaN either way).
template <class T, int V>
HT_DEV void unpack(const Pack<T, V>& p, acc_t<T> (&f)[V]) {
  if constexpr (kHalfPack<T>) {
    uint32_t w[V / 2];
    pack_words(p, w);
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      if constexpr (std::is_same_v<T, bf16>) {
        f[2 * j] = __uint_as_float(w[j] << 16);
        f[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
      } else {
        asm("{ .reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
            : "=f"(f[2 * j]), "=f"(f[2 * j + 1])
            : "r"(w[j]));
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = convert<acc_t<T>>(p.v[k]);
  }
}

// Per half: max ignoring a NaN operand (like fmaxf), or max.NaN (a NaN operand gives NaN).
template <class T, bool kNaN = false>
HT_DEV uint32_t max2(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (kNaN) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    else asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  } else {
    if constexpr (kNaN) asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    else asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  }
  return r;
}

// The largest element of the packs this lane holds (NaN ignored, as d_max; -inf without packs).
template <class T, int NP>
HT_DEV acc_t<T> lane_max(const RowCache<T, NP>& c, int packs, int lane, int tpr) {
  using A = acc_t<T>;
  if constexpr (kHalfPack<T>) {
    uint32_t m = std::is_same_v<T, bf16> ? 0xFF80FF80u : 0xFC00FC00u;  // (-inf, -inf)
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      if (lane + i * tpr >= packs) continue;
      uint32_t w[4];
      pack_words(c.p[i], w);
      m = max2<T>(m, max2<T>(max2<T>(w[0], w[1]), max2<T>(w[2], w[3])));
    }
    Pack<T, 2> two;
    memcpy(&two, &m, sizeof m);
    A f[2];
    unpack(two, f);
    return d_max(f[0], f[1]);
  } else {
    A m = -std::numeric_limits<A>::infinity();
    c.each(packs, lane, tpr, [&](T v) { m = d_max(m, convert<A>(v)); });
    return m;
  }
}

// store_cast<T> of V values as one pack. bf16 / f16 are rounded two at a time (cvt.rn.bf16x2.f32 /
// cvt.rn.f16x2.f32: the same rounding as store_cast's cvt.rn, whose NaN code it then patches to the CPU's).
// kCheck: a NaN among the results (found with max.NaN over the rounded words) sends the pack through
// store_cast; without kCheck the caller guarantees that there is none.
template <bool kCheck, class T, int V>
HT_DEV Pack<T, V> pack_cast(const acc_t<T> (&y)[V]) {
  Pack<T, V> o;
  if constexpr (kHalfPack<T>) {
    uint32_t w[V / 2];
    cvt_pairs<T>(y, w);
    if constexpr (kCheck) {
      uint32_t any = w[0];
#pragma unroll
      for (int j = 1; j < V / 2; ++j) any = max2<T, true>(any, w[j]);
      constexpr uint32_t inf = std::is_same_v<T, bf16> ? 0x7F80u : 0x7C00u;
      if ((any & 0x7FFFu) > inf || ((any >> 16) & 0x7FFFu) > inf) {
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = store_cast<T>(y[k]);
        return o;
      }
    }
    memcpy(&o, w, sizeof w);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = store_cast<T>(y[k]);
  }
  return o;
}

// y's packs of this lane from f(i, out) (out: the V results of the lane's pack i in A), rounded by pack_cast.
template <bool kCheck, class T, int NP, class F>
HT_DEV void store_packs(T* y, int packs, int lane, int tpr, F&& f) {
  constexpr int V = kVec<T>;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int q = lane + i * tpr;
    if (q >= packs) continue;
    acc_t<T> o[V];
    f(i, o);
    reinterpret_cast<Pack<T, V>*>(y)[q] = pack_cast<kCheck, T, V>(o);
  }
}

constexpr float kLog2e = 1.4426950408889634f;
HT_DEV float ex2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// e^x in the cached softmax: ex2.approx.ftz(x * log2 e) for bf16 / f16 (one MUFU; soft_exp's __expf adds
// three instructions for results below 2^-126, which only the flush to zero changes: far below the
// tolerance of a bf16 / f16 probability); soft_exp (expf / exp) for f32 / f64.
template <class T, class A>
HT_DEV A fwd_exp(A x) {
  if constexpr (kHalfPack<T>) return ex2_ftz(x * kLog2e);
  else return soft_exp<T>(x);
}

// The row statistics of bf16 / f16 rows: approximate reciprocal, logarithm and reciprocal square root (MUFU;
// relative errors about 2^-22, far below the results' rounding) instead of the IEEE division, logf, square
// root and reciprocal, whose 10 to 20 instructions each cost a thread about 1.5 per element of a 32-element row
// share. f32 / f64 rows keep the exact forms.
HT_DEV float fast_rcp(float x) { return __fdividef(1.0f, x); }
HT_DEV float fast_log(float x) { return __logf(x); }
HT_DEV float fast_rsqrt(float x) { return rsqrtf(x); }

// tile_reduce with one barrier instead of two: consecutive calls alternate between the two buffers of smem
// (phase flips per call, the same sequence in every thread of the block), so a buffer is written again only
// after the barrier of the call in between, which every thread reaches after its reads of that buffer.
// The warps' values are combined in warp order, as in tile_reduce, by unrolled code for groups of 2, 4 or 8
// warps.
template <int N, class V, class F>
HT_DEV V fold_warps(const V* p, F f) {
  V v = p[0];
#pragma unroll
  for (int w = 1; w < N; ++w) v = f(v, p[w]);
  return v;
}
template <class V, class F>
HT_DEV V tile_reduce1(V v, int tpr, V (*smem)[kCacheMaxTpr / 32], int& phase, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, shfl_xor(v, o));
  if (tpr > 32) {
    V* buf = smem[phase];
    phase ^= 1;
    const int first = static_cast<int>(threadIdx.x) / tpr * (tpr / 32);
    if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
    __syncthreads();
    switch (tpr) {
      case 64: v = fold_warps<2>(buf + first, f); break;
      case 128: v = fold_warps<4>(buf + first, f); break;
      case 256: v = fold_warps<8>(buf + first, f); break;
      default:
        v = buf[first];
        for (int w = 1; w < tpr / 32; ++w) v = f(v, buf[first + w]);
    }
  }
  return v;
}

// The kind is a template parameter: a softmax keeps the exponentials (f64: the row) over the sum's reduction, a
// log_softmax the row (not the exponentials), which keeps either within 64 registers at NP = 4.
template <class T, int NP, SoftmaxKind K>
__global__ void __launch_bounds__(kCacheMaxTpr, NP == 4 ? 2 : 1) softmax_cached_kernel(T* out, const T* in, int64_t rows,
                                                                                      int64_t len, int tpr) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  __shared__ A smem[2][kCacheMaxTpr / 32];
  const int packs = static_cast<int>(len / V);
  // Keeping e^(x - m) costs NP x V registers (bf16, NP = 4: 64 registers, four 256-thread blocks per SM;
  // recomputing them: 48 registers, five blocks, four more instructions per element). f64's exp needs the
  // registers itself: recomputed.
  constexpr bool kKeepExp = !std::is_same_v<T, double>;
  int phase = 0;
  for_each_cached_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    RowCache<T, NP> c;
    c.load(in + row * len, packs, lane, tpr);
    const A m = tile_reduce1(lane_max(c, packs, lane, tpr), tpr, smem, phase, Max{});
    A e[NP][V];  // e^(x - m), computed once for the sum and the softmax results (f64: twice, see kKeepExp)
    A s = A(0);
    auto exps = [&](auto&& ex) {
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        if (lane + i * tpr >= packs) continue;
        A x[V];
        unpack(c.p[i], x);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          e[i][k] = ex(x[k]);
          s += e[i][k];
        }
      }
    };
    // bf16 / f16 softmax with |m| < 2^23: e^(x - m) = 2^(x log2e - m log2e), one FFMA instead of a subtraction
    // and a multiplication. The rounding error d of m log2e (|d| <= 0.5: m log2e < 2^24) scales every e of the
    // row by the same 2^-d, which cancels in e / s, and keeps the max's e within [0.70, 1.42]; log_softmax uses
    // s itself and keeps (x - m) log2e.
    if constexpr (kHalfPack<T> && K == SoftmaxKind::softmax) {
      if (fabsf(m) < 8388608.0f) {
        const float ml = m * kLog2e;
        exps([&](float x) { return ex2_ftz(fmaf(x, kLog2e, -ml)); });
      } else {
        exps([&](float x) { return fwd_exp<T>(x - m); });
      }
    } else {
      exps([&](A x) { return fwd_exp<T>(x - m); });
    }
    s = tile_reduce1(s, tpr, smem, phase, Sum{});
    if (!valid) return;
    T* y = out + row * len;
    // Every e is in [0, 1.42] and the max's at least 0.70, so s > 0 and every result is finite, unless a NaN
    // or +inf entry (or a row of -inf) made some e, hence s, NaN: only such rows need pack_cast's NaN check.
    const bool finite = s == s;
    if constexpr (K == SoftmaxKind::softmax) {
      A inv;
      if constexpr (kHalfPack<T>) inv = fast_rcp(s);
      else inv = A(1) / s;
      auto f = [&](int i, A(&o)[V]) {
        if constexpr (kKeepExp) {
#pragma unroll
          for (int k = 0; k < V; ++k) o[k] = e[i][k] * inv;
        } else {
          unpack(c.p[i], o);
#pragma unroll
          for (int k = 0; k < V; ++k) o[k] = fwd_exp<T>(o[k] - m) * inv;
        }
      };
      if (finite || !kHalfPack<T>) store_packs<false, T, NP>(y, packs, lane, tpr, f);
      else store_packs<true, T, NP>(y, packs, lane, tpr, f);
    } else {
      A log_s;
      if constexpr (kHalfPack<T>) log_s = fast_log(s);
      else log_s = d_log(s);
      auto f = [&](int i, A(&o)[V]) {
        unpack(c.p[i], o);
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] = (o[k] - m) - log_s;
      };
      if (finite || !kHalfPack<T>) store_packs<false, T, NP>(y, packs, lane, tpr, f);
      else store_packs<true, T, NP>(y, packs, lane, tpr, f);
    }
  });
}

// out[k] = w[j + k] for k < V (A = float or double, w 16-byte aligned, j a multiple of V) with 16-byte loads
// through the read-only cache (every row reads them), or `none` without parameters. Scalar loads would cost
// the L1 more wavefronts than the row's own traffic (a lane's V values are 32 bytes apart from the next lane's).
template <class A, int V>
HT_DEV void load_params(const A* w, int j, A none, A (&out)[V]) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(A));
  static_assert(V % kPer == 0, "parameter pack");
  if (!w) {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = none;
    return;
  }
#pragma unroll
  for (int c = 0; c < V / kPer; ++c) {
    const Pack<A, kPer> pw = reinterpret_cast<const Pack<A, kPer>*>(w + j)[c];
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[c * kPer + k] = pw.v[k];
  }
}

// A norm parameter (weight or bias, D elements) stored in S (float, double for f64) or, `narrow`, in the row
// dtype T (bf16 / f16 parameters of bf16 / f16 rows are read as they are: no conversion launch per call).
template <class T, class A>
struct Param {
  const void* p;
  bool narrow;
  HT_DEV explicit operator bool() const { return p != nullptr; }
  HT_DEV A operator[](int64_t j) const {
    return narrow ? convert<A>(static_cast<const T*>(p)[j]) : static_cast<const A*>(p)[j];
  }
};

// out[k] = w[j + k] for k < V = kVec<T> (one 16-byte load when narrow), or `none` without the parameter.
template <class T, class A, int V>
HT_DEV void load_param(const Param<T, A>& w, int j, A none, A (&out)[V]) {
  static_assert(V == kVec<T>, "a pack of the row dtype");
  if (w.p && w.narrow) {
    const Pack<T, V> pw = *reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(w.p) + j);
    unpack(pw, out);
    return;
  }
  load_params<A, V>(static_cast<const A*>(w.p), j, none, out);
}

// Note [Shifted row mean]
// For bf16 / f16 rows the register-resident and multi-pass layer_norm forward kernels compute the mean as
// K + sum(x - K) / D with K the row's first element, not sum(x) / D. For rows with a large common offset the plain float sum loses the
// low bits: f16 rows 100 + U(-1, 1) of 768 elements sum to about 76800, where a float ulp is 2^-7, and the
// rounding of these all-positive partial sums has the same sign in most rows, so the mean error (up to 5e-6)
// is a bias rather than noise. It moves every xhat of a row by (mean error) * rstd, and the weight gradient,
// a sum over rows of g * xhat, by up to rows * 5e-6 * rstd * |g|: the f16 "offset rows" case of test_gpu_rows
// (300 x 768) differed from the CPU reference by up to 1.5e-3 in 23 columns whose gradient is near 0 (run 18).
// The CPU is the accurate side: a host simulation of this kernel's summation order against an all-double
// computation gives 1.3e-3 for the float sum (22 columns over the test's tolerance) and 9.4e-5 for the CPU
// reference (its mean in double, saved in float). The shifted sums are of values x - K within the spread of
// the row (x - K exact in float for bf16 / f16 x), so the mean is the float rounding of the exact one: the
// simulation gives exactly the CPU's float mean. The staged bf16 / f16 kernels shift the same way. f32 / f64
// keep sum(x) / D: their x - K is rounded, and a far outlier K (the test's first element 1000 in a row of
// U(-1, 1)) makes the shifted sums about -1000 D, whose float rounding would exceed the f32 tolerance.
template <class T>
inline constexpr bool kShiftMean = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
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

// ---- register-resident backward rows: softmax / log_softmax and layer_norm / rms_norm ----------------------
// Two rows (g and y, or g and x) held in registers: both are read once, reduced, and gx written once (the
// multi-pass kernels read them twice). A group of tpr threads (32..256, a power of two) per row, NP (2 or 4)
// packs per thread and row, 256-thread blocks. The norm kernel also accumulates the parameter gradients (sums over rows
// of g * xhat and g) per column in registers: a lane keeps the same columns for every row it visits, so the
// block adds its row groups' sums in shared memory and writes one partial row (D) per block; the caller
// adds the blocks' rows (no second pass over g and x).
struct BwdGrid {
  int np = 0, tpr = 0;
  unsigned blocks = 0;
};
constexpr int64_t kBwdMaxBlocks = 132 * 4;  // bounds the (blocks, D) partial sums of the norm kernel
BwdGrid bwd_grid(int64_t rows, int64_t len, int vec, std::initializer_list<const void*> ptrs, int64_t max_blocks) {
  BwdGrid g;
  if (len <= 0 || len % vec != 0) return g;
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return g;
  // Two packs per thread while 256 threads cover the row (the bf16 norm kernel keeps about 100 registers:
  // two blocks per SM); four packs per thread (about 170 registers, one block per SM) only beyond that.
  const int64_t packs = len / vec;
  int np = 2, tpr = 32;
  while (static_cast<int64_t>(tpr) * np < packs && tpr < kRowBlock) tpr *= 2;
  if (static_cast<int64_t>(tpr) * np < packs) np = 4;
  if (static_cast<int64_t>(tpr) * np < packs) return g;
  const int64_t per_block = kRowBlock / tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  g.np = np;
  g.tpr = tpr;
  g.blocks = static_cast<unsigned>(groups < 1 ? 1 : (groups > max_blocks ? max_blocks : groups));
  return g;
}

template <class T, int NP>
__global__ void __launch_bounds__(kRowBlock) softmax_backward_cached_kernel(T* gx, const T* g, const T* y,
                                                                           int64_t rows, int64_t len, int tpr,
                                                                           SoftmaxKind kind) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  __shared__ A smem[kRowBlock / 32];
  const int packs = static_cast<int>(len / V);
  const bool soft = kind == SoftmaxKind::softmax;
  for_each_cached_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    RowCache<T, NP> cg, cy;
    cg.load(g + row * len, packs, lane, tpr);
    cy.load(y + row * len, packs, lane, tpr);
    A s = A(0);
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      if (lane + i * tpr >= packs) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) s += soft ? convert<A>(cg.p[i].v[k]) * convert<A>(cy.p[i].v[k]) : convert<A>(cg.p[i].v[k]);
    }
    s = tile_reduce(s, tpr, smem, Sum{});
    if (!valid) return;
    T* out = gx + row * len;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int q = lane + i * tpr;
      if (q >= packs) continue;
      Pack<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A gj = convert<A>(cg.p[i].v[k]), yj = convert<A>(cy.p[i].v[k]);
        o.v[k] = store_cast<T>(soft ? yj * (gj - s) : gj - soft_exp<T>(yj) * s);
      }
      reinterpret_cast<Pack<T, V>*>(out)[q] = o;
    }
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
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A gv = convert<A>(cg.p[i].v[k]);
          const A xh = (convert<A>(cx.p[i].v[k]) - m) * r;
          const A gh = w ? gv * wv[k] : gv;
          o.v[k] = store_cast<T>(r * ((gh - mean_gh) - xh * mean_ghx));
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

// ---- layer_norm / rms_norm, staged rows (norm kernel variant 2, the default) ---------------------------------
// Note [Staged norm kernels]
// The register-resident norm kernels above load a row, wait for it, reduce and store, with the next row's
// loads issued only by other blocks (forward: 0.68 of copy bandwidth at 4096-wide bf16 rows on the H200,
// where the softmax kernel of the same shape reaches 0.95) or by a register prefetch of one row group
// (backward: 0.43 at 50432 x 768, 0.26 at 16640 x 384). These kernels instead stage the rows through shared
// memory with cp.async, `stages` (2..4) row groups deep: at the top of every iteration a thread issues the
// copies of the row group stages - 1 iterations ahead, then waits for the current one. A thread copies and
// later reads only its own 16-byte slots (slot i of thread t at [stage][i][t], conflict-free), so the stages
// need no barrier. One wave of persistent blocks walks the row groups (the grid comes from the occupancy).
// Other changes against the register-resident kernels:
// - threads per row tpr: the smallest power of two (1..256) with at most four packs per thread, so a
//   768-wide bf16 row (96 packs) is one warp with three packs per lane and a 384-wide row half a warp (no
//   idle lanes, no barrier: groups up to a warp reduce with shuffles only);
// - forward, bf16 / f16: one reduction of the pair (sum of x - K, sum of (x - K)^2) with K the row's first
//   element (a shifted one-pass variance: the relative error of the variance grows with (mean - K)^2 / var,
//   small unless the first element is a far outlier of its row) instead of two reductions; f32 / f64 keep two
//   (the mean, then the sum of squares about it); rms_norm reduces sum x^2 alone. (A two-pass bf16 variant,
//   measured on the H200 in run 18, was no faster: 0.0959 against 0.0896 ms at 16384 x 4096, equal elsewhere;
//   removed.);
// - the parameters are converted once per block into shared memory (float, double for f64), and checked
//   there for NaN / inf: rows whose statistics and parameters are finite skip pack_cast's NaN check;
// - backward: the weight in shared memory, g and x staged; the gradients of weight and bias summed per
//   column in registers over the block's rows, then over the block's row slots in a fixed order, one partial
//   row per block (norm_param_finalize_wide_kernel adds the blocks' rows in a fixed order: deterministic).
// bf16 / f16 rows use the fused-multiply forms of xhat and gx (x r - mean r; gh r + c1 + xhat c2) and the
// MUFU rsqrt; f32 / f64 keep (x - mean) r and r ((gh - mean gh) - xhat mean(gh xhat)).
// Rows that are not packable, or longer than 256 x 4 packs, take the register-resident / multi-pass kernels.
HT_DEV void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#else
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}
// 4 or 8 bytes (a row statistic).
template <int kBytes>
HT_DEV void cp_async_small(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src), "n"(kBytes)
               : "memory");
#else
  if constexpr (kBytes == 8) *static_cast<unsigned long long*>(dst) = *static_cast<const unsigned long long*>(src);
  else *static_cast<unsigned*>(dst) = *static_cast<const unsigned*>(src);
#endif
}
HT_DEV void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `pending` (0..3) of this thread's committed copy groups are still in flight.
HT_DEV void cp_async_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
  }
#endif
}

// Programmatic dependent launch (sm_90): the dependent grid (launched with the programmatic stream
// serialization attribute) may start once every block of this one has called grid_dependents_launch (or
// exited); grid_dependency_wait returns once the preceding grid has completed and its writes are visible (at
// once when the grid was launched without the attribute).
HT_DEV void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
HT_DEV void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

HT_DEV bool d_finite(float v) { return isfinite(v); }
HT_DEV bool d_finite(double v) { return isfinite(v); }
HT_DEV float d_fma(float a, float b, float c) { return fmaf(a, b, c); }
HT_DEV double d_fma(double a, double b, double c) { return fma(a, b, c); }

// Variant 4 (Note [Norm backward, cluster variant]): the warps of a row group of more than a warp meet at their
// own named barrier (1 + the row slot, tpr threads) instead of the block-wide one, so the block's row groups do
// not wait for each other (group_sum2<true>). (The barrier ids are immediates: a register id makes ptxas reserve
// all 16 barriers.)
HT_DEV void bar_sync_row(int slot, int threads) {
  switch (slot) {  // row slots 0..3: groups of more than a warp, at most 4 per block
    case 0: asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;\n" ::"r"(threads) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;\n" ::"r"(threads) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;\n" ::"r"(threads) : "memory"); break;
  }
}
// Sums (u, v) over the tpr threads (a power of two, 1..256; groups of more than a warp aligned to warps) of a
// row group in a fixed order; every thread of the group gets the totals. Every thread of the block calls it,
// or with kRowBarrier (variant 4) every thread of the group: the group's warps then meet at its named barrier
// (bar_sync_row) instead of __syncthreads, with the same sums in the same order. Groups of more than a warp
// combine their warps through red, whose two buffers alternate (phase) so that one barrier per call suffices
// (as tile_reduce1; a group's entries are its own warps, so this holds per group too).
template <bool kRowBarrier = false, class A>
HT_DEV void group_sum2(A& u, A& v, int tpr, A (*red)[2][kRowBlock / 32], int& phase) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < tpr) {
      u += shfl_xor(u, o);
      v += shfl_xor(v, o);
    }
  }
  if (tpr > 32) {
    A(*buf)[kRowBlock / 32] = red[phase];
    phase ^= 1;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int first = static_cast<int>(threadIdx.x) / tpr * (tpr / 32);
    if (threadIdx.x % 32 == 0) {
      buf[0][warp] = u;
      buf[1][warp] = v;
    }
    if constexpr (kRowBarrier) bar_sync_row(static_cast<int>(threadIdx.x) / tpr, tpr);
    else __syncthreads();
    u = buf[0][first];
    v = buf[1][first];
    for (int w = 1; w < tpr / 32; ++w) {
      u += buf[0][first + w];
      v += buf[1][first + w];
    }
  }
}

// Thread block clusters (sm_90; a launch without a cluster dimension is a cluster of one block).
HT_DEV unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return __clusterRelativeBlockRank();
#else
  return 0;
#endif
}
HT_DEV unsigned cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return __clusterSizeInBlocks();
#else
  return 1;
#endif
}
// Every thread of every block of the cluster; shared-memory writes before it are visible cluster-wide after.
HT_DEV void cluster_sync_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
#else
  __syncthreads();
#endif
}
// The address of p (this block's shared memory) in block `rank` of the cluster.
template <class A>
HT_DEV const A* cluster_peer(const A* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<const A*>(__cluster_map_shared_rank(p, rank));
#else
  (void)rank;
  return p;
#endif
}

// Variant 3: a norm parameter (D) into shared memory as A (`none` without it), by 16-byte packs when it starts
// 16-byte aligned and D is a multiple of the pack, else element by element (as variant 2 always does: at
// 4096-wide bf16 rows 16 iterations of 2-byte loads per thread before a block's first row); true when every
// value is finite. dst is 16-byte aligned.
template <class T, class A>
HT_DEV bool stage_param(A* dst, const Param<T, A>& p, int64_t d, A none) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(A));  // A values per 16-byte shared-memory store
  const int tid = static_cast<int>(threadIdx.x);
  bool fin = true;
  if (p.p && p.narrow && aligned_to(p.p, 16) && d % kVec<T> == 0) {
    constexpr int V = kVec<T>;
    static_assert(V % kPer == 0, "whole shared-memory packs");
    for (int64_t q = tid; q < d / V; q += kRowBlock) {
      A v[V];
      unpack(reinterpret_cast<const Pack<T, V>*>(p.p)[q], v);
#pragma unroll
      for (int c = 0; c < V / kPer; ++c) {
        Pack<A, kPer> o;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          o.v[k] = v[c * kPer + k];
          fin = fin && d_finite(o.v[k]);
        }
        reinterpret_cast<Pack<A, kPer>*>(dst + q * V)[c] = o;
      }
    }
    return fin;
  }
  if (p.p && !p.narrow && aligned_to(p.p, 16) && d % kPer == 0) {
    for (int64_t q = tid; q < d / kPer; q += kRowBlock) {
      const Pack<A, kPer> o = reinterpret_cast<const Pack<A, kPer>*>(p.p)[q];
#pragma unroll
      for (int k = 0; k < kPer; ++k) fin = fin && d_finite(o.v[k]);
      reinterpret_cast<Pack<A, kPer>*>(dst)[q] = o;
    }
    return fin;
  }
  for (int64_t j = tid; j < d; j += kRowBlock) {
    const A v = p ? p[j] : none;
    dst[j] = v;
    fin = fin && d_finite(v);
  }
  return fin;
}

// NormParamsAt::reg_narrow: the thread's packs of a bf16 / f16 parameter (or nothing without it) into
// registers; true when every value is finite.
template <class T, int NP>
HT_DEV bool reg_params_narrow(Pack<T, kVec<T>> (&out)[NP], const Param<T, acc_t<T>>& p, int64_t d, int lane, int tpr) {
  constexpr int V = kVec<T>;
  if (!p.p) return true;
  const int packs = static_cast<int>(d / V);
  const T* pt = static_cast<const T*>(p.p);
  const bool vec = aligned_to(p.p, 16);
  bool fin = true;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int q = lane + i * tpr;
    if (q >= packs) continue;
    if (vec) {
      out[i] = reinterpret_cast<const Pack<T, V>*>(pt)[q];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[i].v[k] = pt[static_cast<int64_t>(q) * V + k];
    }
    acc_t<T> f[V];
    unpack(out[i], f);
#pragma unroll
    for (int k = 0; k < V; ++k) fin = fin && d_finite(f[k]);
  }
  return fin;
}

// The staged forward takes the shift by a shuffle from lane 0 (no shift slot) when a row group is at most a warp.
HT_HD inline bool staged_shfl_shift(int tpr) { return tpr <= 32; }

// kReg (variant 3, Note [Norm kernel variants]): the thread's own parameter values (the columns of its packs,
// the same in every row) into registers, straight from global memory (16-byte loads when aligned, else element
// by element); true when every one is finite.
template <class T, class A, int NP, int V>
HT_DEV bool reg_params(A (&out)[NP][V], const Param<T, A>& p, int64_t d, int lane, int tpr, A none) {
  const int packs = static_cast<int>(d / V);
  const bool vec = p.p && aligned_to(p.p, 16);
  bool fin = true;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int q = lane + i * tpr;
    if (q >= packs) continue;
    if (vec || !p.p) {
      load_param<T, A, V>(p, q * V, none, out[i]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[i][k] = p[static_cast<int64_t>(q) * V + k];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) fin = fin && d_finite(out[i][k]);
  }
  return fin;
}

// Row-group bookkeeping shared by the two staged kernels.
struct StagedRows {
  int tpr, per_block, lane, slot;
  int64_t groups;
  HT_DEV StagedRows(int64_t rows, int tpr_) : tpr(tpr_) {
    per_block = kRowBlock / tpr;
    lane = static_cast<int>(threadIdx.x) % tpr;
    slot = static_cast<int>(threadIdx.x) / tpr;
    groups = (rows + per_block - 1) / per_block;
  }
  HT_DEV int64_t row_of(int64_t grp) const { return grp * per_block + slot; }
};

// Where the staged forward keeps the norm parameters: shared memory (variant 2), or (variant 3) registers as
// S, or as packs of the row dtype (bf16 / f16 rows whose parameters are bf16 / f16 or absent: half the
// registers, so 4096-wide rows, 4 packs per thread, do not spill).
enum class NormParamsAt : int { smem = 0, reg = 1, reg_narrow = 2 };

// Blocks per SM the register bound of norm_staged_kernel aims at: 3 for bf16 / f16 packs of parameters at 3
// packs per thread (80 registers, as the shared-memory kernel; the 384- and 768-wide rows), else 2.
template <int NP, int kPm>
inline constexpr int kStagedMinBlocks = kPm == 2 && NP == 3 ? 3 : 2;

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
      // (variant 3: lane 0 of each warp only; it shuffles the shift to its warp, groups being whole warps here)
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
    // The row's values of pack i: variant 2 unpacks them once into registers, variant 3 (whose registers hold
    // the parameters) from the stage at every use.
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

// kCl: variant 4 (Note [Norm backward, cluster variant]; kReg false).
template <class T, int NP, bool kReg, bool kCl = false>
__global__ void __launch_bounds__(kRowBlock, 2) norm_backward_staged_kernel(NormBackwardArgs a, int tpr, int stages) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  constexpr int kSlots = 2 * NP + 1;  // the thread's packs of g, of x, then (mean, rstd) of the row
  static_assert(2 * sizeof(A) <= sizeof(P), "row statistics in one slot");
  static_assert(kRowBlock / 64 <= 4, "variant 4: one named barrier per row group of more than a warp (ids 1..4)");
  extern __shared__ __align__(16) unsigned char norm_dyn_smem[];
  __shared__ A red[2][2][kRowBlock / 32];
  const int64_t d = a.dim;
  const int packs = static_cast<int>(d / V);
  const bool layer = a.kind == NormKind::layer;
  const bool params = a.gw_partial || a.gb_partial;
  // (D) weight (1 without one), padded to 16 bytes, unless kReg (variant 3: the weight in registers); then the
  // stages [stages][kSlots][block]
  A* ws = reinterpret_cast<A*>(norm_dyn_smem);
  const int64_t ws_bytes = kReg ? 0 : (d * static_cast<int64_t>(sizeof(A)) + 15) / 16 * 16;
  P* stage = reinterpret_cast<P*>(norm_dyn_smem + ws_bytes);
  const StagedRows sr(a.rows, tpr);
  const int tid = static_cast<int>(threadIdx.x);
  const T* gp = static_cast<const T*>(a.g);
  const T* xp = static_cast<const T*>(a.x);
  const A* meanp = static_cast<const A*>(a.mean);
  const A* rstdp = static_cast<const A*>(a.rstd);
  const int stat_width = tpr < 32 ? tpr : 32;  // variant 4: threads of a warp sharing one copy of the statistics
  auto issue = [&](int64_t grp, int st) {
    if (grp < sr.groups) {
      const int64_t r0 = sr.row_of(grp);
      const int64_t row = r0 < a.rows ? r0 : a.rows - 1;
      P* dst = stage + st * kSlots * kRowBlock + tid;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int q = sr.lane + i * tpr;
        if (q >= packs) continue;
        cp_async16(dst + i * kRowBlock, gp + row * d + static_cast<int64_t>(q) * V);
        cp_async16(dst + (NP + i) * kRowBlock, xp + row * d + static_cast<int64_t>(q) * V);
      }
      A* stats = reinterpret_cast<A*>(dst + 2 * NP * kRowBlock);
      // (variant 4: the first thread of each warp's share of the row group only; it shuffles them)
      if (!kCl || sr.lane % stat_width == 0) {
        if (layer) cp_async_small<sizeof(A)>(stats, meanp + row);
        cp_async_small<sizeof(A)>(stats + 1, rstdp + row);
      }
    }
    cp_async_commit();
  };
  for (int s = 0; s + 1 < stages; ++s) issue(blockIdx.x + static_cast<int64_t>(s) * gridDim.x, s);
  const Param<T, A> w{a.weight, a.weight_narrow};
  A wr[kReg ? NP : 1][V];
  if constexpr (kReg) {
    (void)reg_params<T, A, NP, V>(wr, w, d, sr.lane, tpr, A(1));
  } else {
    (void)stage_param(ws, w, d, A(1));
    __syncthreads();
  }
  A accw[NP][V], accb[NP][V];
#pragma unroll
  for (int i = 0; i < NP; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) accw[i][k] = accb[i][k] = A(0);
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
    const P* src = stage + st * kSlots * kRowBlock + tid;
    st = st + 1 == stages ? 0 : st + 1;
    const A* stats = reinterpret_cast<const A*>(src + 2 * NP * kRowBlock);
    A m, r;
    if constexpr (kCl) {
      A m0 = A(0), r0 = A(0);
      if (sr.lane % stat_width == 0) {
        m0 = layer ? stats[0] : A(0);
        r0 = stats[1];
      }
      m = __shfl_sync(kFull, m0, 0, stat_width);
      r = __shfl_sync(kFull, r0, 0, stat_width);
    } else {
      m = layer ? stats[0] : A(0);
      r = stats[1];
    }
    const A mr = m * r;
    auto xhat = [&](A xv) {
      if constexpr (kHalfPack<T>) return d_fma(xv, r, -mr);
      else return (xv - m) * r;
    };
    A s_gh = A(0), s_ghx = A(0);
    auto weight_of = [&](int i, int q, A(&wv)[V]) {
      if constexpr (kReg) {
#pragma unroll
        for (int k = 0; k < V; ++k) wv[k] = wr[i][k];
      } else {
        load_params<A, V>(ws, q * V, A(1), wv);
      }
    };
    // kAcc: a row of the tensor (not past the end), whose g * xhat and g go into the column sums
    auto pass1 = [&](auto acc) {
      constexpr bool kAcc = decltype(acc)::value;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int q = sr.lane + i * tpr;
        if (q >= packs) continue;
        A gf[V], xf[V], wv[V];
        unpack(src[i * kRowBlock], gf);
        unpack(src[(NP + i) * kRowBlock], xf);
        weight_of(i, q, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A xh = xhat(xf[k]);
          const A gh = gf[k] * wv[k];
          s_gh += gh;
          s_ghx = d_fma(gh, xh, s_ghx);
          if constexpr (kAcc) {
            accw[i][k] = d_fma(gf[k], xh, accw[i][k]);
            accb[i][k] += gf[k];
          }
        }
      }
    };
    if (valid) pass1(std::true_type{});
    else pass1(std::false_type{});
    group_sum2<kCl>(s_gh, s_ghx, tpr, red, phase);  // uniform across the row group (kCl) / the block
    if (!valid) continue;
    const A mean_gh = layer ? over_d(s_gh) : A(0), mean_ghx = over_d(s_ghx);
    const A c1 = -r * mean_gh, c2 = -r * mean_ghx;
    // Finite sums and statistics: every g * weight and xhat is finite (a NaN or inf one makes s_ghx NaN or
    // inf), so no result is NaN short of a float overflow (pack_cast unchecked).
    const bool finite = d_finite(s_gh) && d_finite(s_ghx) && d_finite(r) && d_finite(m);
    auto f = [&](int i, A(&o)[V]) {
      const int q = sr.lane + i * tpr;
      A gf[V], xf[V], wv[V];
      unpack(src[i * kRowBlock], gf);
      unpack(src[(NP + i) * kRowBlock], xf);
      weight_of(i, q, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A xh = xhat(xf[k]);
        const A gh = gf[k] * wv[k];
        if constexpr (kHalfPack<T>) o[k] = d_fma(xh, c2, d_fma(gh, r, c1));
        else o[k] = r * ((gh - mean_gh) - xh * mean_ghx);
      }
    };
    T* gx = static_cast<T*>(a.gx) + row * d;
    if (finite) store_packs<false, T, NP>(gx, packs, sr.lane, tpr, f);
    else store_packs<true, T, NP>(gx, packs, sr.lane, tpr, f);
  }
  cp_async_wait(0);
  // variant 3: the finalize launch (programmatic, see launch_norm_param_finalize) may begin now
  if constexpr (kReg) grid_dependents_launch();
  if (!params) return;  // uniform
  __syncthreads();  // the stages are free now
  {
    // The row slots' column sums added pairwise, slot s + h into slot s for h = per_block / 2, ..., 1, every
    // thread of the upper half handing its 2 NP V sums over at once (a fixed order: deterministic), then slot 0
    // stores the block's partial row. (Until run 20 variant 2 had tpr threads of slot 0 walk the per_block slots
    // in one dependent chain per column: 0.173 of copy at 16640 x 384 against 0.461 for this tree.)
    A* ts = reinterpret_cast<A*>(stage);  // [2][NP][V][block / 2]
    auto tat = [&](int which, int i, int k, int t) { return ((which * NP + i) * V + k) * (kRowBlock / 2) + t; };
    for (int h = sr.per_block / 2; h >= 1; h /= 2) {
      if (sr.slot >= h && sr.slot < 2 * h) {
        const int t = (sr.slot - h) * tpr + sr.lane;
#pragma unroll
        for (int i = 0; i < NP; ++i)
#pragma unroll
          for (int k = 0; k < V; ++k) {
            ts[tat(0, i, k, t)] = accw[i][k];
            ts[tat(1, i, k, t)] = accb[i][k];
          }
      }
      __syncthreads();
      if (sr.slot < h) {
        const int t = sr.slot * tpr + sr.lane;
#pragma unroll
        for (int i = 0; i < NP; ++i)
#pragma unroll
          for (int k = 0; k < V; ++k) {
            accw[i][k] += ts[tat(0, i, k, t)];
            accb[i][k] += ts[tat(1, i, k, t)];
          }
      }
      __syncthreads();
    }
    if constexpr (kCl) {
      // Variant 4: the cluster's blocks (row slot 0 of each holds the block's sums now) add up into block 0 of
      // the cluster in rank order (deterministic) through distributed shared memory, and only it stores a
      // partial row (row blockIdx.x / cluster size): cluster-size times fewer rows to write and to finalize.
      const unsigned rank = cluster_rank(), nblocks = cluster_blocks();
      if (nblocks > 1) {  // uniform across the cluster
        A* xs = reinterpret_cast<A*>(stage);  // [2][NP][V][tpr]; the tree above has finished with the stages
        auto xat = [&](int which, int i, int k) { return ((which * NP + i) * V + k) * tpr + sr.lane; };
        if (rank != 0 && sr.slot == 0) {
#pragma unroll
          for (int i = 0; i < NP; ++i)
#pragma unroll
            for (int k = 0; k < V; ++k) {
              xs[xat(0, i, k)] = accw[i][k];
              xs[xat(1, i, k)] = accb[i][k];
            }
        }
        cluster_sync_all();
        if (rank == 0 && sr.slot == 0) {
          for (unsigned c = 1; c < nblocks; ++c) {
            const A* peer = cluster_peer(static_cast<const A*>(xs), c);
#pragma unroll
            for (int i = 0; i < NP; ++i)
#pragma unroll
              for (int k = 0; k < V; ++k) {
                accw[i][k] += peer[xat(0, i, k)];
                accb[i][k] += peer[xat(1, i, k)];
              }
          }
        }
        cluster_sync_all();  // the peers' shared memory stays until block 0 has read it
      }
      if (sr.slot != 0 || rank != 0) return;
      // 16-byte stores (a pack's V sums are 16 or 32 bytes, rows of D sums start 16-byte aligned when the
      // buffer does)
      constexpr int kPer = 16 / static_cast<int>(sizeof(A));
      static_assert(V % kPer == 0, "whole 16-byte stores");
      const int64_t prow = static_cast<int64_t>(blockIdx.x / nblocks) * d;
      auto store_row = [&](void* base, const A(&acc)[NP][V]) {
        if (!base) return;
        A* dst = static_cast<A*>(base) + prow;
        const bool vec = aligned_to(base, 16);
#pragma unroll
        for (int i = 0; i < NP; ++i) {
          const int q = sr.lane + i * tpr;
          if (q >= packs) continue;
          if (vec) {
#pragma unroll
            for (int c = 0; c < V / kPer; ++c) {
              Pack<A, kPer> o;
#pragma unroll
              for (int k = 0; k < kPer; ++k) o.v[k] = acc[i][c * kPer + k];
              reinterpret_cast<Pack<A, kPer>*>(dst + static_cast<int64_t>(q) * V)[c] = o;
            }
          } else {
#pragma unroll
            for (int k = 0; k < V; ++k) dst[static_cast<int64_t>(q) * V + k] = acc[i][k];
          }
        }
      };
      store_row(a.gw_partial, accw);
      store_row(a.gb_partial, accb);
      return;
    }
    if (sr.slot != 0) return;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int q = sr.lane + i * tpr;
      if (q >= packs) continue;
      const int64_t at0 = static_cast<int64_t>(blockIdx.x) * d + q * V;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (a.gw_partial) static_cast<A*>(a.gw_partial)[at0 + k] = accw[i][k];
        if (a.gb_partial) static_cast<A*>(a.gb_partial)[at0 + k] = accb[i][k];
      }
    }
  }
}

// ---- cross-entropy ---------------------------------------------------------------------------------------

template <class T>
__global__ void cross_entropy_kernel(CrossEntropyArgs a, int tpr) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  const T* logits = static_cast<const T*>(a.logits);
  const int64_t c = a.classes;
  for_each_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = logits + row * c;
    A m = -std::numeric_limits<A>::infinity(), total = A(0);
    if (valid)
      row_read(x, c, lane, tpr, [&](int64_t, T xv) {
        const A v = convert<A>(xv);
        m = d_max(m, v);
        total += v;
      });
    m = group_reduce(m, tpr, smem, Max{});
    total = group_reduce(total, tpr, smem, Sum{});
    A s = A(0);
    if (valid)
      row_read(x, c, lane, tpr, [&](int64_t, T v) { s += d_exp(convert<A>(v) - m); });
    s = group_reduce(s, tpr, smem, Sum{});
    if (!valid || lane != 0) return;
    const A lse = m + d_log(s);
    static_cast<A*>(a.lse)[row] = lse;
    const int64_t t = a.target[row];
    A loss = A(0);
    if (t != a.ignore_index) {
      if (t < 0 || t >= c) {
        atomicMax(&a.status[1], static_cast<unsigned long long>(a.rows - row));
      } else {
        atomicAdd(&a.status[0], 1ull);
        const A ls = static_cast<A>(a.label_smoothing);
        const A nll = lse - convert<A>(x[t]);
        const A smooth = lse - total / static_cast<A>(c);
        loss = (A(1) - ls) * nll + (ls > A(0) ? ls * smooth : A(0));
      }
    }
    static_cast<A*>(a.loss)[row] = loss;
  });
}

template <class T>
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardArgs a, int tpr) {
  using A = acc_t<T>;
  const int64_t c = a.classes;
  const A ls = static_cast<A>(a.label_smoothing);
  const A uniform = ls / static_cast<A>(c);
  for_each_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    if (!valid) return;
    T* gx = static_cast<T*>(a.g_logits) + row * c;
    const T* x = static_cast<const T*>(a.logits) + row * c;
    const int64_t t = a.target[row];
    if (t == a.ignore_index) {
      for (int64_t j = lane; j < c; j += tpr) gx[j] = convert<T>(A(0));
      return;
    }
    const A scale = static_cast<const A*>(a.g)[row * a.g_stride] * static_cast<A>(a.g_scale);
    const A lse = static_cast<const A*>(a.lse)[row];
    row_write(gx, x, c, lane, tpr, [&](int64_t j, T v) {
      const A p = d_exp(convert<A>(v) - lse);
      const A q = (j == t ? A(1) - ls : A(0)) + uniform;
      return scale * (p - q);
    });
  });
}

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

// ---- embedding -------------------------------------------------------------------------------------------

template <class U>
__global__ void embedding_kernel(EmbeddingArgs a) {
  U* out = static_cast<U*>(a.out);
  const U* w = static_cast<const U*>(a.weight);
  for (int64_t k = blockIdx.x; k < a.n; k += gridDim.x) {
    const int64_t id = a.ids[k];
    const bool ok = id >= 0 && id < a.vocab;
    if (!ok && threadIdx.x == 0) atomicMax(&a.status[1], static_cast<unsigned long long>(a.n - k));
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) out[k * a.dim + j] = ok ? w[id * a.s0 + j * a.s1] : U(0);
  }
}

template <class T>
__global__ void embedding_backward_kernel(acc_t<T>* acc, const T* g, const int64_t* ids, int64_t n, int64_t dim) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    acc_t<T>* row = acc + ids[k] * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) atomicAdd(row + j, convert<acc_t<T>>(g[k * dim + j]));
  }
}

// ---- max / argmax ----------------------------------------------------------------------------------------

template <class T>
__global__ void max_kernel(T* values, int64_t* indices, const T* in, int64_t rows, int64_t len, int tpr) {
  using A = acc_t<T>;
  __shared__ Best<A> smem[kRowBlock / 32];
  for_each_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = in + row * len;
    // -inf (not lowest()) for floats, so that a row of -inf still picks its first element
    Best<A> best{std::is_floating_point_v<A> ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest(),
                 std::numeric_limits<long long>::max()};
    if (valid)
      for (int64_t j = lane; j < len; j += tpr) best = better(best, Best<A>{convert<A>(x[j]), static_cast<long long>(j)});
    best = group_reduce(best, tpr, smem, Better{});
    if (!valid || lane != 0) return;
    indices[row] = best.i;
    if (values) values[row] = x[best.i];
  });
}

unsigned blocks_for_rows(int64_t n) {
  constexpr int64_t kMaxBlocks = 132 * 64;
  return static_cast<unsigned>(n < 1 ? 1 : (n > kMaxBlocks ? kMaxBlocks : n));
}

// Threads per block for a loop over D elements of a row: a multiple of 32, at most 256.
unsigned threads_for(int64_t dim) {
  const int64_t t = (dim + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

}  // namespace

void launch_softmax(DType dt, SoftmaxKind kind, void* out, const void* in, int64_t rows, int64_t len,
                    cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  const RowGrid g = row_grid(rows, len);
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (const CacheGrid cg = cache_grid(rows, len, kVec<T>, {out, in}); cg.np > 0) {
      constexpr SoftmaxKind kSoft = SoftmaxKind::softmax, kLog = SoftmaxKind::log_softmax;
      auto* kernel = kind == kSoft ? (cg.np == 4 ? softmax_cached_kernel<T, 4, kSoft> : softmax_cached_kernel<T, 8, kSoft>)
                                   : (cg.np == 4 ? softmax_cached_kernel<T, 4, kLog> : softmax_cached_kernel<T, 8, kLog>);
      kernel<<<cg.blocks, cg.block, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), rows, len, cg.tpr);
      HT_CHECK_LAUNCH("softmax_cached_kernel");
      return;
    }
    softmax_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), rows, len,
                                                         g.tpr, kind);
    HT_CHECK_LAUNCH("softmax_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_softmax", dt);
}

void launch_softmax_backward(DType dt, SoftmaxKind kind, void* gx, const void* g, const void* y, int64_t rows,
                             int64_t len, cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  const RowGrid grid = row_grid(rows, len);
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (const BwdGrid bg = bwd_grid(rows, len, kVec<T>, {gx, g, y}, 132 * 64); bg.np > 0) {
      auto* kernel = bg.np == 2 ? softmax_backward_cached_kernel<T, 2> : softmax_backward_cached_kernel<T, 4>;
      kernel<<<bg.blocks, kRowBlock, 0, stream>>>(static_cast<T*>(gx), static_cast<const T*>(g),
                                                  static_cast<const T*>(y), rows, len, bg.tpr, kind);
      HT_CHECK_LAUNCH("softmax_backward_cached_kernel");
      return;
    }
    softmax_backward_kernel<T><<<grid.blocks, kRowBlock, 0, stream>>>(
        static_cast<T*>(gx), static_cast<const T*>(g), static_cast<const T*>(y), rows, len, grid.tpr, kind);
    HT_CHECK_LAUNCH("softmax_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_softmax_backward", dt);
}

void launch_cross_entropy(const CrossEntropyArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const RowGrid g = row_grid(a.rows, a.classes);
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("cross_entropy_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_cross_entropy", a.dtype);
}

void launch_cross_entropy_backward(const CrossEntropyBackwardArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const RowGrid g = row_grid(a.rows, a.classes);
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("cross_entropy_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_cross_entropy_backward", a.dtype);
}

namespace {
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

// Launch shape of a staged kernel: packs per thread (1..4; 0: the kernel does not apply), threads per row,
// stages, dynamic shared memory and grid (one wave of resident blocks, at most one block per row group).
struct StagedGrid {
  int np = 0, tpr = 0, stages = 0;
  NormParamsAt pm = NormParamsAt::smem;  // where the kernel keeps the parameters (variant 3: registers)
  std::size_t smem = 0;
  unsigned blocks = 0;
  bool cluster_kernel = false;  // variant 4's backward kernel (kCl)
  unsigned cluster = 1;  // blocks per thread block cluster (variant 4's backward; blocks is a multiple of it)
  int64_t wave = 0;      // blocks resident at once on the device (occupancy x SMs)
};

struct DeviceLimits {
  std::size_t optin = 0, per_sm = 0, reserved = 0;
  int sms = 0;
};

// Per-device limits and per-(kernel, device, shared memory) occupancies, queried once each. The first query
// of a kernel on a device also raises its dynamic shared memory limit to the opt-in maximum.
std::mutex g_staged_mutex;
std::map<int, DeviceLimits> g_limits;
std::map<std::tuple<const void*, int, std::size_t>, int> g_occupancy;

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

// kernels[np - 1] is the instantiation for np packs per thread. acc: sizeof(S); backward: the backward kernel's
// shared-memory layout (weight, g / x / statistics slots) instead of the forward's (weight and bias, x slots,
// the shift slot unless the row group is at most a warp); kernels[np - 1] for np <= reg_np keep no parameters
// in shared memory (variant 3).
StagedGrid staged_grid(int64_t rows, int64_t len, int vec, std::size_t acc, bool backward, int reg_np,
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

// Variant 3 keeps the parameters in registers: the forward as packs of the row dtype when the rows are bf16 /
// f16 and the given parameters too, else as S; the backward the weight as S; for up to kRegNp packs per
// thread (every staged row: ptxas, sm_90a, shows no spills under the kernels' two-blocks-per-SM bound of 128
// registers; the counts are in Note [Norm kernel variants]). Lower it to keep wider rows' parameters in shared
// memory if a register count ever spills.
constexpr int kRegNp = 4;

using NormFwdKernel = void (*)(NormArgs, int, int);
template <class T, int kPm>
NormFwdKernel norm_fwd_kernel(int np) {
  return np == 1   ? norm_staged_kernel<T, 1, kPm>
         : np == 2 ? norm_staged_kernel<T, 2, kPm>
         : np == 3 ? norm_staged_kernel<T, 3, kPm>
                   : norm_staged_kernel<T, 4, kPm>;
}
template <class T, bool kReg, bool kCl = false>
const void* const (&norm_bwd_kernels())[4] {
  static const void* const k[4] = {reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 1, kReg, kCl>),
                                   reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 2, kReg, kCl>),
                                   reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 3, kReg, kCl>),
                                   reinterpret_cast<const void*>(norm_backward_staged_kernel<T, 4, kReg, kCl>)};
  return k;
}

// Where the forward with np packs per thread keeps the parameters (reg: variant 3).
template <class T>
NormParamsAt fwd_params_at(const NormArgs& a, int np, bool reg) {
  if (!reg) return NormParamsAt::smem;
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

// The staged launch for variant 2 or 3 (reg). The grid is sized with the kernel that will run.
template <class T>
StagedGrid norm_fwd_staged_grid(const NormArgs& a, bool reg) {
  const void* k[4];
  int reg_np = 0;  // the np up to which the parameters are not in shared memory
  for (int np = 1; np <= 4; ++np) {
    const NormParamsAt pm = fwd_params_at<T>(a, np, reg);
    k[np - 1] = reinterpret_cast<const void*>(fwd_kernel_of<T>(pm, np));
    if (pm != NormParamsAt::smem) reg_np = np;
  }
  StagedGrid g = staged_grid(a.rows, a.dim, kVec<T>, sizeof(acc_t<T>), false, reg_np, {a.out, a.x}, k);
  if (g.np > 0) g.pm = fwd_params_at<T>(a, g.np, reg);
  return g;
}

// Variant 4's cluster size for a staged backward grid g of kernel (Note [Norm backward, cluster variant]): the
// largest of 4 and 2 whose clusters, as many as the device holds at once, take the whole grid (g.blocks
// rounded up to the cluster size, at most the wave rounded down); 1 (a plain launch) when neither does or the
// query fails. Sets g.cluster and rounds g.blocks to a multiple of it (the extra blocks get no rows and add
// zero sums).
std::map<std::tuple<const void*, int, std::size_t, unsigned>, int> g_cluster_occupancy;
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

template <class T>
StagedGrid norm_bwd_staged_grid(const NormBackwardArgs& a, bool reg, bool cluster) {
  const int reg_np = reg ? kRegNp : 0;
  const void* k[4];
  for (int i = 0; i < 4; ++i)
    k[i] = i + 1 <= reg_np ? norm_bwd_kernels<T, true>()[i]
           : cluster       ? norm_bwd_kernels<T, false, true>()[i]
                           : norm_bwd_kernels<T, false>()[i];
  StagedGrid g = staged_grid(a.rows, a.dim, kVec<T>, sizeof(acc_t<T>), true, reg_np, {a.gx, a.g, a.x}, k);
  if (g.np > 0 && g.np <= reg_np) g.pm = NormParamsAt::reg;
  if (g.np > 0 && cluster) {
    g.cluster_kernel = true;
    pick_cluster(g, k[g.np - 1]);
  }
  return g;
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
  const RowGrid g = row_grid(a.rows, a.dim);
  const int variant = forward_variant(a.dim);
  const bool staged = variant >= 2;
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (staged) {
      if (const StagedGrid sg = norm_fwd_staged_grid<T>(a, variant == 3); sg.np > 0) {
        const NormFwdKernel kernel = fwd_kernel_of<T>(sg.pm, sg.np);
        kernel<<<sg.blocks, kRowBlock, sg.smem, stream>>>(a, sg.tpr, sg.stages);
        HT_CHECK_LAUNCH("norm_staged_kernel");
        g_staged_forward.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    if (const CacheGrid cg = cache_grid(a.rows, a.dim, kVec<T>, {a.out, a.x, a.weight, a.bias}); cg.np > 0) {
      auto* kernel = cg.np == 4 ? norm_cached_kernel<T, 4> : norm_cached_kernel<T, 8>;
      kernel<<<cg.blocks, cg.block, 0, stream>>>(a, cg.tpr);
      HT_CHECK_LAUNCH("norm_cached_kernel");
      return;
    }
    norm_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("norm_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_norm", a.dtype);
}

namespace {
// Blocks of norm_backward_cached_kernel<T, NP> resident at once on the whole device (occupancy x SMs,
// queried once; 2 x 132 if the queries fail).
template <class T, int NP>
int64_t norm_bwd_resident() {
  static const int64_t n = [] {
    int per_sm = 0, dev = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, norm_backward_cached_kernel<T, NP>, kRowBlock, 0) !=
            cudaSuccess ||
        cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return int64_t{2 * 132};
    }
    return static_cast<int64_t>(per_sm < 1 ? 1 : per_sm) * (sms < 1 ? 1 : sms);
  }();
  return n;
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
  if (variant >= 2)
    visit_kernel_float(a.dtype,
                       [&](auto tag) { p.staged = norm_bwd_staged_grid<decltype(tag)>(a, variant == 3, variant == 4); });
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
  const RowGrid g = row_grid(a.rows, a.dim);
  const NormBwdPlan plan = norm_bwd_plan(a);
  // gw_partial / gb_partial are only given when norm_backward_partials(a) > 0 (the same plan).
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (const StagedGrid& sg = plan.staged; sg.np > 0) {
      auto pick = [&](auto reg) {
        constexpr bool kReg = decltype(reg)::value;
        return sg.np == 1   ? norm_backward_staged_kernel<T, 1, kReg>
               : sg.np == 2 ? norm_backward_staged_kernel<T, 2, kReg>
               : sg.np == 3 ? norm_backward_staged_kernel<T, 3, kReg>
                            : norm_backward_staged_kernel<T, 4, kReg>;
      };
      if (sg.cluster_kernel) {
        // variant 4: the cluster kernels, in clusters of sg.cluster blocks (a plain launch when 1)
        auto* kernel = sg.np == 1   ? norm_backward_staged_kernel<T, 1, false, true>
                       : sg.np == 2 ? norm_backward_staged_kernel<T, 2, false, true>
                       : sg.np == 3 ? norm_backward_staged_kernel<T, 3, false, true>
                                    : norm_backward_staged_kernel<T, 4, false, true>;
        if (sg.cluster > 1) {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(sg.blocks, 1, 1);
          cfg.blockDim = dim3(kRowBlock, 1, 1);
          cfg.dynamicSmemBytes = sg.smem;
          cfg.stream = stream;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeClusterDimension;
          attr[0].val.clusterDim.x = sg.cluster;
          attr[0].val.clusterDim.y = 1;
          attr[0].val.clusterDim.z = 1;
          cfg.attrs = attr;
          cfg.numAttrs = 1;
          HT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, sg.tpr, sg.stages));
        } else {
          kernel<<<sg.blocks, kRowBlock, sg.smem, stream>>>(a, sg.tpr, sg.stages);
        }
        HT_CHECK_LAUNCH("norm_backward_staged_kernel (cluster)");
        g_staged_backward.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      auto* kernel = sg.pm == NormParamsAt::reg ? pick(std::true_type{}) : pick(std::false_type{});
      kernel<<<sg.blocks, kRowBlock, sg.smem, stream>>>(a, sg.tpr, sg.stages);
      HT_CHECK_LAUNCH("norm_backward_staged_kernel");
      g_staged_backward.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (const BwdGrid& bg = plan.cached; bg.np > 0) {
      auto* kernel = bg.np == 2 ? norm_backward_cached_kernel<T, 2> : norm_backward_cached_kernel<T, 4>;
      kernel<<<bg.blocks, kRowBlock, 0, stream>>>(a, bg.tpr);
      HT_CHECK_LAUNCH("norm_backward_cached_kernel");
      return;
    }
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

void launch_embedding(const EmbeddingArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.dim == 0) return;
  const unsigned blocks = blocks_for_rows(a.n), threads = threads_for(a.dim);
  switch (a.itemsize) {
    case 1: embedding_kernel<uint8_t><<<blocks, threads, 0, stream>>>(a); break;
    case 2: embedding_kernel<uint16_t><<<blocks, threads, 0, stream>>>(a); break;
    case 4: embedding_kernel<uint32_t><<<blocks, threads, 0, stream>>>(a); break;
    case 8: embedding_kernel<unsigned long long><<<blocks, threads, 0, stream>>>(a); break;
    default: HT_UNSUPPORTED_DTYPE("launch_embedding (itemsize)", static_cast<DType>(a.itemsize));
  }
  HT_CHECK_LAUNCH("embedding_kernel");
}

void launch_embedding_backward(DType g_dtype, void* acc, const void* g, const int64_t* ids, int64_t n, int64_t dim,
                               cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  const unsigned blocks = blocks_for_rows(n), threads = threads_for(dim);
  const bool ok = visit_kernel_float(g_dtype, [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<T><<<blocks, threads, 0, stream>>>(static_cast<acc_t<T>*>(acc),
                                                                 static_cast<const T*>(g), ids, n, dim);
    HT_CHECK_LAUNCH("embedding_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_embedding_backward", g_dtype);
}

void launch_max(DType dt, void* values, int64_t* indices, const void* x, int64_t rows, int64_t len,
                cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  const RowGrid g = row_grid(rows, len);
  const bool ok = visit_compute_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    max_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(static_cast<T*>(values), indices, static_cast<const T*>(x), rows,
                                                     len, g.tpr);
    HT_CHECK_LAUNCH("max_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_max", dt);
}

}  // namespace ht::kernels
