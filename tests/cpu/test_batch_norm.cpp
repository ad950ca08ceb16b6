// batch_norm: train/eval outputs against a naive reference (2-D and 4-D, odd sizes, non-contiguous x),
// running-stat updates over two steps, gradchecks in both modes with and without affine, errors, f32 vs f64.
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

namespace {

// x viewed as (N, C, S) row-major, S = product of the spatial dims.
struct Layout {
  int64_t N, C, S;
  std::size_t at(int64_t n, int64_t c, int64_t s) const { return static_cast<std::size_t>((n * C + c) * S + s); }
};

struct Stats {
  std::vector<double> mean, var;  // biased variance
};

Stats ref_stats(const std::vector<double>& x, const Layout& l) {
  Stats st{std::vector<double>(static_cast<std::size_t>(l.C), 0.0), std::vector<double>(static_cast<std::size_t>(l.C), 0.0)};
  const double M = static_cast<double>(l.N * l.S);
  for (int64_t c = 0; c < l.C; ++c) {
    double s = 0;
    for (int64_t n = 0; n < l.N; ++n)
      for (int64_t k = 0; k < l.S; ++k) s += x[l.at(n, c, k)];
    const double mu = s / M;
    double ss = 0;
    for (int64_t n = 0; n < l.N; ++n)
      for (int64_t k = 0; k < l.S; ++k) ss += (x[l.at(n, c, k)] - mu) * (x[l.at(n, c, k)] - mu);
    st.mean[static_cast<std::size_t>(c)] = mu;
    st.var[static_cast<std::size_t>(c)] = ss / M;
  }
  return st;
}

// y = (x - mean) / sqrt(var + eps) * w + b per channel (empty w / b mean no affine).
std::vector<double> ref_normalize(const std::vector<double>& x, const Layout& l, const std::vector<double>& mean,
                                  const std::vector<double>& var, const std::vector<double>& w,
                                  const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < l.N; ++n)
    for (int64_t c = 0; c < l.C; ++c)
      for (int64_t k = 0; k < l.S; ++k) {
        const auto ci = static_cast<std::size_t>(c);
        double v = (x[l.at(n, c, k)] - mean[ci]) / std::sqrt(var[ci] + eps);
        if (!w.empty()) v *= w[ci];
        if (!b.empty()) v += b[ci];
        y[l.at(n, c, k)] = v;
      }
  return y;
}

TensorOptions f64_opts() { return {DType::f64}; }

}  // namespace

TEST_CASE("batch_norm train mode matches a naive reference (4-D and 2-D)", "[batch_norm]") {
  const double eps = 1e-5;
  SECTION("4-D (N, C, H, W) with odd sizes") {
    const Layout l{3, 4, 7 * 5};
    Tensor x = test::random_tensor({3, 4, 7, 5}, 31, DType::f64, -2.0, 3.0);
    Tensor w = test::random_tensor({4}, 32, DType::f64, 0.5, 1.5), b = test::random_tensor({4}, 33);
    const auto xv = x.to_vector<double>();
    const Stats st = ref_stats(xv, l);
    Tensor y = batch_norm(x, w, b, {}, {}, {BatchNormMode::train, 0.1, eps});
    CHECK(y.shape() == x.shape());
    CHECK(test::compare(y, ref_normalize(xv, l, st.mean, st.var, w.to_vector<double>(), b.to_vector<double>(), eps),
                        1e-12, 1e-12) == "");
    // Without affine the output of each channel has mean 0 and (biased) variance var / (var + eps).
    Tensor yn = batch_norm(x, {}, {}, {}, {});
    CHECK(test::compare(yn, ref_normalize(xv, l, st.mean, st.var, {}, {}, eps), 1e-12, 1e-12) == "");
    CHECK(test::compare(mean(yn, {0, 2, 3}), std::vector<double>(4, 0.0), 0, 1e-12) == "");
  }
  SECTION("2-D (N, C)") {
    const Layout l{6, 5, 1};
    Tensor x = test::random_tensor({6, 5}, 34);
    Tensor w = test::random_tensor({5}, 35), b = test::random_tensor({5}, 36);
    const auto xv = x.to_vector<double>();
    const Stats st = ref_stats(xv, l);
    CHECK(test::compare(batch_norm(x, w, b, {}, {}),
                        ref_normalize(xv, l, st.mean, st.var, w.to_vector<double>(), b.to_vector<double>(), eps),
                        1e-12, 1e-12) == "");
  }
}

