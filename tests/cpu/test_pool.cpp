// Pooling: max_pool2d, avg_pool2d and adaptive_avg_pool2d against naive references (odd sizes, padding,
// non-divisible adaptive bins, non-contiguous inputs), gradient routing and gradchecks, errors, f32 vs f64,
// the channels-last layout contract and the i32 argmax limit.
#include <cmath>
#include <functional>
#include <limits>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

namespace {

struct Geom {
  int64_t N, C, H, W;
};

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }

// Reads x (N, C, H, W) at (n, c, h, w) from a row-major vector; -inf outside the real input (padding).
double at_padded(const std::vector<double>& x, const Geom& g, int64_t n, int64_t c, int64_t h, int64_t w) {
  if (h < 0 || h >= g.H || w < 0 || w >= g.W) return -std::numeric_limits<double>::infinity();
  return x[static_cast<std::size_t>(((n * g.C + c) * g.H + h) * g.W + w)];
}

struct MaxRef {
  std::vector<double> out;
  std::vector<int64_t> argmax;  // h * W + w, first maximal element in row-major window order
};

MaxRef ref_max_pool(const std::vector<double>& x, const Geom& g, const Pool2dParams& p) {
  MaxRef r;
  const int64_t OH = out_size(g.H, p.kernel_h, p.stride_h, p.pad_h), OW = out_size(g.W, p.kernel_w, p.stride_w, p.pad_w);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t best_i = -1;
          for (int64_t i = 0; i < p.kernel_h; ++i)
            for (int64_t j = 0; j < p.kernel_w; ++j) {
              const int64_t h = oh * p.stride_h - p.pad_h + i, w = ow * p.stride_w - p.pad_w + j;
              const double v = at_padded(x, g, n, c, h, w);
              if (v > best) {
                best = v;
                best_i = h * g.W + w;
              }
            }
          r.out.push_back(best);
          r.argmax.push_back(best_i);
        }
  return r;
}

// Average over the full kernel window; padded positions count as zeros in the divisor kh * kw.
std::vector<double> ref_avg_pool(const std::vector<double>& x, const Geom& g, const Pool2dParams& p) {
  std::vector<double> out;
  const int64_t OH = out_size(g.H, p.kernel_h, p.stride_h, p.pad_h), OW = out_size(g.W, p.kernel_w, p.stride_w, p.pad_w);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = 0;
          for (int64_t i = 0; i < p.kernel_h; ++i)
            for (int64_t j = 0; j < p.kernel_w; ++j) {
              const double v = at_padded(x, g, n, c, oh * p.stride_h - p.pad_h + i, ow * p.stride_w - p.pad_w + j);
              if (std::isfinite(v)) s += v;
            }
          out.push_back(s / static_cast<double>(p.kernel_h * p.kernel_w));
        }
  return out;
}

// PyTorch's adaptive bins, computed with floating floor / ceil.
std::vector<double> ref_adaptive_avg(const std::vector<double>& x, const Geom& g, int64_t OH, int64_t OW) {
  std::vector<double> out;
  auto lo = [](int64_t i, int64_t in, int64_t o) { return static_cast<int64_t>(std::floor(double(i) * in / o)); };
  auto hi = [](int64_t i, int64_t in, int64_t o) { return static_cast<int64_t>(std::ceil(double(i + 1) * in / o)); };
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = 0;
          int64_t cnt = 0;
          for (int64_t h = lo(oh, g.H, OH); h < hi(oh, g.H, OH); ++h)
            for (int64_t w = lo(ow, g.W, OW); w < hi(ow, g.W, OW); ++w) {
              s += at_padded(x, g, n, c, h, w);
              ++cnt;
            }
          out.push_back(s / static_cast<double>(cnt));
        }
  return out;
}

Pool2dParams params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return Pool2dParams{kh, kw, sh, sw, ph, pw};
}

const Pool2dParams k3s2p1 = params(3, 3, 2, 2, 1, 1);
const Pool2dParams asym = params(3, 2, 2, 1, 1, 1);  // kernel (3, 2), stride (2, 1), pad (1, 1)

}  // namespace

TEST_CASE("max_pool2d matches a naive reference with padding and odd sizes", "[pool]") {
  const Geom g{2, 3, 7, 5};
  Tensor x = test::random_tensor({g.N, g.C, g.H, g.W}, 11);
  for (const Pool2dParams& p : {k3s2p1, asym, params(2, 2, 2, 2, 0, 0), params(3, 3, 1, 1, 0, 0)}) {
    const MaxRef r = ref_max_pool(x.to_vector<double>(), g, p);
    Tensor y = max_pool2d(x, p);
    CHECK(y.shape() == Shape{g.N, g.C, out_size(g.H, p.kernel_h, p.stride_h, p.pad_h),
                             out_size(g.W, p.kernel_w, p.stride_w, p.pad_w)});
    CHECK(test::compare(y, r.out, 0, 0) == "");  // max is exact
  }
  // k3 s2 p1 on 7x5 gives 4x3.
  CHECK(max_pool2d(x, k3s2p1).shape() == Shape{2, 3, 4, 3});
}

