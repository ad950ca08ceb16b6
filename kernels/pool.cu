// 2-D pooling kernels: max (with i32 argmax indices), fixed-window and adaptive average, forward and backward,
// for dense NCHW outputs (x read through its strides) and for channels-last (NHWC) buffers. The formulas are
// the CPU reference's (src/ops/pool.cpp), read side by side: windows clipped to the unpadded input, sums in
// double in the CPU's order, so forward and backward results are bit-identical to the CPU. Backward is a
// gather (one thread per input element, or pixel and channel group, over the outputs whose windows can hold
// it, ascending oh then ow as the CPU adds them): deterministic, no atomics.
//
// Index type I: int32_t (divisions by FastDiv, a multiply-high and a shift) when every index and offset of
// the pool is below 2^31 minus a margin for the grid-stride step, else int64_t with plain division.
// Max compares in float for bf16/f16/f32 (the widening is exact, so the order, the ties and the NaN test are
// those of the CPU's double compares) and in double for f64.
// NHWC kernels give each thread a pixel and V consecutive channels (V = 16 bytes of T when C % V == 0 and
// every buffer is 16-byte aligned, else 1): consecutive threads read consecutive channels, coalesced.
// The global average pool (one window = the whole plane, output 1x1: the ResNet head) has its own kernels:
// NCHW forward stages a block of planes in shared memory with 16-byte loads and lets each thread sum one
// plane sequentially; NHWC forward and backward give a thread V channels of one sample and walk the pixels.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "kernels/convert.cuh"
#include "kernels/launch.h"
#include "kernels/pool.h"

namespace ht::kernels {
namespace {

// Division of a non-negative index by a fixed positive divisor.
template <class I>
struct IndexDiv;
template <>
struct IndexDiv<int32_t> {
  FastDiv f;
  IndexDiv() = default;
  explicit IndexDiv(int64_t d) : f(static_cast<uint32_t>(d < 1 ? 1 : d)) {}
  HT_DEV int32_t operator()(int32_t n) const { return static_cast<int32_t>(f.div(static_cast<uint32_t>(n))); }
};
template <>
struct IndexDiv<int64_t> {
  int64_t d = 1;
  IndexDiv() = default;
  explicit IndexDiv(int64_t v) : d(v < 1 ? 1 : v) {}
  HT_DEV int64_t operator()(int64_t n) const { return n / d; }
};

// The pool as the kernels read it, in index type I. CV: channel groups of V channels (NHWC kernels).
template <class I>
struct Geo {
  I N, C, H, W, OH, OW, CV;
  I kh, kw, sh, sw, ph, pw;
  I xn, xc, xh, xw;  // x's element strides (NCHW kernels)
  IndexDiv<I> by_C, by_H, by_W, by_OH, by_OW, by_sh, by_sw, by_CV;
};

template <class I>
Geo<I> make_geo(const PoolShape& s, PoolStrides xs, int V) {
  Geo<I> g;
  g.N = static_cast<I>(s.N);
  g.C = static_cast<I>(s.C);
  g.H = static_cast<I>(s.H);
  g.W = static_cast<I>(s.W);
  g.OH = static_cast<I>(s.OH);
  g.OW = static_cast<I>(s.OW);
  g.CV = static_cast<I>(s.C / V);
  g.kh = s.kh;
  g.kw = s.kw;
  g.sh = s.sh;
  g.sw = s.sw;
  g.ph = s.ph;
  g.pw = s.pw;
  g.xn = static_cast<I>(xs.n);
  g.xc = static_cast<I>(xs.c);
  g.xh = static_cast<I>(xs.h);
  g.xw = static_cast<I>(xs.w);
  g.by_C = IndexDiv<I>(s.C);
  g.by_H = IndexDiv<I>(s.H);
  g.by_W = IndexDiv<I>(s.W);
  g.by_OH = IndexDiv<I>(s.OH);
  g.by_OW = IndexDiv<I>(s.OW);
  g.by_sh = IndexDiv<I>(s.sh);
  g.by_sw = IndexDiv<I>(s.sw);
  g.by_CV = IndexDiv<I>(s.C / V);
  return g;
}

// Every element count, offset and intermediate product of the index math below 2^31 (less a margin: the
// grid-stride loops step past the end by at most grid_for's 2^21 threads before the test).
bool fits_i32(const PoolShape& s, PoolStrides xs) {
  constexpr int64_t kLimit = (int64_t{1} << 31) - (int64_t{1} << 24);
  const int64_t span = 1 + (s.N - 1) * std::llabs(xs.n) + (s.C - 1) * std::llabs(xs.c) +
                       (s.H - 1) * std::llabs(xs.h) + (s.W - 1) * std::llabs(xs.w);
  return s.N * s.C * s.H * s.W <= kLimit && s.N * s.C * s.OH * s.OW <= kLimit && span <= kLimit &&
         (s.OH + 1) * (s.H + 1) <= kLimit && (s.OW + 1) * (s.W + 1) <= kLimit &&
         (s.H + s.kh + s.ph) * (s.sh + 1) <= kLimit && (s.W + s.kw + s.pw) * (s.sw + 1) <= kLimit;
}

template <class I>
HT_DEV I thread_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <class I>
HT_DEV I grid_step() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}
template <class I>
HT_DEV I imin(I a, I b) {
  return a < b ? a : b;
}
template <class I>
HT_DEV I imax(I a, I b) {
  return a > b ? a : b;
}

template <class T, int V>
HT_DEV Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <class T, int V>
HT_DEV void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}
// V indices moved 16 bytes (or V * 4 bytes, when fewer) at a time.
template <int V>
HT_DEV void load_indices(const int32_t* p, int32_t (&v)[V]) {
  constexpr int IV = V < 4 ? V : 4;
HT_UNROLL
  for (int k = 0; k < V / IV; ++k) {
    const Pack<int32_t, IV> q = load_pack<int32_t, IV>(p + k * IV);
HT_UNROLL
    for (int j = 0; j < IV; ++j) v[k * IV + j] = q.v[j];
  }
}
template <int V>
HT_DEV void store_indices(int32_t* p, const int32_t (&v)[V]) {
  constexpr int IV = V < 4 ? V : 4;
HT_UNROLL
  for (int k = 0; k < V / IV; ++k) {
    Pack<int32_t, IV> q;
HT_UNROLL
    for (int j = 0; j < IV; ++j) q.v[j] = v[k * IV + j];
    store_pack<int32_t, IV>(p + k * IV, q);
  }
}