TEST_CASE("batch_norm updates running stats with the unbiased variance over two steps", "[batch_norm]") {
  const Layout l{3, 4, 6};
  const double m = 0.3;
  Tensor rm = zeros({4}), rv = ones({4});  // f32 buffers, as modules keep them
  Tensor x1 = test::random_tensor({3, 4, 2, 3}, 41, DType::f64, -1.0, 2.0);
  Tensor x2 = test::random_tensor({3, 4, 2, 3}, 42, DType::f64, 0.0, 5.0);
  batch_norm(x1, {}, {}, rm, rv, {BatchNormMode::train, m, 1e-5});
  batch_norm(x2, {}, {}, rm, rv, {BatchNormMode::train, m, 1e-5});
  const Stats s1 = ref_stats(x1.to_vector<double>(), l), s2 = ref_stats(x2.to_vector<double>(), l);
  const double unbias = 18.0 / 17.0;  // M = 3 * 6 = 18
  std::vector<double> em(4), ev(4);
  for (std::size_t c = 0; c < 4; ++c) {
    const double m1 = m * s1.mean[c], v1 = (1 - m) * 1.0 + m * s1.var[c] * unbias;
    em[c] = (1 - m) * m1 + m * s2.mean[c];
    ev[c] = (1 - m) * v1 + m * s2.var[c] * unbias;
  }
  CHECK(rm.dtype() == DType::f32);
  CHECK(test::compare(rm, em, 1e-6, 1e-7) == "");
  CHECK(test::compare(rv, ev, 1e-6, 1e-7) == "");
  // Using the biased variance instead would be visibly different.
  CHECK(std::abs(ev[0] - ((1 - m) * ((1 - m) + m * s1.var[0]) + m * s2.var[0])) > 1e-3);

  // Eval mode normalises with the running stats and leaves them alone.
  Tensor w = test::random_tensor({4}, 43), b = test::random_tensor({4}, 44);
  Tensor x3 = test::random_tensor({3, 4, 2, 3}, 45);
  Tensor y = batch_norm(x3, w, b, rm, rv, {BatchNormMode::eval, m, 1e-5});
  CHECK(test::compare(y,
                      ref_normalize(x3.to_vector<double>(), l, rm.to_vector<double>(), rv.to_vector<double>(),
                                    w.to_vector<double>(), b.to_vector<double>(), 1e-5),
                      1e-12, 1e-12) == "");
  CHECK(test::compare(rm, em, 1e-6, 1e-7) == "");
  CHECK(test::compare(rv, ev, 1e-6, 1e-7) == "");
}

TEST_CASE("batch_norm reads non-contiguous x through its strides", "[batch_norm]") {
  Tensor nhwc = test::random_tensor({2, 5, 3, 4}, 51);
  Tensor x = nhwc.permute({0, 3, 1, 2});  // (N, C, H, W) = (2, 4, 5, 3), channels last in memory
  REQUIRE_FALSE(x.is_contiguous());
  Tensor w = test::random_tensor({4}, 52), b = test::random_tensor({4}, 53);
  Tensor rm1 = zeros({4}), rv1 = ones({4}), rm2 = zeros({4}), rv2 = ones({4});
  CHECK(test::compare(batch_norm(x, w, b, rm1, rv1), batch_norm(x.contiguous(), w, b, rm2, rv2), 0, 1e-14) == "");
  CHECK(test::compare(rm1, rm2, 0, 0) == "");
  CHECK(test::compare(rv1, rv2, 0, 0) == "");
  CHECK(test::compare(batch_norm(x, w, b, rm1, rv1, {BatchNormMode::eval}),
                      batch_norm(x.contiguous(), w, b, rm1, rv1, {BatchNormMode::eval}), 0, 0) == "");
  Tensor cn = test::random_tensor({4, 6}, 54);
  CHECK(test::compare(batch_norm(cn.transpose(0, 1), {}, {}, {}, {}), batch_norm(cn.transpose(0, 1).contiguous(), {}, {}, {}, {}),
                      0, 1e-14) == "");
}

