// conv2d against a naive 7-loop direct convolution: stride, padding, dilation, groups, depthwise, odd
// sizes, a channels-last input viewed as NCHW, a batch split into several GEMM chunks; gradchecks for x,
// weight and bias; bf16 forward and backward against f64; conv2d_input_grad / conv2d_weight_grad against the
// autograd gradients; shape-validation errors.
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/node.h"

using namespace ht;

namespace {

struct ConvCase {
  int64_t N, C, H, W, O, KH, KW;
  Conv2dParams p;
};

int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t dil) { return (in + 2 * pad - dil * (k - 1) - 1) / s + 1; }

// out[n][o][oh][ow] = b[o] + sum over c, kh, kw of x[n][g·Cg + c][ih][iw] · w[o][c][kh][kw] with
// ih = oh·sh - ph + kh·dh, iw = ow·sw - pw + kw·dw (zero outside), g = o / (O / groups).
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, const ConvCase& cc) {
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const Conv2dParams& p = cc.p;
  const int64_t OH = out_dim(cc.H, cc.KH, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t OW = out_dim(cc.W, cc.KW, p.stride_w, p.pad_w, p.dilation_w);
  const int64_t Cg = cc.C / p.groups, Og = cc.O / p.groups;
  std::vector<double> out;
  for (int64_t n = 0; n < cc.N; ++n)
    for (int64_t o = 0; o < cc.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b.defined() ? bv[static_cast<std::size_t>(o)] : 0.0;
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < cc.KH; ++kh)
              for (int64_t kw = 0; kw < cc.KW; ++kw) {
                const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
                const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
                if (ih < 0 || ih >= cc.H || iw < 0 || iw >= cc.W) continue;
                s += xv[static_cast<std::size_t>(((n * cc.C + g * Cg + c) * cc.H + ih) * cc.W + iw)] *
                     wv[static_cast<std::size_t>(((o * Cg + c) * cc.KH + kh) * cc.KW + kw)];
              }
          out.push_back(s);
        }
  return out;
}

Conv2dParams params(int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dil;
  p.groups = groups;
  return p;
}

Tensor rand_t(const Shape& s, uint64_t seed, DType dt = DType::f64) { return test::random_tensor(s, seed, dt); }

}  // namespace

TEST_CASE("conv2d matches a naive direct convolution", "[conv2d]") {
  Conv2dParams asym;  // different settings per axis
  asym.stride_h = 2;
  asym.stride_w = 1;
  asym.pad_h = 0;
  asym.pad_w = 2;
  asym.dilation_h = 1;
  asym.dilation_w = 3;
  const std::vector<std::pair<const char*, ConvCase>> cases = {
      {"3x3 plain", {2, 3, 6, 5, 4, 3, 3, params(1, 0, 1, 1)}},
      {"stride 2, padding 1", {2, 3, 7, 9, 5, 3, 3, params(2, 1, 1, 1)}},
      {"dilation 2", {1, 2, 9, 8, 3, 3, 2, params(1, 1, 2, 1)}},
      {"groups 2", {2, 4, 7, 6, 6, 3, 3, params(1, 1, 1, 2)}},
      {"depthwise (groups = C), multiplier 2", {2, 3, 7, 7, 6, 3, 3, params(2, 1, 1, 3)}},
      {"1x1", {3, 5, 4, 3, 2, 1, 1, params(1, 0, 1, 1)}},
      {"odd everything", {1, 3, 11, 7, 5, 4, 3, params(3, 2, 2, 1)}},
      {"per-axis params", {2, 2, 9, 6, 2, 3, 2, asym}},
      {"kernel equals padded input", {1, 1, 3, 3, 1, 5, 5, params(1, 1, 1, 1)}},
  };
  for (const auto& [name, cc] : cases) {
    INFO(name);
    Tensor x = rand_t({cc.N, cc.C, cc.H, cc.W}, 1), w = rand_t({cc.O, cc.C / cc.p.groups, cc.KH, cc.KW}, 2);
    Tensor b = rand_t({cc.O}, 3);
    Tensor y = conv2d(x, w, b, cc.p);
    const Shape expect{cc.N, cc.O, out_dim(cc.H, cc.KH, cc.p.stride_h, cc.p.pad_h, cc.p.dilation_h),
                       out_dim(cc.W, cc.KW, cc.p.stride_w, cc.p.pad_w, cc.p.dilation_w)};
    REQUIRE(y.shape() == expect);
    CHECK(test::compare(y, naive_conv(x, w, b, cc), 1e-12, 1e-12) == "");
    CHECK(test::compare(conv2d(x, w, Tensor(), cc.p), naive_conv(x, w, Tensor(), cc), 1e-12, 1e-12) == "");
    Tensor yf = conv2d(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), cc.p);
    CHECK(test::compare(yf, naive_conv(x, w, b, cc), 1e-5, 1e-5) == "");
  }
}