// Max compares in float for the float-sized and narrower dtypes (exact widening) and in double for f64.
template <class T>
using cmp_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <class T>
HT_DEV cmp_t<T> cmp_value(T x) {
  return static_cast<cmp_t<T>>(x);
}
// The CPU's rule: a strictly greater element replaces the best (the first maximal element wins ties), and
// the first NaN replaces a non-NaN best and is never replaced.
template <class C>
HT_DEV bool beats(C v, C best) {
  return v > best || (v != v && best == best);
}

// Window of output (oh, ow) of a fixed pool, clipped to the unpadded input: rows [h0, h1), cols [w0, w1).
template <class I>
struct Win {
  I h0, h1, w0, w1;
  double divisor;  // averaging pools
};
template <class I>
HT_DEV Win<I> fixed_window(const Geo<I>& g, I oh, I ow) {
  const I hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  return {imax<I>(hs, 0), imin<I>(hs + g.kh, g.H), imax<I>(ws, 0), imin<I>(ws + g.kw, g.W),
          static_cast<double>(g.kh * g.kw)};
}
// Averaging windows: fixed (padding counted in the divisor kh*kw) or PyTorch's adaptive bins
// start = floor(i * in / out), end = ceil((i + 1) * in / out).
template <class I>
HT_DEV Win<I> avg_window(const Geo<I>& g, AvgKind kind, I oh, I ow) {
  if (kind == AvgKind::adaptive) {
    const I h0 = g.by_OH(oh * g.H), h1 = g.by_OH((oh + 1) * g.H + g.OH - 1);
    const I w0 = g.by_OW(ow * g.W), w1 = g.by_OW((ow + 1) * g.W + g.OW - 1);
    return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
  }
  return fixed_window(g, oh, ow);
}

// Outputs [lo, hi] along one axis whose window can hold input position i (exact for both kinds; the avg
// backward still tests the window, which costs little and keeps the two rules in one place).
template <class I>
struct Range {
  I lo, hi;
};
template <class I>
HT_DEV Range<I> fixed_range(I i, I k, I s, I p, I out, const IndexDiv<I>& by_s) {
  const I a = i + p - k + 1;  // first output: ceil(a / s), clamped at 0
  const I lo = a <= 0 ? I(0) : by_s(a + s - 1);
  return {lo, imin<I>(by_s(i + p), out - 1)};
}
template <class I>
HT_DEV Range<I> adaptive_range(I i, I in, I out, const IndexDiv<I>& by_in) {
  return {by_in(i * out), imin<I>(by_in((i + 1) * out + in - 1) - 1, out - 1)};
}
template <class I>
HT_DEV Range<I> range_h(const Geo<I>& g, AvgKind kind, I h) {
  return kind == AvgKind::adaptive ? adaptive_range(h, g.H, g.OH, g.by_H)
                                    : fixed_range(h, g.kh, g.sh, g.ph, g.OH, g.by_sh);
}
template <class I>
HT_DEV Range<I> range_w(const Geo<I>& g, AvgKind kind, I w) {
  return kind == AvgKind::adaptive ? adaptive_range(w, g.W, g.OW, g.by_W)
                                    : fixed_range(w, g.kw, g.sw, g.pw, g.OW, g.by_sw);
}

