// Internals shared by the 2-D pooling kernels (the interface is pool.cuh): cuda/kernels/pool.cu holds the max pool
// kernels and launchers, cuda/kernels/pool_avg.cu the fixed-window, adaptive and global average pools. The formulas
// are the CPU reference's (src/ops/pool.cpp), read side by side: windows clipped to the unpadded input, sums in
// double in the CPU's order, so forward and backward results are bit-identical to the CPU. Backward is a
// gather (one thread per input element, or pixel and channel group, over the outputs whose windows can hold
// it, ascending oh then ow as the CPU adds them): deterministic, no atomics.
//
// Index type I: int32_t (divisions by FastDiv, a multiply-high and a shift) when every index and offset of
// the pool is below 2^31 minus a margin for the grid-stride step, else int64_t with plain division.
// NHWC kernels give each thread a pixel and V consecutive channels (V = 16 bytes of T when C % V == 0 and
// every buffer is 16-byte aligned, else 1): consecutive threads read consecutive channels, coalesced.
// This header: the index division and the pool as the kernels read it (Geo), where a thread's item lies
// (nchw_item, nhwc_item), pack loads and stores, windows and their ranges, and the dispatch helpers (vec_ok,
// with_index, launch_windowed). Included by .cu files only.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/pool.cuh"

namespace ht::kernels::pl {

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
inline bool fits_i32(const PoolShape& s, PoolStrides xs) {
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

// Where item i of a grid-stride loop lies, on the output pixels (OH, OW: forward kernels) or the input pixels
// (H, W: backward kernels). NCHW kernels: element i of a dense (N, C, rows, cols) tensor, plane = n * C + c.
// NHWC kernels: channels [c, c + V) of pixel q = (n * rows + y) * cols + x.
template <class I>
struct PixelGrid {  // refers to the fields of the Geo it came from
  const I& rows;
  const I& cols;
  const IndexDiv<I>& by_rows;
  const IndexDiv<I>& by_cols;
};
template <class I>
HT_DEV PixelGrid<I> out_pixels(const Geo<I>& g) {
  return {g.OH, g.OW, g.by_OH, g.by_OW};
}
template <class I>
HT_DEV PixelGrid<I> in_pixels(const Geo<I>& g) {
  return {g.H, g.W, g.by_H, g.by_W};
}
template <class I>
struct NchwItem {
  I plane, y, x;
};
template <class I>
HT_DEV NchwItem<I> nchw_item(const PixelGrid<I>& p, I i) {
  const I q = p.by_cols(i), x = i - q * p.cols;
  const I plane = p.by_rows(q), y = q - plane * p.rows;
  return {plane, y, x};
}
template <class I>
struct NhwcItem {
  I q, c, n, y, x;
};
template <int V, class I>
HT_DEV NhwcItem<I> nhwc_item(const Geo<I>& g, const PixelGrid<I>& p, I i) {
  const I q = g.by_CV(i), c = (i - q * g.CV) * V;
  const I r = p.by_cols(q), x = q - r * p.cols;
  const I n = p.by_rows(r), y = r - n * p.rows;
  return {q, c, n, y, x};
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

// ---- dispatch helpers (host) ---------------------------------------------------------------------------

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

// Channels a thread of an NHWC kernel owns (1: the per-element kernels), as a type for launch_windowed's callable.
template <int V>
using Channels = std::integral_constant<int, V>;

// The kernel choice of the per-window pool launchers (max and average, forward and backward; `total` items:
// output or input elements; `buffers`: the pointers the NHWC groups load and store): for NHWC with 16-byte
// channel groups (vec_ok) and 32-bit indices, launch(Channels<kVec<T>>{}, geo, grid) with grid over
// total / kVec<T> items; else launch(Channels<1>{}, geo, grid) in the index type the pool fits (with_index),
// grid over `total`. The callable launches the NHWC kernel for PoolLayout::nhwc, else the NCHW one (never
// reached with V > 1).
template <class T, class F>
void launch_windowed(const PoolShape& s, PoolStrides xs, int64_t total, std::initializer_list<const void*> buffers,
                     F&& launch) {
  const bool i32 = fits_i32(s, xs);
  if (s.layout == PoolLayout::nhwc && i32 && vec_ok<T>(s.C, buffers)) {
    constexpr int V = kVec<T>;
    launch(Channels<V>{}, make_geo<int32_t>(s, xs, V), cuda::grid_for(total / V));
    return;
  }
  with_index(i32, [&](auto itag) {
    using I = decltype(itag);
    launch(Channels<1>{}, make_geo<I>(s, xs, 1), cuda::grid_for(total));
  });
}

}  // namespace ht::kernels::pl