TEST_CASE("conv2d reads non-contiguous inputs in place (channels-last viewed as NCHW)", "[conv2d]") {
  const ConvCase cc{2, 4, 7, 5, 6, 3, 3, params(2, 1, 1, 2)};
  Tensor nhwc = rand_t({cc.N, cc.H, cc.W, cc.C}, 4);
  Tensor x = nhwc.permute({0, 3, 1, 2});  // (N, C, H, W) view with strides (HWC, 1, WC, C)
  REQUIRE_FALSE(x.is_contiguous());
  Tensor w = rand_t({cc.O, cc.C / 2, cc.KH, cc.KW}, 5), b = rand_t({cc.O}, 6);
  CHECK(test::compare(conv2d(x, w, b, cc.p), naive_conv(x.contiguous(), w, b, cc), 1e-12, 1e-12) == "");
  // A transposed weight view and a spatially sliced input as well.
  Tensor wt = rand_t({cc.O, cc.C / 2, cc.KW, cc.KH}, 7).transpose(2, 3);
  Tensor xs = slice(rand_t({cc.N, cc.C, cc.H, 2 * cc.W}, 8), 3, 0, 2 * cc.W, 2);
  CHECK(test::compare(conv2d(xs, wt, b, cc.p), naive_conv(xs.contiguous(), wt.contiguous(), b, cc), 1e-12, 1e-12) ==
        "");
}

TEST_CASE("conv2d over several sample chunks matches per-sample convolutions", "[conv2d]") {
  // The CPU path runs chunks of samples as one GEMM, chunk size set by a ~4 M element buffer budget: with
  // C/groups·KH·KW = 288 rows and 48·48 outputs per sample, 7 samples split into chunks of 6 and 1.
  const ConvCase cc{7, 64, 48, 48, 4, 3, 3, params(1, 1, 1, 2)};
  Tensor x = rand_t({cc.N, cc.C, cc.H, cc.W}, 31).set_requires_grad(true);
  Tensor w = rand_t({cc.O, cc.C / 2, cc.KH, cc.KW}, 32).set_requires_grad(true);
  Tensor b = rand_t({cc.O}, 33).set_requires_grad(true);
  Tensor y = conv2d(x, w, b, cc.p);
  CHECK(test::compare(y, naive_conv(x.detach(), w.detach(), b.detach(), cc), 1e-12, 1e-12) == "");
  Tensor gy = rand_t(y.shape(), 34);
  auto g = grad({y}, {x, w, b}, {gy});
  std::vector<double> gw_sum(static_cast<std::size_t>(w.numel()), 0.0);
  for (int64_t n = 0; n < cc.N; ++n) {
    INFO("sample " << n);
    Tensor xn = slice(x.detach(), 0, n, n + 1, 1).contiguous().set_requires_grad(true);
    Tensor wn = w.detach().set_requires_grad(true);
    auto gn = grad({conv2d(xn, wn, b.detach(), cc.p)}, {xn, wn}, {slice(gy, 0, n, n + 1, 1).contiguous()});
    CHECK(test::compare(slice(g[0], 0, n, n + 1, 1), gn[0], 1e-12, 1e-12) == "");
    const std::vector<double> gwn = gn[1].to_vector<double>();
    for (std::size_t i = 0; i < gw_sum.size(); ++i) gw_sum[i] += gwn[i];
  }
  CHECK(test::compare(g[1], gw_sum, 1e-10, 1e-10) == "");
}