// ---- max pool ----------------------------------------------------------------------------------------

// NCHW: one thread per output element; x through its strides; out and indices (N, C, OH, OW) dense.
template <class T, class I>
__global__ void __launch_bounds__(cuda::kBlock) max_fwd_nchw(const T* __restrict__ x, Geo<I> g, T* __restrict__ out,
                                                             int32_t* __restrict__ indices) {
  const I total = g.N * g.C * g.OH * g.OW;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_OW(i), ow = i - q * g.OW;
    const I plane = g.by_OH(q), oh = q - plane * g.OH;
    const I n = g.by_C(plane), c = plane - n * g.C;
    const T* p = x + n * g.xn + c * g.xc;
    // Padding is -inf: only real elements are visited (Note [Pool windows are never empty]).
    const Win<I> w = fixed_window(g, oh, ow);
    T best = p[w.h0 * g.xh + w.w0 * g.xw];
    cmp_t<T> best_v = cmp_value(best);
    I best_i = w.h0 * g.W + w.w0;
    for (I h = w.h0; h < w.h1; ++h)
      for (I v = w.w0; v < w.w1; ++v) {
        const T e = p[h * g.xh + v * g.xw];
        const cmp_t<T> ev = cmp_value(e);
        if (beats(ev, best_v)) {
          best = e;
          best_v = ev;
          best_i = h * g.W + v;
        }
      }
    out[i] = best;
    if (indices) indices[i] = static_cast<int32_t>(best_i);
  }
}

// NHWC: one thread per output pixel and V channels; x, out and indices dense (N, H|OH, W|OW, C).
template <class T, int V, class I>
__global__ void __launch_bounds__(cuda::kBlock) max_fwd_nhwc(const T* __restrict__ x, Geo<I> g, T* __restrict__ out,
                                                             int32_t* __restrict__ indices) {
  const I total = g.N * g.OH * g.OW * g.CV;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_CV(i), c = (i - q * g.CV) * V;  // q: the output pixel (n * OH + oh) * OW + ow
    const I r = g.by_OW(q), ow = q - r * g.OW;
    const I n = g.by_OH(r), oh = r - n * g.OH;
    const T* p = x + n * g.H * g.W * g.C + c;
    const Win<I> w = fixed_window(g, oh, ow);
    Pack<T, V> best = load_pack<T, V>(p + (w.h0 * g.W + w.w0) * g.C);
    cmp_t<T> best_v[V];
    int32_t best_i[V];
HT_UNROLL
    for (int j = 0; j < V; ++j) {
      best_v[j] = cmp_value(best.v[j]);
      best_i[j] = static_cast<int32_t>(w.h0 * g.W + w.w0);
    }
    for (I h = w.h0; h < w.h1; ++h)
      for (I v = w.w0; v < w.w1; ++v) {
        const I hw = h * g.W + v;
        const Pack<T, V> e = load_pack<T, V>(p + hw * g.C);
HT_UNROLL
        for (int j = 0; j < V; ++j) {
          const cmp_t<T> ev = cmp_value(e.v[j]);
          if (beats(ev, best_v[j])) {
            best.v[j] = e.v[j];
            best_v[j] = ev;
            best_i[j] = static_cast<int32_t>(hw);
          }
        }
      }
    store_pack<T, V>(out + q * g.C + c, best);
    if (indices) store_indices<V>(indices + q * g.C + c, best_i);
  }
}

// NCHW: one thread per input element gathering the outputs whose window selected it; all dense.
template <class T, class I>
__global__ void __launch_bounds__(cuda::kBlock) max_bwd_nchw(const T* __restrict__ gout,
                                                             const int32_t* __restrict__ indices, Geo<I> g,
                                                             T* __restrict__ gx) {
  const I total = g.N * g.C * g.H * g.W;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_W(i), w = i - q * g.W;
    const I plane = g.by_H(q), h = q - plane * g.H;
    const int32_t self = static_cast<int32_t>(h * g.W + w);
    const Range<I> rh = fixed_range(h, g.kh, g.sh, g.ph, g.OH, g.by_sh);
    const Range<I> rw = fixed_range(w, g.kw, g.sw, g.pw, g.OW, g.by_sw);
    const I base = plane * g.OH * g.OW;
    double acc = 0.0;
    for (I oh = rh.lo; oh <= rh.hi; ++oh)
      for (I ow = rw.lo; ow <= rw.hi; ++ow) {
        const I o = base + oh * g.OW + ow;
        if (indices[o] == self) acc += to_double(gout[o]);
      }
    gx[i] = convert<T>(acc);
  }
}