TEST_CASE("max_pool2d never selects padding, even for all-negative inputs", "[pool]") {
  const Geom g{1, 2, 5, 4};
  Tensor x = test::random_tensor({g.N, g.C, g.H, g.W}, 12, DType::f64, -9.0, -5.0);
  Tensor y = max_pool2d(x, k3s2p1);
  for (double v : y.to_vector<double>()) CHECK(v < -5.0);  // a zero (or -inf) pad would show up here
  CHECK(test::compare(y, ref_max_pool(x.to_vector<double>(), g, k3s2p1).out, 0, 0) == "");
}

TEST_CASE("max_pool2d backward routes each gradient to its window's argmax", "[pool][autograd]") {
  const Geom g{2, 2, 7, 5};
  Tensor x = test::random_tensor({g.N, g.C, g.H, g.W}, 13).set_requires_grad(true);
  Tensor y = max_pool2d(x, k3s2p1);  // overlapping windows: one element may win several
  Tensor gy = test::random_tensor(y.shape(), 14);
  const Tensor gx = grad({y}, {x}, {gy})[0];
  const MaxRef r = ref_max_pool(x.to_vector<double>(), g, k3s2p1);
  std::vector<double> expected(static_cast<std::size_t>(x.numel()), 0.0);
  const auto gv = gy.to_vector<double>();
  const int64_t per_plane = y.size(2) * y.size(3);
  for (std::size_t o = 0; o < gv.size(); ++o) {
    const int64_t plane = static_cast<int64_t>(o) / per_plane;
    expected[static_cast<std::size_t>(plane * g.H * g.W + r.argmax[o])] += gv[o];
  }
  CHECK(test::compare(gx, expected, 1e-15, 0) == "");
}