TEST_CASE("conv2d gradients pass the finite-difference check", "[conv2d][gradcheck]") {
  const std::vector<std::pair<const char*, ConvCase>> cases = {
      {"stride 2, padding 1", {2, 2, 5, 4, 3, 3, 2, params(2, 1, 1, 1)}},
      {"dilation 2, groups 2", {1, 4, 6, 5, 2, 2, 2, params(1, 1, 2, 2)}},
      {"depthwise", {2, 3, 4, 4, 3, 3, 3, params(1, 1, 1, 3)}},
  };
  auto conv = [](const Conv2dParams& p) {
    return [p](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], p); };
  };
  for (const auto& [name, cc] : cases) {
    INFO(name);
    Tensor x = rand_t({cc.N, cc.C, cc.H, cc.W}, 11).set_requires_grad(true);
    Tensor w = rand_t({cc.O, cc.C / cc.p.groups, cc.KH, cc.KW}, 12).set_requires_grad(true);
    Tensor b = rand_t({cc.O}, 13).set_requires_grad(true);
    CHECK(test::gradcheck(conv(cc.p), {x, w, b}) == "");
  }
  // Through a channels-last view of the input, and without bias.
  const Conv2dParams p = params(2, 1, 1, 2);
  Tensor xl = rand_t({2, 5, 4, 4}, 14).set_requires_grad(true);  // (N, H, W, C)
  Tensor w = rand_t({2, 2, 3, 3}, 15).set_requires_grad(true);
  CHECK(test::gradcheck([p](const std::vector<Tensor>& in) { return conv2d(in[0].permute({0, 3, 1, 2}), in[1], Tensor(), p); },
                        {xl, w}) == "");
  // Only one input needing a gradient works too.
  Tensor xc = rand_t({1, 2, 4, 4}, 16).set_requires_grad(true);
  Tensor wc = rand_t({3, 2, 2, 2}, 17);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], Tensor(), {}); }, {xc, wc}) ==
        "");
}

TEST_CASE("conv2d keeps x only for g_W and W only for g_x", "[conv2d][autograd]") {
  const ConvCase cc{2, 4, 6, 5, 6, 3, 3, params(2, 1, 1, 2)};
  const Tensor x0 = rand_t({cc.N, cc.C, cc.H, cc.W}, 31), w0 = rand_t({cc.O, cc.C / 2, cc.KH, cc.KW}, 32);
  const Tensor b0 = rand_t({cc.O}, 33);
  auto run = [&](bool x_grad, bool w_grad) {
    Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
    x.set_requires_grad(x_grad);
    w.set_requires_grad(w_grad);
    b.set_requires_grad(true);
    const Tensor y = conv2d(x, w, b, cc.p);
    const std::size_t kept = y.grad_fn()->saved_bytes();
    sum(mul(y, rand_t(y.shape(), 34))).backward();
    return std::tuple{x.grad(), w.grad(), b.grad(), kept};
  };
  const auto [gx, gw, gb, both] = run(true, true);
  CHECK(both == x0.nbytes() + w0.nbytes());
  const auto [gx_fw, gw_fw, gb_fw, kept_fw] = run(true, false);  // frozen weight: W only
  CHECK(kept_fw == w0.nbytes());
  CHECK(test::compare(gx_fw, gx, 0.0, 0.0) == "");
  CHECK(!gw_fw.defined());
  const auto [gx_fx, gw_fx, gb_fx, kept_fx] = run(false, true);  // an input without a gradient: x only
  CHECK(kept_fx == x0.nbytes());
  CHECK(test::compare(gw_fx, gw, 0.0, 0.0) == "");
  CHECK(!gx_fx.defined());
  const auto [gx_b, gw_b, gb_b, kept_b] = run(false, false);  // only the bias: nothing
  CHECK(kept_b == 0);
  CHECK(test::compare(gb_b, gb, 0.0, 0.0) == "");
}