// NHWC: one thread per input pixel and V channels; all dense (N, H|OH, W|OW, C).
template <class T, int V, class I>
__global__ void __launch_bounds__(cuda::kBlock) max_bwd_nhwc(const T* __restrict__ gout,
                                                             const int32_t* __restrict__ indices, Geo<I> g,
                                                             T* __restrict__ gx) {
  const I total = g.N * g.H * g.W * g.CV;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_CV(i), c = (i - q * g.CV) * V;  // q: the input pixel (n * H + h) * W + w
    const I r = g.by_W(q), w = q - r * g.W;
    const I n = g.by_H(r), h = r - n * g.H;
    const int32_t self = static_cast<int32_t>(h * g.W + w);
    const Range<I> rh = fixed_range(h, g.kh, g.sh, g.ph, g.OH, g.by_sh);
    const Range<I> rw = fixed_range(w, g.kw, g.sw, g.pw, g.OW, g.by_sw);
    double acc[V];
HT_UNROLL
    for (int j = 0; j < V; ++j) acc[j] = 0.0;
    for (I oh = rh.lo; oh <= rh.hi; ++oh)
      for (I ow = rw.lo; ow <= rw.hi; ++ow) {
        const I o = ((n * g.OH + oh) * g.OW + ow) * g.C + c;
        int32_t sel[V];
        load_indices<V>(indices + o, sel);
        bool any = false;
HT_UNROLL
        for (int j = 0; j < V; ++j) any |= sel[j] == self;
        if (!any) continue;
        const Pack<T, V> gv = load_pack<T, V>(gout + o);
HT_UNROLL
        for (int j = 0; j < V; ++j)
          if (sel[j] == self) acc[j] += to_double(gv.v[j]);
      }
    Pack<T, V> res;
HT_UNROLL
    for (int j = 0; j < V; ++j) res.v[j] = convert<T>(acc[j]);
    store_pack<T, V>(gx + q * g.C + c, res);
  }
}

// ---- average pools -------------------------------------------------------------------------------------

template <class T, class I>
__global__ void __launch_bounds__(cuda::kBlock) avg_fwd_nchw(const T* __restrict__ x, Geo<I> g, AvgKind kind,
                                                             T* __restrict__ out) {
  const I total = g.N * g.C * g.OH * g.OW;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_OW(i), ow = i - q * g.OW;
    const I plane = g.by_OH(q), oh = q - plane * g.OH;
    const I n = g.by_C(plane), c = plane - n * g.C;
    const T* p = x + n * g.xn + c * g.xc;
    const Win<I> w = avg_window(g, kind, oh, ow);
    double acc = 0.0;
    for (I h = w.h0; h < w.h1; ++h)
      for (I v = w.w0; v < w.w1; ++v) acc += to_double(p[h * g.xh + v * g.xw]);
    out[i] = convert<T>(acc / w.divisor);
  }
}

template <class T, int V, class I>
__global__ void __launch_bounds__(cuda::kBlock) avg_fwd_nhwc(const T* __restrict__ x, Geo<I> g, AvgKind kind,
                                                             T* __restrict__ out) {
  const I total = g.N * g.OH * g.OW * g.CV;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_CV(i), c = (i - q * g.CV) * V;
    const I r = g.by_OW(q), ow = q - r * g.OW;
    const I n = g.by_OH(r), oh = r - n * g.OH;
    const T* p = x + n * g.H * g.W * g.C + c;
    const Win<I> w = avg_window(g, kind, oh, ow);
    double acc[V];
HT_UNROLL
    for (int j = 0; j < V; ++j) acc[j] = 0.0;
    for (I h = w.h0; h < w.h1; ++h)
      for (I v = w.w0; v < w.w1; ++v) {
        const Pack<T, V> e = load_pack<T, V>(p + (h * g.W + v) * g.C);
HT_UNROLL
        for (int j = 0; j < V; ++j) acc[j] += to_double(e.v[j]);
      }
    Pack<T, V> res;
HT_UNROLL
    for (int j = 0; j < V; ++j) res.v[j] = convert<T>(acc[j] / w.divisor);
    store_pack<T, V>(out + q * g.C + c, res);
  }
}

