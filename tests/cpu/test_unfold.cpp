// unfold2d / fold2d against naive references written from the definition: stride 2, padding, dilation 2,
// non-square kernels, odd sizes, non-contiguous inputs; adjointness <fold(c), x> = <c, unfold(x)>; gradchecks of
// both in fp64; unfold2d + matmul with the flattened weight equals conv2d; bf16 against f64; errors.
#include <vector>

#include "hadatrain/ops/ops.h"
#include "hadatrain/ops/unfold.h"
#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"
#include "support/unfold_cases.h"

using namespace ht;

namespace {

using Case = test::UnfoldCase;
using test::window;

int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / s + 1;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> cs = {
      {2, 3, 5, 7, window(3, 3, 1, 1, 1, 1, 1, 1)},   // "same" 3x3
      {1, 2, 9, 8, window(3, 3, 2, 2, 1, 1, 1, 1)},   // stride 2
      {2, 1, 9, 9, window(3, 3, 1, 1, 2, 2, 2, 2)},   // dilation 2
      {1, 3, 6, 11, window(2, 5, 1, 2, 0, 2, 1, 1)},  // non-square kernel, mixed strides
      {3, 2, 4, 4, window(1, 1, 1, 1, 0, 0, 1, 1)},   // 1x1
      {1, 2, 7, 5, window(3, 2, 3, 2, 1, 0, 2, 1)},   // everything at once
      {1, 1, 3, 3, window(3, 3, 1, 1, 0, 0, 1, 1)},   // L = 1
  };
  return cs;
}

