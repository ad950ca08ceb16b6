// 2-D pooling over x (N, C, H, W): max_pool2d (saves the argmax of every window for backward), avg_pool2d
// (padding counts in the divisor, PyTorch's count_include_pad=True) and adaptive_avg_pool2d (PyTorch's bins
// start = floor(i*H/out), end = ceil((i+1)*H/out)). Output sizes use floor mode: (H + 2*pad - k) / stride + 1.
// CPU reference loops read x through its strides; backward scatters the gradient into the input plane.
// Max pool saves the argmax of every window as i32 h * W + w within its plane (so H * W < 2^31), and only
// when a backward will need it.
//
// Note [Pool layouts]
// A channels-last input (an (N, H, W, C)-contiguous buffer viewed as (N, C, H, W), as the channels-last
// ResNets call the pools) gets its output, saved indices and input gradient in the same layout (NHWC
// buffers returned as (N, C, H, W) views), so the network pays no transposes around a pool; any other
// input gets contiguous NCHW ones. The choice is the same on every device; the values never depend on it.
//
// Note [Pool windows are never empty]
// With 0 <= pad <= kernel/2 and floor-mode output sizes, every max/avg window holds at least one real
// (unpadded) element and never reaches past the padded border, so the avg divisor is always kh*kw and the
// max of a window always exists. Adaptive bins are non-empty whenever out >= 1 and the input is non-empty.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/conv_pool_bn_glue.h"
#endif

namespace ht {
namespace {

struct PoolGeom {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input (N, C, H, W)
  int64_t OH = 0, OW = 0;              // output (N, C, OH, OW)
  bool channels_last = false;          // x, and so out and grad_x, channels last (Note [Pool layouts])
};

// An uninitialised (N, C, h, w) tensor in the pool's layout: contiguous, or an (N, h, w, C) buffer viewed
// as (N, C, h, w) when channels_last.
Tensor pool_empty(const PoolGeom& g, int64_t h, int64_t w, DType dtype, Device device) {
  if (!g.channels_last) return empty({g.N, g.C, h, w}, {dtype, device});
  return permute(empty({g.N, h, w, g.C}, {dtype, device}), {0, 3, 1, 2});
}

// Element offset of (n, c, h, w) in a 4-d tensor of strides st.
int64_t offset4(const Strides& st, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * st[0] + c * st[1] + h * st[2] + w * st[3];
}

// Stores the (H, W) plane `plane` = n * C + c of the gradient gx (any layout) from row-major sums.
template <class T>
void write_plane(const Tensor& gx, const PoolGeom& g, int64_t plane, const std::vector<double>& acc) {
  T* px = cpu::ptr<T>(gx);
  const Strides& st = gx.strides();
  const int64_t n = plane / g.C, c = plane % g.C;
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t w = 0; w < g.W; ++w)
      px[offset4(st, n, c, h, w)] = cpu::convert<T>(acc[static_cast<std::size_t>(h * g.W + w)]);
}

void check_pool_input(const Tensor& x, const char* op) {
  HT_CHECK(x.dim() == 4, "{}: expected x of shape (N, C, H, W), got {}", op, x.describe());
  check_floating(op, {&x});
  HT_CHECK(x.size(2) > 0 && x.size(3) > 0, "{}: expected non-empty spatial dims, got {}", op, x.describe());
}

// Validates one axis of a kernel/stride/padding triple and returns the floor-mode output size.
int64_t pooled_size(const char* op, const char* axis, int64_t in, int64_t k, int64_t s, int64_t p) {
  HT_CHECK(k > 0, "{}: kernel_{} must be positive, got {}", op, axis, k);
  HT_CHECK(s > 0, "{}: stride_{} must be positive, got {}", op, axis, s);
  HT_CHECK(p >= 0 && p <= k / 2, "{}: pad_{} must be between 0 and kernel_{}/2 = {}, got {}", op, axis, axis,
           k / 2, p);
  HT_CHECK(in + 2 * p >= k,
           "{}: input size {} along {} plus padding 2*{} is smaller than kernel_{} = {}; the output would be empty",
           op, in, axis, p, axis, k);
  return (in + 2 * p - k) / s + 1;
}

PoolGeom pool_geom(const Tensor& x, const Pool2dParams& p, const char* op) {
  check_pool_input(x, op);
  PoolGeom g{x.size(0), x.size(1), x.size(2), x.size(3), 0, 0, is_channels_last(x)};
  g.OH = pooled_size(op, "h", g.H, p.kernel_h, p.stride_h, p.pad_h);
  g.OW = pooled_size(op, "w", g.W, p.kernel_w, p.stride_w, p.pad_w);
  return g;
}

#ifdef HADATRAIN_CUDA
// The kernels' view of a pool (cuda/kernels/pool.cuh); p is unused by adaptive pools.
kernels::PoolShape kernel_shape(const PoolGeom& g, const Pool2dParams& p) {
  kernels::PoolShape s;
  s.N = g.N;
  s.C = g.C;
  s.H = g.H;
  s.W = g.W;
  s.OH = g.OH;
  s.OW = g.OW;
  s.kh = static_cast<int>(p.kernel_h);
  s.kw = static_cast<int>(p.kernel_w);
  s.sh = static_cast<int>(p.stride_h);
  s.sw = static_cast<int>(p.stride_w);
  s.ph = static_cast<int>(p.pad_h);
  s.pw = static_cast<int>(p.pad_w);
  s.layout = g.channels_last ? kernels::PoolLayout::nhwc : kernels::PoolLayout::nchw;
  return s;
}
#endif

// The rows [h0, h1) x cols [w0, w1) of the unpadded input that output (oh, ow) averages, and the divisor.
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  double divisor;
};