template <class T, class I>
__global__ void __launch_bounds__(cuda::kBlock) avg_bwd_nchw(const T* __restrict__ gout, Geo<I> g, AvgKind kind,
                                                             T* __restrict__ gx) {
  const I total = g.N * g.C * g.H * g.W;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_W(i), w = i - q * g.W;
    const I plane = g.by_H(q), h = q - plane * g.H;
    const Range<I> rh = range_h(g, kind, h), rw = range_w(g, kind, w);
    const T* gp = gout + plane * g.OH * g.OW;
    double acc = 0.0;
    for (I oh = rh.lo; oh <= rh.hi; ++oh)
      for (I ow = rw.lo; ow <= rw.hi; ++ow) {
        const Win<I> win = avg_window(g, kind, oh, ow);
        if (h >= win.h0 && h < win.h1 && w >= win.w0 && w < win.w1)
          acc += to_double(gp[oh * g.OW + ow]) / win.divisor;
      }
    gx[i] = convert<T>(acc);
  }
}

template <class T, int V, class I>
__global__ void __launch_bounds__(cuda::kBlock) avg_bwd_nhwc(const T* __restrict__ gout, Geo<I> g, AvgKind kind,
                                                             T* __restrict__ gx) {
  const I total = g.N * g.H * g.W * g.CV;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const I q = g.by_CV(i), c = (i - q * g.CV) * V;
    const I r = g.by_W(q), w = q - r * g.W;
    const I n = g.by_H(r), h = r - n * g.H;
    const Range<I> rh = range_h(g, kind, h), rw = range_w(g, kind, w);
    double acc[V];
HT_UNROLL
    for (int j = 0; j < V; ++j) acc[j] = 0.0;
    for (I oh = rh.lo; oh <= rh.hi; ++oh)
      for (I ow = rw.lo; ow <= rw.hi; ++ow) {
        const Win<I> win = avg_window(g, kind, oh, ow);
        if (!(h >= win.h0 && h < win.h1 && w >= win.w0 && w < win.w1)) continue;
        const Pack<T, V> gv = load_pack<T, V>(gout + ((n * g.OH + oh) * g.OW + ow) * g.C + c);
HT_UNROLL
        for (int j = 0; j < V; ++j) acc[j] += to_double(gv.v[j]) / win.divisor;
      }
    Pack<T, V> res;
HT_UNROLL
    for (int j = 0; j < V; ++j) res.v[j] = convert<T>(acc[j]);
    store_pack<T, V>(gx + q * g.C + c, res);
  }
}

// ---- global average pool (one window: the whole plane; out (N, C) in either layout) --------------------

// NCHW, planes dense (plane p at x + p * hw): a block of P = blockDim.x threads copies its P planes into
// shared memory (16-byte loads when x is 16-byte aligned; the block's first element is, as P * hw *
// sizeof(T) is a multiple of 16 for P a multiple of 8), then thread t sums plane t in row-major order.
template <class T>
__global__ void global_avg_fwd_nchw(const T* __restrict__ x, int64_t planes, int hw, double divisor,
                                    T* __restrict__ out) {
  extern __shared__ uint4 smem_words[];
  T* sm = reinterpret_cast<T*>(smem_words);
  const int P = static_cast<int>(blockDim.x);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * P;
  const int np = static_cast<int>(planes - first < P ? planes - first : P);
  const int count = np * hw;
  const T* src = x + first * hw;
  int done = 0;
  if (aligned_to(src, 16)) {
    constexpr int E = 16 / static_cast<int>(sizeof(T));
    const int words = count / E;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
#pragma unroll 4
    for (int v = threadIdx.x; v < words; v += P) smem_words[v] = s4[v];
    done = words * E;
  }
  for (int e = done + static_cast<int>(threadIdx.x); e < count; e += P) sm[e] = src[e];
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < np) {
    const T* row = sm + threadIdx.x * hw;
    double acc = 0.0;
    for (int e = 0; e < hw; ++e) acc += to_double(row[e]);
    out[first + threadIdx.x] = convert<T>(acc / divisor);
  }
}

// NHWC dense: a block per (sample n, chunk of kBlock channels; grid y strides over the samples). The block
// stages E pixels of its channels at a time in shared memory, (E, kBlock) elements, with loads of V channels
// spread over every thread of the block (all in flight at once), then thread t adds channel c0 + t's E
// values in pixel order in double. E (launcher: the most pixels whose chunk fits 48 KiB, at most hw) lets
// any plane size run here. The CPU's order (row-major h, w = pixel order): the same bits.
template <class T, int V>
__global__ void __launch_bounds__(cuda::kBlock) global_avg_fwd_nhwc(const T* __restrict__ x, int64_t N, int64_t C,
                                                                    int64_t hw, int E, double divisor,
                                                                    T* __restrict__ out) {
  extern __shared__ uint4 smem_words[];
  T* sm = reinterpret_cast<T*>(smem_words);  // (E, B): pixel e's channel t at e * B + t
  constexpr int B = cuda::kBlock;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * B;
  const int nc = static_cast<int>(C - c0 < B ? C - c0 : B);  // this chunk's channels, a multiple of V
  const int packs = nc / V;
  const int t = static_cast<int>(threadIdx.x);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const T* src = x + n * hw * C + c0;
    double acc = 0.0;
    for (int64_t e0 = 0; e0 < hw; e0 += E) {
      const int ne = static_cast<int>(hw - e0 < E ? hw - e0 : E);
      for (int k = t; k < ne * packs; k += B) {
        const int e = k / packs, j = k - e * packs;
        store_pack<T, V>(sm + e * B + j * V, load_pack<T, V>(src + (e0 + e) * C + j * V));
      }
      __syncthreads();
      if (t < nc)
        for (int e = 0; e < ne; ++e) acc += to_double(sm[e * B + t]);
      __syncthreads();  // the next chunk (or sample) overwrites the stage
    }
    if (t < nc) out[n * C + c0 + t] = convert<T>(acc / divisor);
  }
}

