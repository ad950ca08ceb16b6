// Device helpers of the row kernels (cuda/kernels/rows*.cu; the constants and launch shapes are in
// rows_launch.cuh, the staged kernels' own helpers in rows_staged.cuh): math wrappers, the row-group
// reductions and loops of the multi-pass kernels, the row cache and pack arithmetic of the register-resident
// and staged kernels, and the norm parameters. The helpers are HT_DEV (__forceinline__): each kernel compiles as
// when they shared its file.
#pragma once
#include <cstring>
#include <limits>
#include <type_traits>

#include "cuda/kernels/rows_launch.cuh"

namespace ht::kernels::rk {

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

// ---- register-resident rows: softmax / log_softmax and layer_norm / rms_norm forward --------------------
// A group of tpr threads (a power of two, 32..512) holds a whole row in registers, NP 16-byte packs per
// thread (NP = 4, or 8 for rows longer than 512 x 4 packs): the row is read from global memory once,
// reduced, and written once (the multi-pass kernels re-read it for every statistic). Lane l holds
// packs l, l + tpr, ... Used when every row is packable (the length a multiple of a pack, the base pointers
// 16-byte aligned: the host checks, so the kernels have no scalar path) and at most 512 x 8 packs long;
// other rows use the multi-pass kernels. Row-internal indices fit in 32 bits. bf16 / f16 results are
// rounded by the hardware cvt (pack_cast). Four packs per thread keep the forward kernels at 64
// registers (with the row's floats, or a softmax's exponentials), so four 256-thread blocks share an SM and
// one block's loads overlap another's reductions.

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
// The forward kernels are issue-bound when every element costs a dozen instructions (a 4096-wide bf16
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
// a sum over rows of g * xhat, by up to rows * 5e-6 * rstd * |g|: the f16 "offset rows" case of test_gpu_rows_norm
// (300 x 768) differs from the CPU reference by up to 1.5e-3 in 23 columns whose gradient is near 0.
// The CPU is the accurate side: a host simulation of this kernel's summation order against an all-double
// computation gives 1.3e-3 for the float sum (22 columns over the test's tolerance) and 9.4e-5 for the CPU
// reference (its mean in double, saved in float). The shifted sums are of values x - K within the spread of
// the row (x - K exact in float for bf16 / f16 x), so the mean is the float rounding of the exact one: the
// simulation gives exactly the CPU's float mean. The staged bf16 / f16 kernels shift the same way. f32 / f64
// keep sum(x) / D: their x - K is rounded, and a far outlier K (the test's first element 1000 in a row of
// U(-1, 1)) makes the shifted sums about -1000 D, whose float rounding would exceed the f32 tolerance.
template <class T>
inline constexpr bool kShiftMean = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

}  // namespace ht::kernels::rk