TEST_CASE("bf16 conv2d forward and backward stay close to f64", "[conv2d][dtype]") {
  const ConvCase cc{2, 4, 6, 5, 4, 3, 3, params(1, 1, 1, 2)};
  Tensor x = rand_t({cc.N, cc.C, cc.H, cc.W}, 21, DType::bf16), w = rand_t({cc.O, 2, 3, 3}, 22, DType::bf16);
  Tensor b = rand_t({cc.O}, 23, DType::bf16);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor x64 = x.detach().to(DType::f64).set_requires_grad(true), w64 = w.detach().to(DType::f64).set_requires_grad(true);
  Tensor b64 = b.detach().to(DType::f64).set_requires_grad(true);
  Tensor y = conv2d(x, w, b, cc.p), y64 = conv2d(x64, w64, b64, cc.p);
  // Forward: bias pre-loaded and fp32 accumulation, one rounding per output.
  CHECK(test::compare(y, y64, std::ldexp(1.0, -8), 1e-6) == "");
  Tensor gy = rand_t(y.shape(), 24, DType::bf16);
  auto g = grad({y}, {x, w, b}, {gy});
  auto g64 = grad({y64}, {x64, w64, b64}, {gy.to(DType::f64)});
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("input " << i);
    CHECK(g[i].dtype() == DType::bf16);
    CHECK(test::compare(g[i], g64[i], 1e-2, 1e-2) == "");
  }
}

TEST_CASE("conv2d_input_grad equals conv2d's input gradient in both layouts", "[conv2d]") {
  const std::vector<ConvCase> cases = {{2, 3, 7, 9, 5, 3, 3, params(2, 1, 1, 1)},   // stride 2: H not implied by OH
                                       {2, 4, 8, 8, 6, 3, 3, params(1, 1, 1, 2)},   // groups 2
                                       {1, 3, 9, 7, 4, 3, 3, params(1, 2, 2, 1)}};  // dilation 2
  uint64_t seed = 60;
  for (const ConvCase& cc : cases) {
    Tensor x = rand_t({cc.N, cc.C, cc.H, cc.W}, ++seed), w = rand_t({cc.O, cc.C / cc.p.groups, cc.KH, cc.KW}, ++seed);
    x.set_requires_grad(true);
    const Tensor y = conv2d(x, w, Tensor(), cc.p);
    const Tensor g = rand_t(y.shape(), ++seed);
    sum(mul(y, g)).backward();
    const Tensor gx = conv2d_input_grad(g, w, cc.H, cc.W, cc.p);
    CHECK(gx.shape() == x.shape());
    CHECK(test::rel_error(gx, x.grad()) == 0.0);  // the same computation
    CHECK_FALSE(gx.requires_grad());
    Conv2dParams q = cc.p;  // channels last: (N, OH, OW, O) in, (N, H, W, C) out
    q.layout = ConvLayout::nhwc;
    const Tensor gx_nhwc = conv2d_input_grad(permute(g, {0, 2, 3, 1}), w, cc.H, cc.W, q);
    CHECK(gx_nhwc.is_contiguous());
    CHECK(test::rel_error(permute(gx_nhwc, {0, 3, 1, 2}), x.grad()) == 0.0);
  }
  const Tensor w = rand_t({6, 4, 3, 3}, 70);
  CHECK_THROWS_WITH(conv2d_input_grad(rand_t({1, 5, 5, 5}, 71), w, 5, 5, params(1, 1, 1, 1)),
                    HasSubstr("(1, 5, 5, 5) on cpu does not match"));  // 5 channels for a 6-output weight
  CHECK_THROWS_WITH(conv2d_input_grad(rand_t({1, 6, 4, 4}, 72), w, 5, 5, params(1, 1, 1, 1)),
                    HasSubstr("expected 6 channels on a 5x5 grid"));
  CHECK_THROWS_WITH(conv2d_input_grad(rand_t({1, 6, 5}, 73), w, 5, 5, params(1, 1, 1, 1)), HasSubstr("g must be"));
  CHECK_THROWS_WITH(conv2d_input_grad(rand_t({1, 6, 5, 5}, 74), w, 0, 5, params(1, 1, 1, 1)),
                    HasSubstr("input size must be positive"));
}