// The CPU's value of every element of a plane: 0 + g / divisor (the sum over the one window holding it),
// rounded to T. `+ 0.0` matters: it turns a -0 share into +0, as the CPU's accumulator does.
template <class T>
HT_DEV T global_share(T g, double divisor) {
  double acc = 0.0;
  acc += to_double(g) / divisor;
  return convert<T>(acc);
}

// NCHW dense: gx element e of plane e / hw; V consecutive elements per thread (cached per plane).
template <class T, int V, class I>
__global__ void __launch_bounds__(cuda::kBlock) global_avg_bwd_nchw(const T* __restrict__ gout, I total,
                                                                    IndexDiv<I> by_hw, double divisor,
                                                                    T* __restrict__ gx) {
  const I groups = total / V;
  for (I i = thread_index<I>(); i < groups; i += grid_step<I>()) {
    Pack<T, V> res;
    I last = -1;
    T val{};
HT_UNROLL
    for (int j = 0; j < V; ++j) {
      const I plane = by_hw(i * V + j);
      if (plane != last) {
        val = global_share(gout[plane], divisor);
        last = plane;
      }
      res.v[j] = val;
    }
    store_pack<T, V>(gx + i * V, res);
  }
}

// NHWC dense: gx (N, hw, C); a thread per V consecutive channels of one pixel (grid y strides over the
// samples), reading its V output gradients (16 bytes when V > 1; a sample's hw pixels share them in cache).
template <class T, int V, class I>
__global__ void __launch_bounds__(cuda::kBlock) global_avg_bwd_nhwc(const T* __restrict__ gout, int64_t N, int64_t C,
                                                                    I per, IndexDiv<I> by_CV, double divisor,
                                                                    T* __restrict__ gx) {
  const I CV = static_cast<I>(C / V);  // per = hw * CV packs a sample
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y)
    for (I i = thread_index<I>(); i < per; i += grid_step<I>()) {
      const I c = (i - by_CV(i) * CV) * V;
      const Pack<T, V> gv = load_pack<T, V>(gout + n * C + c);
      Pack<T, V> res;
HT_UNROLL
      for (int j = 0; j < V; ++j) res.v[j] = global_share(gv.v[j], divisor);
      store_pack<T, V>(gx + n * static_cast<int64_t>(per) * V + static_cast<int64_t>(i) * V, res);
    }
}

// ---- dispatch ------------------------------------------------------------------------------------------

// Elements of T in one 16-byte access.
template <class T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// 16-byte channel groups apply: C a multiple of kVec<T> and every buffer (null ones skipped) 16-byte aligned.
template <class T>
bool vec_ok(int64_t C, std::initializer_list<const void*> buffers) {
  if (C % kVec<T> != 0) return false;
  for (const void* b : buffers)
    if (b && !aligned_to(b, 16)) return false;
  return true;
}

// Calls f(I{}) with int32_t when the pool's indices fit in 32 bits, else int64_t.
template <class F>
void with_index(bool i32, F&& f) {
  if (i32) f(int32_t{});
  else f(int64_t{});
}

// The window of the single output is the whole plane (fixed: a kernel reaching past the bottom-right edge
// with the top-left padding; the divisor stays kh*kw).
bool global_window(AvgKind kind, const PoolShape& s) {
  if (s.OH != 1 || s.OW != 1) return false;
  return kind == AvgKind::adaptive || (s.kh - s.ph >= s.H && s.kw - s.pw >= s.W);
}
double global_divisor(AvgKind kind, const PoolShape& s) {
  return kind == AvgKind::adaptive ? static_cast<double>(s.H * s.W) : static_cast<double>(s.kh * s.kw);
}
bool nchw_dense(const PoolShape& s, PoolStrides xs) {
  return (s.W == 1 || xs.w == 1) && (s.H == 1 || xs.h == s.W) && (s.C == 1 || xs.c == s.H * s.W) &&
         (s.N == 1 || xs.n == s.C * s.H * s.W);
}