// cols[n][oh·OW + ow][c·kh·kw + i·kw + j] = x[n][c][ih][iw] or 0, in double.
std::vector<double> naive_unfold(const Tensor& x, const Case& cs) {
  const auto xv = x.contiguous().to_vector<double>();
  const Unfold2dParams& p = cs.p;
  const int64_t OH = out_dim(cs.H, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t OW = out_dim(cs.W, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w);
  std::vector<double> out;
  for (int64_t n = 0; n < cs.N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t c = 0; c < cs.C; ++c)
          for (int64_t i = 0; i < p.kernel_h; ++i)
            for (int64_t j = 0; j < p.kernel_w; ++j) {
              const int64_t ih = oh * p.stride_h - p.pad_h + i * p.dilation_h;
              const int64_t iw = ow * p.stride_w - p.pad_w + j * p.dilation_w;
              const bool in = ih >= 0 && ih < cs.H && iw >= 0 && iw < cs.W;
              out.push_back(in ? xv[static_cast<std::size_t>(((n * cs.C + c) * cs.H + ih) * cs.W + iw)] : 0.0);
            }
  return out;
}

// The scatter form of fold: every column entry added to the pixel it was copied from.
std::vector<double> naive_fold(const Tensor& cols, const Case& cs) {
  const auto cv = cols.contiguous().to_vector<double>();
  const Unfold2dParams& p = cs.p;
  const int64_t OH = out_dim(cs.H, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t OW = out_dim(cs.W, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w);
  std::vector<double> out(static_cast<std::size_t>(cs.N * cs.C * cs.H * cs.W), 0.0);
  std::size_t k = 0;
  for (int64_t n = 0; n < cs.N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t c = 0; c < cs.C; ++c)
          for (int64_t i = 0; i < p.kernel_h; ++i)
            for (int64_t j = 0; j < p.kernel_w; ++j, ++k) {
              const int64_t ih = oh * p.stride_h - p.pad_h + i * p.dilation_h;
              const int64_t iw = ow * p.stride_w - p.pad_w + j * p.dilation_w;
              if (ih >= 0 && ih < cs.H && iw >= 0 && iw < cs.W)
                out[static_cast<std::size_t>(((n * cs.C + c) * cs.H + ih) * cs.W + iw)] += cv[k];
            }
  return out;
}

Fold2dParams fold_params(const Case& cs) { return Fold2dParams{cs.C, cs.H, cs.W, cs.p}; }

Shape cols_shape(const Case& cs) {
  const Unfold2dParams& p = cs.p;
  return {cs.N, out_dim(cs.H, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h) *
                    out_dim(cs.W, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w),
          cs.C * p.kernel_h * p.kernel_w};
}

}  // namespace

TEST_CASE("unfold2d and fold2d match the definition", "[unfold]") {
  uint64_t seed = 1;
  for (const Case& cs : cases()) {
    INFO(test::describe(cs));
    const Tensor x = test::random_tensor({cs.N, cs.C, cs.H, cs.W}, seed++);
    const Tensor cols = unfold2d(x, cs.p);
    CHECK(cols.shape() == cols_shape(cs));
    CHECK(test::compare(cols, naive_unfold(x, cs), 0, 0) == "");
    const Tensor c = test::random_tensor(cols_shape(cs), seed++);
    const Tensor img = fold2d(c, fold_params(cs));
    CHECK(img.shape() == Shape{cs.N, cs.C, cs.H, cs.W});
    CHECK(test::compare(img, naive_fold(c, cs), 1e-12, 1e-12) == "");
    // Adjoint: <fold(c), x> == <c, unfold(x)>.
    CHECK(sum(mul(img, x)).item() == Approx(sum(mul(c, cols)).item()).epsilon(1e-12));
  }
}

TEST_CASE("unfold2d and fold2d read non-contiguous inputs", "[unfold]") {
  const Case& cs = cases()[5];
  // x as a channels-last tensor viewed as NCHW.
  const Tensor nhwc = test::random_tensor({cs.N, cs.H, cs.W, cs.C}, 40);
  const Tensor x = nhwc.permute({0, 3, 1, 2});
  REQUIRE_FALSE(x.is_contiguous());
  CHECK(test::compare(unfold2d(x, cs.p), naive_unfold(x, cs), 0, 0) == "");
  const Shape s = cols_shape(cs);
  const Tensor ct = test::random_tensor({s[0], s[2], s[1]}, 41).transpose(1, 2);  // (N, L, K) strided
  REQUIRE_FALSE(ct.is_contiguous());
  CHECK(test::compare(fold2d(ct, fold_params(cs)), naive_fold(ct, cs), 1e-12, 1e-12) == "");
}

TEST_CASE("fold2d with channels_last writes the same image in (N, H, W, C) memory order", "[unfold]") {
  uint64_t seed = 60;
  for (const Case& cs : cases()) {
    INFO(test::describe(cs));
    const Tensor c = test::random_tensor(cols_shape(cs), seed++);
    Fold2dParams fp = fold_params(cs);
    fp.channels_last = true;
    const Tensor img = fold2d(c, fp);
    CHECK(img.shape() == Shape{cs.N, cs.C, cs.H, cs.W});
    // the (N, C, H, W) view of a contiguous (N, H, W, C) tensor
    CHECK(img.permute({0, 2, 3, 1}).is_contiguous());
    CHECK(test::compare(img, fold2d(c, fold_params(cs)), 0, 0) == "");
  }
}

TEST_CASE("unfold2d and fold2d pass gradcheck, also through views", "[unfold]") {
  uint64_t seed = 50;
  for (const Case& cs : {cases()[1], cases()[2], cases()[3], cases()[5]}) {
    const Tensor x = test::random_tensor({cs.N, cs.C, cs.H, cs.W}, seed++).set_requires_grad(true);
    CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return unfold2d(in[0], cs.p); }, {x}) == "");
    const Tensor c = test::random_tensor(cols_shape(cs), seed++).set_requires_grad(true);
    CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return fold2d(in[0], fold_params(cs)); }, {c}) == "");
  }
  const Case& cs = cases()[0];
  const Tensor xt = test::random_tensor({cs.N, cs.C, cs.W, cs.H}, 60).set_requires_grad(true);  // transposed to (N, C, H, W) inside
  CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return unfold2d(in[0].transpose(2, 3), cs.p); },
                        {xt}) == "");
  const Shape s = cols_shape(cs);
  const Tensor ct = test::random_tensor({s[0], s[2], s[1]}, 61).set_requires_grad(true);
  CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return fold2d(in[0].transpose(1, 2), fold_params(cs)); },
                        {ct}) == "");
}