TEST_CASE("max_pool2d gives tied windows' gradient to the first maximal element", "[pool][autograd]") {
  // All equal: each 2x2 window's gradient goes to its top-left element.
  Tensor x = ones({1, 1, 4, 4}, {DType::f64}).set_requires_grad(true);
  max_pool2d(x, params(2, 2, 2, 2, 0, 0)).backward(ones({1, 1, 2, 2}, {DType::f64}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0});
  // With padding the first *real* element of each window wins: k3 s2 p1 on 3x3 -> windows start at
  // rows/cols -1 and 1, so the winners are (0,0), (0,1), (1,0), (1,1).
  Tensor z = zeros({1, 1, 3, 3}, {DType::f64}).set_requires_grad(true);
  Tensor y = max_pool2d(z, k3s2p1);
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  y.backward(ones({1, 1, 2, 2}, {DType::f64}));
  CHECK(z.grad().to_vector<double>() == std::vector<double>{1, 1, 0, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("avg_pool2d counts padding in the divisor and matches a naive reference", "[pool]") {
  const Geom g{2, 3, 7, 5};
  Tensor x = test::random_tensor({g.N, g.C, g.H, g.W}, 15);
  for (const Pool2dParams& p : {k3s2p1, asym, params(2, 2, 2, 2, 0, 0), params(3, 1, 3, 1, 1, 0)}) {
    CHECK(test::compare(avg_pool2d(x, p), ref_avg_pool(x.to_vector<double>(), g, p), 1e-14, 1e-15) == "");
  }
  // Corner window of k3 s2 p1 on ones covers 4 real elements of 9: 4/9.
  const auto y = avg_pool2d(ones({1, 1, 7, 5}, {DType::f64}), k3s2p1).to_vector<double>();
  CHECK(y[0] == Approx(4.0 / 9.0));
  CHECK(y[4] == Approx(1.0));  // (1, 1) is an interior window
}

TEST_CASE("adaptive_avg_pool2d uses floor/ceil bins for sizes that do not divide", "[pool]") {
  const Geom g{2, 3, 7, 5};
  Tensor x = test::random_tensor({g.N, g.C, g.H, g.W}, 16);
  const std::vector<std::pair<int64_t, int64_t>> sizes{{3, 2}, {1, 1}, {7, 5}, {4, 3}, {9, 8}};
  for (auto [oh, ow] : sizes) {
    Tensor y = adaptive_avg_pool2d(x, oh, ow);
    CHECK(y.shape() == Shape{g.N, g.C, oh, ow});
    CHECK(test::compare(y, ref_adaptive_avg(x.to_vector<double>(), g, oh, ow), 1e-14, 1e-15) == "");
  }
  // 7 -> 3 bins are rows [0,3), [2,5), [4,7) (overlapping): means of the ramp 0..6 are 1, 3, 5.
  Tensor ramp = arange(7, {DType::f64}).reshape({1, 1, 7, 1});
  CHECK(adaptive_avg_pool2d(ramp, 3, 1).to_vector<double>() == std::vector<double>{1.0, 3.0, 5.0});
  // Identity size is the identity; 1x1 is the global mean.
  CHECK(test::compare(adaptive_avg_pool2d(x, 7, 5), x, 0, 0) == "");
  CHECK(test::compare(adaptive_avg_pool2d(x, 1, 1), mean(x, {2, 3}, KeepDim::yes), 1e-14, 1e-15) == "");
}

TEST_CASE("pools read non-contiguous inputs through their strides", "[pool]") {
  const Geom g{2, 3, 7, 5};
  Tensor nhwc = test::random_tensor({g.N, g.H, g.W, g.C}, 17);
  Tensor x = nhwc.permute({0, 3, 1, 2});  // (N, C, H, W) view, channels last in memory
  REQUIRE_FALSE(x.is_contiguous());
  Tensor xc = x.contiguous();
  CHECK(test::compare(max_pool2d(x, k3s2p1), max_pool2d(xc, k3s2p1), 0, 0) == "");
  CHECK(test::compare(avg_pool2d(x, asym), avg_pool2d(xc, asym), 0, 0) == "");
  CHECK(test::compare(adaptive_avg_pool2d(x, 3, 2), adaptive_avg_pool2d(xc, 3, 2), 0, 0) == "");
  // A narrowed view with a storage offset.
  Tensor wide = test::random_tensor({2, 3, 7, 9}, 18);
  Tensor s = wide.narrow(3, 2, 5);
  CHECK(test::compare(max_pool2d(s, asym), ref_max_pool(s.contiguous().to_vector<double>(), g, asym).out, 0, 0) == "");
  CHECK(test::compare(avg_pool2d(s, k3s2p1), ref_avg_pool(s.contiguous().to_vector<double>(), g, k3s2p1), 1e-14,
                      1e-15) == "");
}

TEST_CASE("pool gradients pass the finite-difference check", "[pool][gradcheck]") {
  // Random values are distinct, so no max-pool window has a tie (or a near tie within eps).
  Tensor x = test::random_tensor({2, 2, 7, 5}, 19).set_requires_grad(true);
  auto check = [&](test::GradcheckFn f, const Tensor& in) { CHECK(test::gradcheck(f, {in}) == ""); };
  check([](const std::vector<Tensor>& in) { return max_pool2d(in[0], k3s2p1); }, x);
  check([](const std::vector<Tensor>& in) { return max_pool2d(in[0], asym); }, x);
  check([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], k3s2p1); }, x);
  check([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], asym); }, x);
  check([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 3, 2); }, x);
  check([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 9, 4); }, x);
  // Through a non-contiguous view: x stored (N, H, W, C).
  Tensor nhwc = test::random_tensor({2, 7, 5, 3}, 20).set_requires_grad(true);
  check([](const std::vector<Tensor>& in) { return max_pool2d(in[0].permute({0, 3, 1, 2}), k3s2p1); }, nhwc);
  check([](const std::vector<Tensor>& in) { return avg_pool2d(in[0].permute({0, 3, 1, 2}), asym); }, nhwc);
  check([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0].permute({0, 3, 1, 2}), 3, 3); }, nhwc);
}

TEST_CASE("pools reject bad shapes, parameters and dtypes with clear messages", "[pool][errors]") {
  Tensor x = test::random_tensor({2, 3, 7, 5}, 21);
  CHECK_THROWS_WITH(max_pool2d(test::random_tensor({3, 7, 5}, 1), k3s2p1), HasSubstr("expected x of shape (N, C, H, W)"));
  CHECK_THROWS_WITH(avg_pool2d(x, params(3, 3, 2, 2, 2, 1)), HasSubstr("pad_h must be between 0 and kernel_h/2 = 1, got 2"));
  CHECK_THROWS_WITH(max_pool2d(x, params(2, 2, 1, 1, 0, -1)), HasSubstr("pad_w must be between 0"));
  CHECK_THROWS_WITH(max_pool2d(x, params(0, 2, 1, 1, 0, 0)), HasSubstr("kernel_h must be positive"));
  CHECK_THROWS_WITH(avg_pool2d(x, params(2, 2, 1, 0, 0, 0)), HasSubstr("stride_w must be positive"));
  CHECK_THROWS_WITH(max_pool2d(x, params(3, 7, 1, 1, 0, 0)), HasSubstr("smaller than kernel_w = 7"));
  CHECK_THROWS_WITH(max_pool2d(x.to(DType::i32), k3s2p1), HasSubstr("expected a floating"));
  CHECK_THROWS_WITH(adaptive_avg_pool2d(x, 0, 2), HasSubstr("output size must be positive"));
  CHECK_THROWS_WITH(adaptive_avg_pool2d(test::random_tensor({7, 5}, 1), 2, 2), HasSubstr("(N, C, H, W)"));
}