// Planes per block of global_avg_fwd_nchw: the most of 128, 64, 32 whose planes fit in 48 KiB of shared
// memory; 0 when even 32 do not (the generic kernel then reads x directly).
int global_block(int64_t hw, std::size_t elem) {
  for (int p : {128, 64, 32})
    if (static_cast<int64_t>(p) * hw * static_cast<int64_t>(elem) <= 48 * 1024) return p;
  return 0;
}

template <class T>
bool launch_global_avg_fwd(AvgKind kind, const T* x, PoolStrides xs, const PoolShape& s, T* out, cudaStream_t stream) {
  if (!global_window(kind, s)) return false;
  const double divisor = global_divisor(kind, s);
  const int64_t hw = s.H * s.W;
  if (s.layout == PoolLayout::nhwc) {
    constexpr int64_t kStage = 48 * 1024;  // bytes of shared memory a block stages at most
    const int E = static_cast<int>(std::min<int64_t>(hw, kStage / (cuda::kBlock * static_cast<int64_t>(sizeof(T)))));
    const std::size_t smem = static_cast<std::size_t>(E) * cuda::kBlock * sizeof(T);
    const dim3 grid(static_cast<unsigned>((s.C + cuda::kBlock - 1) / cuda::kBlock),
                    static_cast<unsigned>(std::min<int64_t>(s.N, 65535)));
    if (vec_ok<T>(s.C, {x}))
      global_avg_fwd_nhwc<T, kVec<T>><<<grid, cuda::kBlock, smem, stream>>>(x, s.N, s.C, hw, E, divisor, out);
    else
      global_avg_fwd_nhwc<T, 1><<<grid, cuda::kBlock, smem, stream>>>(x, s.N, s.C, hw, E, divisor, out);
    return true;
  }
  const int P = global_block(hw, sizeof(T));
  if (!nchw_dense(s, xs) || P == 0) return false;
  const int64_t planes = s.N * s.C;
  const std::size_t smem = static_cast<std::size_t>(P) * static_cast<std::size_t>(hw) * sizeof(T);
  const unsigned blocks = static_cast<unsigned>((planes + P - 1) / P);
  global_avg_fwd_nchw<T><<<blocks, P, smem, stream>>>(x, planes, static_cast<int>(hw), divisor, out);
  return true;
}

template <class T>
bool launch_global_avg_bwd(AvgKind kind, const T* g, const PoolShape& s, T* gx, cudaStream_t stream) {
  if (!global_window(kind, s)) return false;
  const double divisor = global_divisor(kind, s);
  const int64_t hw = s.H * s.W, total = s.N * s.C * hw;
  if (s.layout == PoolLayout::nhwc) {
    const bool vec = vec_ok<T>(s.C, {g, gx});
    const int V = vec ? kVec<T> : 1;
    const int64_t per = hw * (s.C / V);  // packs of one sample
    const dim3 grid(cuda::grid_for(per), static_cast<unsigned>(std::min<int64_t>(s.N, 65535)));
    constexpr int64_t kLimit = (int64_t{1} << 31) - (int64_t{1} << 24);  // grid-stride overshoot margin
    with_index(per <= kLimit, [&](auto itag) {
      using I = decltype(itag);
      const IndexDiv<I> by_CV(s.C / V);
      if (vec)
        global_avg_bwd_nhwc<T, kVec<T>, I><<<grid, cuda::kBlock, 0, stream>>>(g, s.N, s.C, static_cast<I>(per), by_CV,
                                                                              divisor, gx);
      else
        global_avg_bwd_nhwc<T, 1, I><<<grid, cuda::kBlock, 0, stream>>>(g, s.N, s.C, static_cast<I>(per), by_CV,
                                                                        divisor, gx);
    });
    return true;
  }
  const bool vec = total % kVec<T> == 0 && aligned_to(gx, 16);
  with_index(fits_i32(s, PoolStrides{}), [&](auto itag) {
    using I = decltype(itag);
    const IndexDiv<I> by_hw(hw);
    if (vec)
      global_avg_bwd_nchw<T, kVec<T>, I><<<cuda::grid_for(total / kVec<T>), cuda::kBlock, 0, stream>>>(
          g, static_cast<I>(total), by_hw, divisor, gx);
    else
      global_avg_bwd_nchw<T, 1, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(g, static_cast<I>(total), by_hw,
                                                                                      divisor, gx);
  });
  return true;
}

}  // namespace