// Window rule of an averaging pool: fixed kernel with padding counted in the divisor, or adaptive bins.
struct AvgWindows {
  enum class Kind { fixed, adaptive };
  Kind kind = Kind::fixed;
  Pool2dParams p{};
  PoolGeom g{};

  AvgWindow at(int64_t oh, int64_t ow) const {
    if (kind == Kind::adaptive) {
      // start = floor(i * in / out), end = ceil((i + 1) * in / out)
      const int64_t h0 = oh * g.H / g.OH, h1 = ((oh + 1) * g.H + g.OH - 1) / g.OH;
      const int64_t w0 = ow * g.W / g.OW, w1 = ((ow + 1) * g.W + g.OW - 1) / g.OW;
      return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
    }
    const int64_t hs = oh * p.stride_h - p.pad_h, ws = ow * p.stride_w - p.pad_w;
    return {std::max<int64_t>(hs, 0), std::min(hs + p.kernel_h, g.H), std::max<int64_t>(ws, 0),
            std::min(ws + p.kernel_w, g.W), static_cast<double>(p.kernel_h * p.kernel_w)};
  }
};

// ---------------------------------------------------------------------------------------------------
// Averaging pools

#ifdef HADATRAIN_CUDA
kernels::AvgKind avg_kind(const AvgWindows& win) {
  return win.kind == AvgWindows::Kind::adaptive ? kernels::AvgKind::adaptive : kernels::AvgKind::fixed;
}
#endif

// out (N, C, OH, OW) = mean of each window of x (N, C, H, W), accumulated in double.
Tensor avg_forward(const Tensor& x, const AvgWindows& win, const char* op) {
  const PoolGeom& g = win.g;
  Tensor out = pool_empty(g, g.OH, g.OW, x.dtype(), x.device());
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::avg_pool2d(avg_kind(win), x, kernel_shape(g, win.p), out);
    return out;
#else
    no_cuda_kernel(op);
#endif
  }
  visit_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(x);
    T* po = cpu::ptr<T>(out);
    const Strides& st = x.strides();
    const Strides& os = out.strides();
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t c = 0; c < g.C; ++c) {
        const T* plane = px + n * st[0] + c * st[1];
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const AvgWindow w = win.at(oh, ow);
            double acc = 0.0;
            for (int64_t h = w.h0; h < w.h1; ++h)
              for (int64_t v = w.w0; v < w.w1; ++v) acc += cpu::to_double(plane[h * st[2] + v * st[3]]);
            po[offset4(os, n, c, oh, ow)] = cpu::convert<T>(acc / w.divisor);
          }
      }
  });
  return out;
}