TEST_CASE("unfold2d followed by a matmul with the flattened weight equals conv2d", "[unfold]") {
  uint64_t seed = 70;
  for (const Case& cs : cases()) {
    const int64_t O = 4;
    const Tensor x = test::random_tensor({cs.N, cs.C, cs.H, cs.W}, seed++);
    const Tensor w = test::random_tensor({O, cs.C, cs.p.kernel_h, cs.p.kernel_w}, seed++);
    Conv2dParams cp;
    cp.stride_h = cs.p.stride_h;
    cp.stride_w = cs.p.stride_w;
    cp.pad_h = cs.p.pad_h;
    cp.pad_w = cs.p.pad_w;
    cp.dilation_h = cs.p.dilation_h;
    cp.dilation_w = cs.p.dilation_w;
    const Tensor ref = conv2d(x, w, Tensor(), cp);  // (N, O, OH, OW)
    const Tensor y = matmul(unfold2d(x, cs.p), w.reshape({O, -1}).transpose(0, 1));  // (N, L, O)
    const Tensor as_conv = y.transpose(1, 2).reshape(ref.shape());
    CHECK(test::compare(as_conv, ref.to_vector<double>(), 1e-12, 1e-12) == "");
  }
}

TEST_CASE("unfold2d / fold2d in bf16 and f32 agree with f64", "[unfold]") {
  const Case& cs = cases()[5];
  const Tensor x = test::random_tensor({cs.N, cs.C, cs.H, cs.W}, 80);
  const Tensor c = test::random_tensor(cols_shape(cs), 81);
  for (DType dt : {DType::bf16, DType::f32, DType::f16, DType::f8e4m3}) {
    INFO(dtype_name(dt));
    const Tensor xl = x.to(dt), cl = c.to(dt);
    // unfold is a copy: exact in any dtype.
    CHECK(test::compare(unfold2d(xl, cs.p), unfold2d(xl.to(DType::f64), cs.p).to_vector<double>(), 0, 0) == "");
    const Tensor img = fold2d(cl, fold_params(cs));
    CHECK(img.dtype() == dt);
    const double tol = dt == DType::f32 ? 1e-6 : (dt == DType::f8e4m3 ? 0.07 : 1e-2);
    CHECK(test::compare(img, fold2d(cl.to(DType::f64), fold_params(cs)).to_vector<double>(), tol, tol) == "");
  }
}

TEST_CASE("unfold2d / fold2d reject bad shapes and params", "[unfold]") {
  const Tensor x = test::random_tensor({1, 2, 5, 5}, 1);
  CHECK_THROWS_WITH(unfold2d(test::random_tensor({2, 5, 5}, 1), {}), HasSubstr("must be (N, C, H, W)"));
  CHECK_THROWS_WITH(unfold2d(x, window(7, 3, 1, 1, 0, 0, 1, 1)), HasSubstr("larger than the padded image"));
  CHECK_THROWS_WITH(unfold2d(x, window(3, 3, 0, 1, 0, 0, 1, 1)), HasSubstr("stride must be >= 1"));
  CHECK_THROWS_WITH(unfold2d(x, window(3, 3, 1, 1, -1, 0, 1, 1)), HasSubstr("padding must be >= 0"));
  CHECK_THROWS_WITH(unfold2d(x, window(3, 3, 1, 1, 0, 0, 0, 1)), HasSubstr("dilation must be >= 1"));
  CHECK_THROWS_WITH(unfold2d(ones({1, 2, 5, 5}, {DType::i32}), {}), HasSubstr("expected a floating"));
  const Unfold2dParams p = window(3, 3, 1, 1, 1, 1, 1, 1);
  CHECK_THROWS_WITH(fold2d(test::random_tensor({1, 25, 17}, 1), Fold2dParams{2, 5, 5, p}),
                    HasSubstr("(N, 25, 18)"));
  CHECK_THROWS_WITH(fold2d(test::random_tensor({25, 18}, 1), Fold2dParams{2, 5, 5, p}), HasSubstr("must be (N, L"));
  CHECK_THROWS_WITH(fold2d(test::random_tensor({1, 25, 18}, 1), Fold2dParams{2, 0, 5, p}), HasSubstr("H >= 1"));
}