TEST_CASE("batch_norm gradients pass the finite-difference check", "[batch_norm][gradcheck]") {
  Tensor x4 = test::random_tensor({3, 2, 3, 5}, 61).set_requires_grad(true);
  Tensor x2 = test::random_tensor({5, 3}, 62).set_requires_grad(true);
  Tensor w2 = test::random_tensor({2}, 63, DType::f64, 0.5, 1.5).set_requires_grad(true);
  Tensor b2 = test::random_tensor({2}, 64).set_requires_grad(true);
  Tensor w3 = test::random_tensor({3}, 65, DType::f64, 0.5, 1.5).set_requires_grad(true);
  Tensor b3 = test::random_tensor({3}, 66).set_requires_grad(true);
  Tensor rm2 = test::random_tensor({2}, 67, DType::f64), rv2 = test::random_tensor({2}, 68, DType::f64, 0.5, 2.0);
  Tensor rm3 = test::random_tensor({3}, 69, DType::f64), rv3 = test::random_tensor({3}, 70, DType::f64, 0.5, 2.0);
  const BatchNormOptions train{BatchNormMode::train, 0.1, 1e-5}, eval{BatchNormMode::eval, 0.1, 1e-5};
  auto check = [](test::GradcheckFn f, const std::vector<Tensor>& in) { CHECK(test::gradcheck(f, in) == ""); };

  SECTION("train mode") {
    Tensor rm = zeros({2}), rv = ones({2});  // updated on every call; the output must not depend on them
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm, rv, train); }, {x4, w2, b2});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, {}, {}, train); }, {x4});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], {}, {}, train); }, {x2, w3, b3});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, {}, {}, train); }, {x2});
    // weight only, bias only
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], {}, {}, {}, train); }, {x4, w2});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, in[1], {}, {}, train); }, {x2, b3});
    // x constant, only the affine parameters need gradients
    check([&](const std::vector<Tensor>& in) { return batch_norm(x4.detach(), in[0], in[1], {}, {}, train); }, {w2, b2});
  }
  SECTION("eval mode") {
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm2, rv2, eval); }, {x4, w2, b2});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, rm2, rv2, eval); }, {x4});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm3, rv3, eval); }, {x2, w3, b3});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, rm3, rv3, eval); }, {x2});
  }
  SECTION("through non-contiguous views") {
    Tensor nhwc = test::random_tensor({2, 3, 4, 2}, 71).set_requires_grad(true);  // permuted to (2, 2, 3, 4)
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0].permute({0, 3, 1, 2}), in[1], in[2], {}, {}, train); },
          {nhwc, w2, b2});
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0].permute({0, 3, 1, 2}), in[1], in[2], rm2, rv2, eval); },
          {nhwc, w2, b2});
    Tensor cn = test::random_tensor({3, 5}, 72).set_requires_grad(true);  // transposed to (5, 3)
    check([&](const std::vector<Tensor>& in) { return batch_norm(in[0].transpose(0, 1), in[1], in[2], {}, {}, train); },
          {cn, w3, b3});
  }
}

TEST_CASE("batch_norm eval backward keeps the statistics of its forward", "[batch_norm][autograd]") {
  Tensor x = test::random_tensor({4, 3}, 81).set_requires_grad(true);
  Tensor w = test::random_tensor({3}, 82);
  Tensor rm = zeros({3}, {DType::f64}), rv = full({3}, 4.0, {DType::f64});
  Tensor y = batch_norm(x, w, {}, rm, rv, {BatchNormMode::eval, 0.1, 0.0 + 1e-5});
  fill_(rv, 100.0);  // a later in-place update of the buffers must not change this backward
  y.backward(ones({4, 3}, {DType::f64}));
  std::vector<double> expected;
  const auto wv = w.to_vector<double>();
  for (int n = 0; n < 4; ++n)
    for (int c = 0; c < 3; ++c) expected.push_back(wv[static_cast<std::size_t>(c)] / std::sqrt(4.0 + 1e-5));
  CHECK(test::compare(x.grad(), expected, 1e-14, 0) == "");
}