// grad_x (N, C, H, W): every output gradient spread evenly over its window.
Tensor avg_backward(const Tensor& grad_out, const AvgWindows& win, DType dtype, const char* op) {
  const PoolGeom& g = win.g;
  Tensor gx = pool_empty(g, g.H, g.W, dtype, grad_out.device());
  if (grad_out.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::avg_pool2d_backward(avg_kind(win), grad_out, kernel_shape(g, win.p), gx);
    return gx;
#else
    no_cuda_kernel(op);
#endif
  }
  const Tensor go = to_dtype(grad_out, dtype).contiguous();  // (N, C, OH, OW)
  visit_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = cpu::ptr<T>(go);
    std::vector<double> acc(static_cast<std::size_t>(g.H * g.W));
    for (int64_t plane = 0; plane < g.N * g.C; ++plane) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const AvgWindow w = win.at(oh, ow);
          const double share = cpu::to_double(*pg++) / w.divisor;
          for (int64_t h = w.h0; h < w.h1; ++h)
            for (int64_t v = w.w0; v < w.w1; ++v) acc[static_cast<std::size_t>(h * g.W + v)] += share;
        }
      write_plane<T>(gx, g, plane, acc);
    }
  });
  return gx;
}

Tensor avg_pool_op(const Tensor& x, const AvgWindows& win, const char* op, const char* backward_name) {
  Tensor out = avg_forward(x, win, op);
  if (needs_grad({&x})) {
    const DType dt = x.dtype();
    auto node = std::make_shared<FunctionNode>(backward_name, [win, dt, op](FunctionNode&, std::vector<Tensor>&& g) {
      return std::vector<Tensor>{avg_backward(g[0], win, dt, op)};
    });
    connect(node, {&x}, {&out});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Max pool

struct MaxPoolResult {
  Tensor out;      // (N, C, OH, OW), x's dtype
  Tensor indices;  // (N, C, OH, OW) i32: h * W + w of the selected element within its (H, W) plane; undefined
                   // when no backward needs it
};

// H * W < 2^31, so that the saved argmax h * W + w fits in i32.
void check_plane_fits_i32(const PoolGeom& g, const Tensor& x) {
  HT_CHECK(g.H * g.W <= int64_t{INT32_MAX},
           "max_pool2d: plane H x W = {} x {} = {} exceeds the i32 argmax indices' limit 2^31 - 1, for {}", g.H, g.W,
           g.H * g.W, x.describe());
}

MaxPoolResult max_forward(const Tensor& x, const Pool2dParams& p, const PoolGeom& g, bool with_indices) {
  MaxPoolResult r{pool_empty(g, g.OH, g.OW, x.dtype(), x.device()),
                  with_indices ? pool_empty(g, g.OH, g.OW, DType::i32, x.device()) : Tensor()};
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::max_pool2d(x, kernel_shape(g, p), r.out, r.indices);
    return r;
#else
    no_cuda_kernel("max_pool2d");
#endif
  }
  visit_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(x);
    T* po = cpu::ptr<T>(r.out);
    int32_t* pi = with_indices ? cpu::ptr<int32_t>(r.indices) : nullptr;
    const Strides& st = x.strides();
    const Strides& os = r.out.strides();
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t c = 0; c < g.C; ++c) {
        const T* plane = px + n * st[0] + c * st[1];
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            // Padding is -inf: only real elements are visited (Note [Pool windows are never empty]).
            const int64_t hs = oh * p.stride_h - p.pad_h, ws = ow * p.stride_w - p.pad_w;
            const int64_t h0 = std::max<int64_t>(hs, 0), h1 = std::min(hs + p.kernel_h, g.H);
            const int64_t w0 = std::max<int64_t>(ws, 0), w1 = std::min(ws + p.kernel_w, g.W);
            T best = plane[h0 * st[2] + w0 * st[3]];
            double best_v = cpu::to_double(best);
            int64_t best_i = h0 * g.W + w0;
            // First maximal element wins ties (strict >); a NaN propagates (the first NaN is selected).
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) {
                const T e = plane[h * st[2] + w * st[3]];
                const double v = cpu::to_double(e);
                if (v > best_v || (std::isnan(v) && !std::isnan(best_v))) {
                  best = e;
                  best_v = v;
                  best_i = h * g.W + w;
                }
              }
            const int64_t o = offset4(os, n, c, oh, ow);  // indices: out's layout, so the same strides
            po[o] = best;
            if (pi) pi[o] = static_cast<int32_t>(best_i);
          }
      }
  });
  return r;
}

