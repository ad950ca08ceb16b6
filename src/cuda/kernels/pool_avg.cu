// 2-D average pooling kernels, forward and backward: fixed windows (padding counted in the divisor kh*kw) and
// PyTorch's adaptive bins, for dense NCHW outputs (x read through its strides) and for channels-last (NHWC)
// buffers, and their launchers (pool.cuh). Formulas, index types and the NHWC channel groups: pool_common.cuh;
// the max pool is in pool.cu. The global average pool (one window = the whole plane, output 1x1: the ResNet
// head) has its own kernels: NCHW forward stages a block of planes in shared memory with 16-byte loads and
// lets each thread sum one plane sequentially; NHWC forward and backward give a thread V channels of one
// sample and walk the pixels.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/pool.cuh"
#include "cuda/kernels/pool_common.cuh"

namespace ht::kernels {
namespace {
using namespace pl;

// ---- average pools -------------------------------------------------------------------------------------

template <class T, class I>
__global__ void __launch_bounds__(cuda::kBlock) avg_fwd_nchw(const T* __restrict__ x, Geo<I> g, AvgKind kind,
                                                             T* __restrict__ out) {
  const I total = g.N * g.C * g.OH * g.OW;
  for (I i = thread_index<I>(); i < total; i += grid_step<I>()) {
    const auto [plane, oh, ow] = nchw_item(out_pixels(g), i);
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
    const auto [q, c, n, oh, ow] = nhwc_item<V>(g, out_pixels(g), i);
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
    const auto [plane, h, w] = nchw_item(in_pixels(g), i);
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
    const auto [q, c, n, h, w] = nhwc_item<V>(g, in_pixels(g), i);
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

void launch_avg_pool2d(DType dt, AvgKind kind, const void* x, PoolStrides xs, const PoolShape& s, void* out,
                       cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.OH * s.OW;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x);
        T* po = static_cast<T*>(out);
        if (launch_global_avg_fwd<T>(kind, px, xs, s, po, stream)) return;
        auto launch = [&]<int V, class I>(Channels<V>, const Geo<I>& g, unsigned grid) {
          if (s.layout == PoolLayout::nhwc)
            avg_fwd_nhwc<T, V, I><<<grid, cuda::kBlock, 0, stream>>>(px, g, kind, po);
          else
            avg_fwd_nchw<T, I><<<grid, cuda::kBlock, 0, stream>>>(px, g, kind, po);
        };
        launch_windowed<T>(s, xs, total, {x, out}, launch);
      }))
    HT_UNSUPPORTED_DTYPE("avg_pool2d", dt);
  HT_CHECK_LAUNCH("avg_pool2d");
}

void launch_avg_pool2d_backward(DType dt, AvgKind kind, const void* grad_out, const PoolShape& s, void* gx,
                                cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  if (!visit_kernel_float(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* pg = static_cast<const T*>(grad_out);
        T* px = static_cast<T*>(gx);
        if (launch_global_avg_bwd<T>(kind, pg, s, px, stream)) return;
        auto launch = [&]<int V, class I>(Channels<V>, const Geo<I>& g, unsigned grid) {
          if (s.layout == PoolLayout::nhwc)
            avg_bwd_nhwc<T, V, I><<<grid, cuda::kBlock, 0, stream>>>(pg, g, kind, px);
          else
            avg_bwd_nchw<T, I><<<grid, cuda::kBlock, 0, stream>>>(pg, g, kind, px);
        };
        launch_windowed<T>(s, PoolStrides{}, total, {grad_out, gx}, launch);
      }))
    HT_UNSUPPORTED_DTYPE("avg_pool2d backward", dt);
  HT_CHECK_LAUNCH("avg_pool2d backward");
}

}  // namespace ht::kernels