void launch_max_pool2d(DType dt, const void* x, PoolStrides xs, const PoolShape& s, void* out, int32_t* indices,
                       cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  if (total == 0) return;
  const bool i32 = fits_i32(s, xs);
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x);
        T* po = static_cast<T*>(out);
        if (s.layout == PoolLayout::nhwc && i32 && vec_ok<T>(s.C, {x, out, indices})) {
          constexpr int V = kVec<T>;
          max_fwd_nhwc<T, V, int32_t><<<cuda::grid_for(total / V), cuda::kBlock, 0, stream>>>(
              px, make_geo<int32_t>(s, xs, V), po, indices);
          return;
        }
        with_index(i32, [&](auto itag) {
          using I = decltype(itag);
          const Geo<I> g = make_geo<I>(s, xs, 1);
          if (s.layout == PoolLayout::nhwc)
            max_fwd_nhwc<T, 1, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(px, g, po, indices);
          else
            max_fwd_nchw<T, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(px, g, po, indices);
        });
      }))
    HT_UNSUPPORTED_DTYPE("max_pool2d", dt);
  HT_CHECK_LAUNCH("max_pool2d");
}

void launch_max_pool2d_backward(DType dt, const void* grad_out, const int32_t* indices, const PoolShape& s, void* gx,
                                cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  const bool i32 = fits_i32(s, PoolStrides{});
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* pg = static_cast<const T*>(grad_out);
        T* px = static_cast<T*>(gx);
        if (s.layout == PoolLayout::nhwc && i32 && vec_ok<T>(s.C, {grad_out, indices, gx})) {
          constexpr int V = kVec<T>;
          max_bwd_nhwc<T, V, int32_t><<<cuda::grid_for(total / V), cuda::kBlock, 0, stream>>>(
              pg, indices, make_geo<int32_t>(s, PoolStrides{}, V), px);
          return;
        }
        with_index(i32, [&](auto itag) {
          using I = decltype(itag);
          const Geo<I> g = make_geo<I>(s, PoolStrides{}, 1);
          if (s.layout == PoolLayout::nhwc)
            max_bwd_nhwc<T, 1, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(pg, indices, g, px);
          else
            max_bwd_nchw<T, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(pg, indices, g, px);
        });
      }))
    HT_UNSUPPORTED_DTYPE("max_pool2d backward", dt);
  HT_CHECK_LAUNCH("max_pool2d backward");
}

void launch_avg_pool2d(DType dt, AvgKind kind, const void* x, PoolStrides xs, const PoolShape& s, void* out,
                       cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  if (total == 0) return;
  const bool i32 = fits_i32(s, xs);
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x);
        T* po = static_cast<T*>(out);
        if (launch_global_avg_fwd<T>(kind, px, xs, s, po, stream)) return;
        if (s.layout == PoolLayout::nhwc && i32 && vec_ok<T>(s.C, {x, out})) {
          constexpr int V = kVec<T>;
          avg_fwd_nhwc<T, V, int32_t><<<cuda::grid_for(total / V), cuda::kBlock, 0, stream>>>(
              px, make_geo<int32_t>(s, xs, V), kind, po);
          return;
        }
        with_index(i32, [&](auto itag) {
          using I = decltype(itag);
          const Geo<I> g = make_geo<I>(s, xs, 1);
          if (s.layout == PoolLayout::nhwc)
            avg_fwd_nhwc<T, 1, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(px, g, kind, po);
          else
            avg_fwd_nchw<T, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(px, g, kind, po);
        });
      }))
    HT_UNSUPPORTED_DTYPE("avg_pool2d", dt);
  HT_CHECK_LAUNCH("avg_pool2d");
}

void launch_avg_pool2d_backward(DType dt, AvgKind kind, const void* grad_out, const PoolShape& s, void* gx,
                                cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  const bool i32 = fits_i32(s, PoolStrides{});
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* pg = static_cast<const T*>(grad_out);
        T* px = static_cast<T*>(gx);
        if (launch_global_avg_bwd<T>(kind, pg, s, px, stream)) return;
        if (s.layout == PoolLayout::nhwc && i32 && vec_ok<T>(s.C, {grad_out, gx})) {
          constexpr int V = kVec<T>;
          avg_bwd_nhwc<T, V, int32_t><<<cuda::grid_for(total / V), cuda::kBlock, 0, stream>>>(
              pg, make_geo<int32_t>(s, PoolStrides{}, V), kind, px);
          return;
        }
        with_index(i32, [&](auto itag) {
          using I = decltype(itag);
          const Geo<I> g = make_geo<I>(s, PoolStrides{}, 1);
          if (s.layout == PoolLayout::nhwc)
            avg_bwd_nhwc<T, 1, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(pg, g, kind, px);
          else
            avg_bwd_nchw<T, I><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(pg, g, kind, px);
        });
      }))
    HT_UNSUPPORTED_DTYPE("avg_pool2d backward", dt);
  HT_CHECK_LAUNCH("avg_pool2d backward");
}

}  // namespace ht::kernels