// grad_x (N, C, H, W): each output gradient goes to the element its window selected (summed where windows
// overlap and select the same element).
Tensor max_backward(const Tensor& grad_out, const Tensor& indices, const PoolGeom& g, const Pool2dParams& p,
                    DType dtype) {
  Tensor gx = pool_empty(g, g.H, g.W, dtype, grad_out.device());
  if (grad_out.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::max_pool2d_backward(grad_out, indices, kernel_shape(g, p), gx);
    return gx;
#else
    (void)p;
    no_cuda_kernel("max_pool2d backward");
#endif
  }
  const Tensor go = to_dtype(grad_out, dtype).contiguous();  // (N, C, OH, OW)
  HT_ASSERT(indices.dtype() == DType::i32, "max_pool2d: bad saved indices {}", indices.describe());
  const Tensor ic = indices.contiguous();
  visit_floating(dtype, "max_pool2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = cpu::ptr<T>(go);
    const int32_t* pi = cpu::ptr<int32_t>(ic);
    std::vector<double> acc(static_cast<std::size_t>(g.H * g.W));
    for (int64_t plane = 0; plane < g.N * g.C; ++plane) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t o = 0; o < g.OH * g.OW; ++o) acc[static_cast<std::size_t>(*pi++)] += cpu::to_double(*pg++);
      write_plane<T>(gx, g, plane, acc);
    }
  });
  return gx;
}

class MaxPool2dBackward final : public Node {
 public:
  MaxPool2dBackward(PoolGeom g, const Pool2dParams& p, DType dtype) : g_(g), p_(p), dtype_(dtype) {}
  std::string name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!needs_input_grad(0) || !grads[0].defined()) return {Tensor{}};
    return {max_backward(grads[0], saved(indices_slot), g_, p_, dtype_)};
  }
  std::size_t indices_slot = 0;

 private:
  PoolGeom g_;
  Pool2dParams p_;  // the windows (the CUDA backward gathers over them)
  DType dtype_;
};

}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dParams& p) {
  const PoolGeom g = pool_geom(x, p, "max_pool2d");
  check_plane_fits_i32(g, x);
  const bool grad = needs_grad({&x});
  MaxPoolResult r = max_forward(x, p, g, grad);
  if (grad) {
    auto node = std::make_shared<MaxPool2dBackward>(g, p, x.dtype());
    node->indices_slot = node->save(r.indices);
    connect(node, {&x}, {&r.out});
  }
  return r.out;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  AvgWindows win{AvgWindows::Kind::fixed, p, pool_geom(x, p, "avg_pool2d")};
  return avg_pool_op(x, win, "avg_pool2d", "AvgPool2dBackward");
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  const char* op = "adaptive_avg_pool2d";
  check_pool_input(x, op);
  HT_CHECK(out_h > 0 && out_w > 0, "{}: output size must be positive, got ({}, {}) for {}", op, out_h, out_w,
           x.describe());
  AvgWindows win{AvgWindows::Kind::adaptive, Pool2dParams{},
                 {x.size(0), x.size(1), x.size(2), x.size(3), out_h, out_w, is_channels_last(x)}};
  return avg_pool_op(x, win, op, "AdaptiveAvgPool2dBackward");
}

}  // namespace ht
