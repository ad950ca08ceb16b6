// 2-D max pooling kernels (with i32 argmax indices), forward and backward, for dense NCHW outputs (x read
// through its strides) and for channels-last (NHWC) buffers, and their launchers (pool.cuh). Max compares in
// float for bf16/f16/f32 (the widening is exact, so the order, the ties and the NaN test are those of the
// CPU's double compares) and in double for f64. Formulas, index types and the NHWC channel groups:
// pool_common.cuh; the average pools are in pool_avg.cu.
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/pool.cuh"
#include "cuda/kernels/pool_common.cuh"

namespace ht::kernels {
namespace {
using namespace pl;

// ---- max pool ----------------------------------------------------------------------------------------

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

// NCHW: one thread per output element; x through its strides; out and indices (N, C, OH, OW) dense.
template <class T, class I>
__global__ void __launch_bounds__(cuda::kBlock) max_fwd_nchw(const T* __restrict__ x, Geo<I> g, T* __restrict__ out,
                                                             int32_t* __restrict__ indices) {
  const I total = g.N * g.C * g.OH * g.OW;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const auto [plane, oh, ow] = nchw_item(out_pixels(g), i);
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
    const auto [q, c, n, oh, ow] = nhwc_item<V>(g, out_pixels(g), i);  // q: the output pixel (n * OH + oh) * OW + ow
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
    const auto [plane, h, w] = nchw_item(in_pixels(g), i);
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
    const auto [q, c, n, h, w] = nhwc_item<V>(g, in_pixels(g), i);  // q: the input pixel (n * H + h) * W + w
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

}  // namespace

void launch_max_pool2d(DType dt, const void* x, PoolStrides xs, const PoolShape& s, void* out, int32_t* indices,
                       cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x);
        T* po = static_cast<T*>(out);
        auto launch = [&]<int V, class I>(Channels<V>, const Geo<I>& g, unsigned grid) {
          if (s.layout == PoolLayout::nhwc)
            max_fwd_nhwc<T, V, I><<<grid, cuda::kBlock, 0, stream>>>(px, g, po, indices);
          else
            max_fwd_nchw<T, I><<<grid, cuda::kBlock, 0, stream>>>(px, g, po, indices);
        };
        launch_windowed<T>(s, xs, total, {x, out, indices}, launch);
      }))
    HT_UNSUPPORTED_DTYPE("max_pool2d", dt);
  HT_CHECK_LAUNCH("max_pool2d");
}

void launch_max_pool2d_backward(DType dt, const void* grad_out, const int32_t* indices, const PoolShape& s, void* gx,
                                cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* pg = static_cast<const T*>(grad_out);
        T* px = static_cast<T*>(gx);
        auto launch = [&]<int V, class I>(Channels<V>, const Geo<I>& g, unsigned grid) {
          if (s.layout == PoolLayout::nhwc)
            max_bwd_nhwc<T, V, I><<<grid, cuda::kBlock, 0, stream>>>(pg, indices, g, px);
          else
            max_bwd_nchw<T, I><<<grid, cuda::kBlock, 0, stream>>>(pg, indices, g, px);
        };
        launch_windowed<T>(s, PoolStrides{}, total, {grad_out, indices, gx}, launch);
      }))
    HT_UNSUPPORTED_DTYPE("max_pool2d backward", dt);
  HT_CHECK_LAUNCH("max_pool2d backward");
}

}  // namespace ht::kernels