TEST_CASE("conv2d_weight_grad equals conv2d's weight gradient in both layouts", "[conv2d]") {
  const std::vector<ConvCase> cases = {{2, 3, 7, 9, 5, 3, 3, params(2, 1, 1, 1)},   // stride 2
                                       {2, 4, 8, 8, 6, 3, 3, params(1, 1, 1, 2)},   // groups 2
                                       {1, 3, 9, 7, 4, 3, 3, params(1, 2, 2, 1)}};  // dilation 2
  uint64_t seed = 80;
  for (const ConvCase& cc : cases) {
    const Tensor x = rand_t({cc.N, cc.C, cc.H, cc.W}, ++seed);
    Tensor w = rand_t({cc.O, cc.C / cc.p.groups, cc.KH, cc.KW}, ++seed);
    w.set_requires_grad(true);
    const Tensor y = conv2d(x, w, Tensor(), cc.p);
    const Tensor g = rand_t(y.shape(), ++seed);
    sum(mul(y, g)).backward();
    const Tensor gw = conv2d_weight_grad(x, g, cc.KH, cc.KW, cc.p);
    CHECK(gw.shape() == w.shape());
    CHECK(test::rel_error(gw, w.grad()) == 0.0);  // the same computation
    CHECK_FALSE(gw.requires_grad());
    Conv2dParams q = cc.p;  // channels last: x (N, H, W, C), g (N, OH, OW, O)
    q.layout = ConvLayout::nhwc;
    const Tensor gw_nhwc = conv2d_weight_grad(permute(x, {0, 2, 3, 1}), permute(g, {0, 2, 3, 1}), cc.KH, cc.KW, q);
    CHECK(test::rel_error(gw_nhwc, w.grad()) == 0.0);
  }
  const Tensor x = rand_t({1, 4, 5, 5}, 90);
  CHECK_THROWS_WITH(conv2d_weight_grad(x, rand_t({1, 6, 4, 4}, 91), 3, 3, params(1, 1, 1, 1)),
                    HasSubstr("expected 1 samples on a 5x5 grid"));
  CHECK_THROWS_WITH(conv2d_weight_grad(x, rand_t({1, 6, 5}, 92), 3, 3, params(1, 1, 1, 1)), HasSubstr("g must be"));
  CHECK_THROWS_WITH(conv2d_weight_grad(x, rand_t({1, 6, 5, 5}, 93).to(DType::bf16), 3, 3, params(1, 1, 1, 1)),
                    HasSubstr("must have the same dtype"));
  CHECK_THROWS_WITH(conv2d_weight_grad(x, rand_t({1, 6, 5, 5}, 94), 0, 3, params(1, 1, 1, 1)),
                    HasSubstr("kernel size must be positive"));
}

TEST_CASE("conv2d validates shapes and parameters with clear messages", "[conv2d][errors]") {
  Tensor x = rand_t({1, 4, 5, 5}, 31), w = rand_t({6, 2, 3, 3}, 32);
  CHECK_THROWS_WITH(conv2d(rand_t({4, 5, 5}, 33), w, Tensor(), params(1, 0, 1, 2)), HasSubstr("must be (N, C, H, W)"));
  CHECK_THROWS_WITH(conv2d(x, rand_t({6, 2, 3}, 34), Tensor(), {}), HasSubstr("weight must be (O, C/groups, KH, KW)"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor(), params(1, 0, 1, 3)), HasSubstr("not divisible by groups = 3"));
  CHECK_THROWS_WITH(conv2d(x, rand_t({5, 2, 3, 3}, 35), Tensor(), params(1, 0, 1, 2)),
                    HasSubstr("output channels O = 5"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor(), {}), HasSubstr("needs C/groups = 4"));
  CHECK_THROWS_WITH(conv2d(x, rand_t({6, 2, 7, 3}, 36), Tensor(), params(1, 0, 1, 2)),
                    HasSubstr("output size would not be positive"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor(), params(1, 0, 3, 2)), HasSubstr("dilated kernel 7x7"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor(), params(0, 0, 1, 2)), HasSubstr("stride must be >= 1"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor(), params(1, -1, 1, 2)), HasSubstr("padding must be >= 0"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor(), params(1, 0, 1, 0)), HasSubstr("groups must be >= 1"));
  CHECK_THROWS_WITH(conv2d(x, w, rand_t({5}, 37), params(1, 0, 1, 2)), HasSubstr("bias must be (O) = (6)"));
  CHECK_THROWS_WITH(conv2d(x.to(DType::f32), w, Tensor(), params(1, 0, 1, 2)), HasSubstr("share one dtype"));
}