TEST_CASE("f32 pools agree with f64 within f32 tolerance", "[pool][dtype]") {
  Tensor x = test::random_tensor({2, 3, 9, 7}, 22);
  Tensor xf = x.to(DType::f32);
  CHECK(max_pool2d(xf, k3s2p1).dtype() == DType::f32);
  CHECK(test::compare(max_pool2d(xf, k3s2p1), max_pool2d(x, k3s2p1), 1e-6, 1e-7) == "");
  CHECK(test::compare(avg_pool2d(xf, asym), avg_pool2d(x, asym), 1e-6, 1e-7) == "");
  CHECK(test::compare(adaptive_avg_pool2d(xf, 4, 3), adaptive_avg_pool2d(x, 4, 3), 1e-6, 1e-7) == "");
  // Gradients in f32 too.
  Tensor a = x.clone().set_requires_grad(true), b = xf.clone().set_requires_grad(true);
  sum(mul(avg_pool2d(a, k3s2p1), 3.0)).backward();
  sum(mul(avg_pool2d(b, k3s2p1), 3.0)).backward();
  CHECK(b.grad().dtype() == DType::f32);
  CHECK(test::compare(b.grad(), a.grad(), 1e-6, 1e-7) == "");
  // bf16 max pool is exact (it selects an element).
  Tensor xb = x.to(DType::bf16);
  CHECK(test::compare(max_pool2d(xb, asym), max_pool2d(xb.to(DType::f64), asym), 0, 0) == "");
}

TEST_CASE("pools keep a channels-last input's layout in the output and the gradient", "[pool][layout]") {
  // Note [Pool layouts]: an (N, H, W, C) buffer viewed as (N, C, H, W) gets (N, OH, OW, C) outputs and an
  // (N, H, W, C) gradient; values are those of the contiguous input.
  Tensor nhwc = test::random_tensor({2, 7, 5, 3}, 23);
  Tensor x = nhwc.permute({0, 3, 1, 2}).detach().set_requires_grad(true);
  Tensor xc = x.contiguous().detach().set_requires_grad(true);
  auto channels_last = [](const Tensor& t) { return !t.is_contiguous() && t.permute({0, 2, 3, 1}).is_contiguous(); };
  const std::vector<std::function<Tensor(const Tensor&)>> pools = {
      [](const Tensor& t) { return max_pool2d(t, k3s2p1); }, [](const Tensor& t) { return avg_pool2d(t, asym); },
      [](const Tensor& t) { return adaptive_avg_pool2d(t, 3, 2); }};
  for (std::size_t i = 0; i < pools.size(); ++i) {
    INFO("pool " << i);
    const Tensor y = pools[i](x), yc = pools[i](xc);
    CHECK(channels_last(y));
    CHECK(yc.is_contiguous());
    CHECK(test::compare(y, yc, 0, 0) == "");
    const Tensor gy = test::random_tensor(y.shape(), 24 + i);
    const Tensor gx = grad({y}, {x}, {gy})[0], gxc = grad({yc}, {xc}, {gy})[0];
    CHECK(channels_last(gx));
    CHECK(gxc.is_contiguous());
    CHECK(test::compare(gx, gxc, 0, 0) == "");
    // a channels-last grad_out gives the same gradient
    const Tensor gx2 = grad({pools[i](x)}, {x}, {gy.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2})})[0];
    CHECK(test::compare(gx2, gxc, 0, 0) == "");
  }
  // Other strides give contiguous NCHW results.
  Tensor other = test::random_tensor({2, 7, 3, 5}, 25).permute({0, 2, 1, 3});
  CHECK(max_pool2d(other, k3s2p1).is_contiguous());
  CHECK(adaptive_avg_pool2d(other, 1, 1).is_contiguous());
}

TEST_CASE("max_pool2d rejects a plane too large for its i32 argmax indices", "[pool][errors]") {
  // An expanded (stride 0) view: no memory behind the 2^31 elements; the check comes before any allocation.
  const Tensor x = ones({1, 1, 1, 1}).expand({1, 1, 65536, 32768});
  CHECK_THROWS_WITH(max_pool2d(x, params(1, 1, 1, 1, 0, 0)),
                    HasSubstr("max_pool2d: plane H x W = 65536 x 32768 = 2147483648 exceeds the i32 argmax"));
}