TEST_CASE("batch_norm rejects bad inputs with clear messages", "[batch_norm][errors]") {
  Tensor x = test::random_tensor({4, 3, 2, 2}, 91);
  Tensor w = ones({3}, f64_opts()), rm = zeros({3}), rv = ones({3});
  CHECK_THROWS_WITH(batch_norm(x, ones({4}, f64_opts()), {}, {}, {}), HasSubstr("weight must have shape (3)"));
  CHECK_THROWS_WITH(batch_norm(x, w, ones({3, 1}), {}, {}), HasSubstr("bias must have shape (3)"));
  CHECK_THROWS_WITH(batch_norm(x, w, {}, {}, {}, {BatchNormMode::eval}), HasSubstr("eval mode normalises with running_mean"));
  CHECK_THROWS_WITH(batch_norm(x, w, {}, rm, {}), HasSubstr("pass both running_mean and running_var"));
  CHECK_THROWS_WITH(batch_norm(test::random_tensor({5}, 1), {}, {}, {}, {}), HasSubstr("at least 2 dims"));
  CHECK_THROWS_WITH(batch_norm(test::random_tensor({1, 3}, 1), {}, {}, {}, {}), HasSubstr("more than 1 value per channel"));
  CHECK_THROWS_WITH(batch_norm(x.to(DType::i32), {}, {}, {}, {}), HasSubstr("expected a floating"));
  CHECK_THROWS_WITH(batch_norm(x, ones({3}, {DType::i64}), {}, {}, {}), HasSubstr("weight must be floating"));
  Tensor rm_grad = zeros({3}).set_requires_grad(true);
  CHECK_THROWS_WITH(batch_norm(x, w, {}, rm_grad, rv), HasSubstr("must not require grad"));
  BatchNormOptions counted;
  counted.num_batches_tracked = zeros({}, {DType::f32});
  CHECK_THROWS_WITH(batch_norm(x, w, {}, rm, rv, counted), HasSubstr("num_batches_tracked must be one i64 element"));
  counted.num_batches_tracked = zeros({}, {DType::i64});
  batch_norm(x, w, {}, rm, rv, counted);
  CHECK(counted.num_batches_tracked.item() == 1);
  // One value per channel is fine in eval mode.
  CHECK(batch_norm(test::random_tensor({1, 3}, 2), {}, {}, rm, rv, {BatchNormMode::eval}).shape() == Shape{1, 3});
}

TEST_CASE("f32 batch_norm agrees with f64 within f32 tolerance, forward and backward", "[batch_norm][dtype]") {
  Tensor x = test::random_tensor({4, 3, 5, 3}, 101, DType::f64, -3.0, 4.0);
  Tensor w = test::random_tensor({3}, 102, DType::f64, 0.5, 1.5), b = test::random_tensor({3}, 103);
  Tensor gy = test::random_tensor(x.shape(), 104);
  for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
    Tensor rm = full({3}, 0.2), rv = full({3}, 1.5);
    std::vector<Tensor> in64{x.clone().set_requires_grad(true), w.clone().set_requires_grad(true),
                             b.clone().set_requires_grad(true)};
    std::vector<Tensor> in32;
    for (const Tensor& t : in64) in32.push_back(t.detach().to(DType::f32).set_requires_grad(true));
    Tensor y64 = batch_norm(in64[0], in64[1], in64[2], rm.clone(), rv.clone(), {mode});
    Tensor y32 = batch_norm(in32[0], in32[1], in32[2], rm.clone(), rv.clone(), {mode});
    CHECK(y32.dtype() == DType::f32);
    CHECK(test::compare(y32, y64, 1e-5, 1e-5) == "");
    const auto g64 = grad({y64}, in64, {gy});
    const auto g32 = grad({y32}, in32, {gy.to(DType::f32)});
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(g32[i].dtype() == DType::f32);
      CHECK(test::compare(g32[i], g64[i], 1e-4, 1e-5) == "");
    }
  }
  // Mixed precision: bf16 activations with f32 parameters give gradients in each input's dtype.
  Tensor xb = x.to(DType::bf16).set_requires_grad(true);
  Tensor wf = w.to(DType::f32).set_requires_grad(true);
  Tensor yb = batch_norm(xb, wf, {}, {}, {});
  CHECK(yb.dtype() == DType::bf16);
  const auto gb = grad({yb}, {xb, wf}, {gy.to(DType::bf16)});
  CHECK(gb[0].dtype() == DType::bf16);
  CHECK(gb[1].dtype() == DType::f32);
  CHECK(test::compare(yb, batch_norm(x, w, {}, {}, {}), 2e-2, 2e-2) == "");
}
