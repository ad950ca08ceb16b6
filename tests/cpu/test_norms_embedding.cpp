// layer_norm, rms_norm and embedding: naive references, odd sizes, non-contiguous inputs, gradients
// (with and without affine parameters), lower precision and error messages.
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

// Naive layer norm over the last dim of a row-major (rows, d) buffer; empty w / b mean none.
std::vector<double> ref_layer_norm(const std::vector<double>& x, int64_t d, const std::vector<double>& w,
                                   const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(d); ++r) {
    const double* row = &x[r * static_cast<std::size_t>(d)];
    double m = 0, v = 0;
    for (int64_t j = 0; j < d; ++j) m += row[j] / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) v += (row[j] - m) * (row[j] - m) / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      const auto ju = static_cast<std::size_t>(j);
      y[r * static_cast<std::size_t>(d) + ju] =
          (row[j] - m) / std::sqrt(v + eps) * (w.empty() ? 1.0 : w[ju]) + (b.empty() ? 0.0 : b[ju]);
    }
  }
  return y;
}

std::vector<double> ref_rms_norm(const std::vector<double>& x, int64_t d, const std::vector<double>& w, double eps) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(d); ++r) {
    const double* row = &x[r * static_cast<std::size_t>(d)];
    double ms = 0;
    for (int64_t j = 0; j < d; ++j) ms += row[j] * row[j] / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j)
      y[r * static_cast<std::size_t>(d) + static_cast<std::size_t>(j)] =
          row[j] / std::sqrt(ms + eps) * (w.empty() ? 1.0 : w[static_cast<std::size_t>(j)]);
  }
  return y;
}

Tensor ids_tensor(const std::vector<int64_t>& v, const Shape& s, DType dt = DType::i64) {
  return from_vector(v, s, {dt});
}

}  // namespace

TEST_CASE("layer_norm matches a naive reference with and without affine parameters", "[layer_norm]") {
  const int64_t d = 13;
  const Tensor x = test::random_tensor({2, 3, d}, 31, DType::f64, -2.0, 3.0);
  const Tensor w = test::random_tensor({d}, 32, DType::f64, 0.5, 1.5);
  const Tensor b = test::random_tensor({d}, 33);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  const Tensor y = layer_norm(x, w, b, 1e-5);
  CHECK(y.shape() == x.shape());
  CHECK(test::compare(y, ref_layer_norm(xv, d, wv, bv, 1e-5), 1e-12, 1e-12) == "");
  CHECK(test::compare(layer_norm(x, {}, {}, 1e-5), ref_layer_norm(xv, d, {}, {}, 1e-5), 1e-12, 1e-12) == "");
  CHECK(test::compare(layer_norm(x, w, {}, 1e-3), ref_layer_norm(xv, d, wv, {}, 1e-3), 1e-12, 1e-12) == "");
  CHECK(test::compare(layer_norm(x, {}, b, 0.0), ref_layer_norm(xv, d, {}, bv, 0.0), 1e-12, 1e-12) == "");
  // without affine every row has mean 0 and (biased) variance 1 / (1 + eps / var) ~ 1
  const Tensor n = layer_norm(x, {}, {}, 0.0);
  CHECK(test::compare(mean(n, {-1}), std::vector<double>(6, 0.0), 0, 1e-12) == "");
  CHECK(test::compare(var(n, {-1}, 0), std::vector<double>(6, 1.0), 1e-12, 1e-12) == "");
}

TEST_CASE("layer_norm and rms_norm read non-contiguous input", "[layer_norm][rms_norm]") {
  const int64_t d = 13;
  const Tensor base = test::random_tensor({d, 5}, 34, DType::f64, -2.0, 2.0);
  const Tensor x = base.transpose(0, 1);  // (5, 13), last dim has stride 5
  REQUIRE_FALSE(x.is_contiguous());
  const Tensor w = test::random_tensor({d}, 35, DType::f64, 0.5, 1.5);
  const Tensor b = test::random_tensor({d}, 36);
  const auto xv = x.contiguous().to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  CHECK(test::compare(layer_norm(x, w, b), ref_layer_norm(xv, d, wv, bv, 1e-5), 1e-12, 1e-12) == "");
  CHECK(test::compare(rms_norm(x, w), ref_rms_norm(xv, d, wv, 1e-6), 1e-12, 1e-12) == "");
  // a strided affine parameter too
  const Tensor w2 = test::random_tensor({d, 2}, 37, DType::f64, 0.5, 1.5);
  const Tensor ws = select(w2, 1, 1);
  CHECK(test::compare(rms_norm(x, ws, 1e-3), ref_rms_norm(xv, d, ws.to_vector<double>(), 1e-3), 1e-12, 1e-12) == "");
}

TEST_CASE("rms_norm matches a naive reference", "[rms_norm]") {
  const int64_t d = 13;
  const Tensor x = test::random_tensor({4, 3, d}, 38, DType::f64, -2.0, 2.0);
  const Tensor w = test::random_tensor({d}, 39, DType::f64, 0.5, 1.5);
  const auto xv = x.to_vector<double>();
  CHECK(test::compare(rms_norm(x, w, 1e-6), ref_rms_norm(xv, d, w.to_vector<double>(), 1e-6), 1e-12, 1e-12) == "");
  CHECK(test::compare(rms_norm(x, {}, 0.5), ref_rms_norm(xv, d, {}, 0.5), 1e-12, 1e-12) == "");
  // rms_norm is not layer_norm: no centring
  const Tensor shifted = add(x, 3.0);
  CHECK_FALSE(test::close(rms_norm(shifted, w), rms_norm(x, w), 1e-3, 1e-3));
  CHECK(test::close(layer_norm(shifted, w, {}), layer_norm(x, w, {}), 1e-9, 1e-9));
}

TEST_CASE("norm gradients pass the finite-difference check", "[layer_norm][rms_norm][gradcheck]") {
  const int64_t d = 7;
  Tensor x = test::random_tensor({3, 2, d}, 40, DType::f64, -2.0, 2.0).set_requires_grad(true);
  Tensor w = test::random_tensor({d}, 41, DType::f64, 0.5, 1.5).set_requires_grad(true);
  Tensor b = test::random_tensor({d}, 42).set_requires_grad(true);
  using In = const std::vector<Tensor>&;
  CHECK(test::gradcheck([](In in) { return layer_norm(in[0], in[1], in[2], 1e-5); }, {x, w, b}) == "");
  CHECK(test::gradcheck([](In in) { return layer_norm(in[0], {}, {}, 1e-5); }, {x}) == "");
  CHECK(test::gradcheck([](In in) { return layer_norm(in[0], in[1], {}, 1e-2); }, {x, w}) == "");
  CHECK(test::gradcheck([](In in) { return layer_norm(in[0], {}, in[1], 1e-5); }, {x, b}) == "");
  // parameters only (x does not require grad)
  const Tensor xc = x.detach();
  CHECK(test::gradcheck([&](In in) { return layer_norm(xc, in[0], in[1]); }, {w, b}) == "");
  // through a non-contiguous view: x is (3, d, 2) and the op sees (3, 2, d)
  Tensor xt = test::random_tensor({3, d, 2}, 43, DType::f64, -2.0, 2.0).set_requires_grad(true);
  CHECK(test::gradcheck([](In in) { return layer_norm(in[0].transpose(1, 2), in[1], in[2]); }, {xt, w, b}) == "");

  CHECK(test::gradcheck([](In in) { return rms_norm(in[0], in[1], 1e-6); }, {x, w}) == "");
  CHECK(test::gradcheck([](In in) { return rms_norm(in[0], {}, 1e-6); }, {x}) == "");
  CHECK(test::gradcheck([&](In in) { return rms_norm(xc, in[0]); }, {w}) == "");
  CHECK(test::gradcheck([](In in) { return rms_norm(in[0].transpose(1, 2), in[1]); }, {xt, w}) == "");
}

TEST_CASE("bf16 and f32 norms stay within tolerance of f64", "[layer_norm][rms_norm][dtype]") {
  const int64_t d = 13;
  const Tensor x = test::random_tensor({6, d}, 44, DType::f64, -3.0, 3.0);
  const Tensor w = test::random_tensor({d}, 45, DType::f64, 0.5, 1.5);
  const Tensor b = test::random_tensor({d}, 46);
  const Tensor xb = x.to(DType::bf16), wb = w.to(DType::bf16), bb = b.to(DType::bf16);
  const Tensor yb = layer_norm(xb, wb, bb);
  CHECK(yb.dtype() == DType::bf16);
  CHECK(test::compare(yb, layer_norm(xb.to(DType::f64), wb.to(DType::f64), bb.to(DType::f64)), 1.0 / 128, 1e-2) ==
        "");
  const Tensor yf = rms_norm(x.to(DType::f32), w.to(DType::f32));
  CHECK(yf.dtype() == DType::f32);
  CHECK(test::compare(yf, rms_norm(x, w), 1e-6, 1e-6) == "");
  // f32 gradients follow the f64 ones and keep each input's dtype
  Tensor xf = x.to(DType::f32).set_requires_grad(true), wf = w.to(DType::f32).set_requires_grad(true);
  Tensor bf = b.to(DType::f32).set_requires_grad(true);
  Tensor xd = x.detach().clone().set_requires_grad(true), wd = w.detach().clone().set_requires_grad(true);
  Tensor bd = b.detach().clone().set_requires_grad(true);
  const Tensor r = test::random_tensor({6, d}, 47);
  sum(mul(layer_norm(xf, wf, bf), r.to(DType::f32))).backward();
  sum(mul(layer_norm(xd, wd, bd), r)).backward();
  CHECK(xf.grad().dtype() == DType::f32);
  CHECK(test::compare(xf.grad(), xd.grad(), 1e-4, 1e-5) == "");
  CHECK(test::compare(wf.grad(), wd.grad(), 1e-4, 1e-5) == "");
  CHECK(test::compare(bf.grad(), bd.grad(), 1e-5, 1e-6) == "");
}

TEST_CASE("norms report bad parameter shapes and dtypes", "[layer_norm][rms_norm][errors]") {
  const Tensor x = test::random_tensor({4, 13}, 48);
  CHECK_THROWS_WITH(layer_norm(x, test::random_tensor({12}, 1), {}),
                    HasSubstr("layer_norm: expected weight of shape (13)"));
  CHECK_THROWS_WITH(layer_norm(x, {}, test::random_tensor({13, 1}, 1)), HasSubstr("expected bias of shape (13)"));
  CHECK_THROWS_WITH(rms_norm(x, test::random_tensor({4}, 1)), HasSubstr("rms_norm: expected weight of shape (13)"));
  const Tensor xi = from_vector(std::vector<int64_t>{1, 2, 3}, {1, 3}, {DType::i64});
  CHECK_THROWS_WITH(layer_norm(xi, {}, {}), HasSubstr("layer_norm: expected a floating tensor"));
  CHECK_THROWS_WITH(rms_norm(xi, {}), HasSubstr("rms_norm: expected a floating tensor"));
  CHECK_THROWS_WITH(layer_norm(scalar_tensor(1.0, {DType::f64}), {}, {}), HasSubstr("expected x of shape (..., D)"));
}

TEST_CASE("embedding gathers rows for ids of any shape", "[embedding]") {
  const int64_t v = 11, d = 13;
  const Tensor w = test::random_tensor({v, d}, 50);
  const auto wv = w.to_vector<double>();
  const std::vector<int64_t> idv = {3, 0, 10, 3, 7, 1};
  for (DType dt : {DType::i64, DType::i32}) {
    const Tensor out = embedding(w, ids_tensor(idv, {2, 3}, dt));
    CHECK(out.shape() == Shape{2, 3, d});
    CHECK(out.dtype() == DType::f64);
    std::vector<double> expected;
    for (int64_t id : idv)
      for (int64_t j = 0; j < d; ++j) expected.push_back(wv[static_cast<std::size_t>(id * d + j)]);
    CHECK(test::compare(out, expected, 0, 0) == "");
  }
  // non-contiguous ids and weight: ids (3, 2) transposed to (2, 3); weight (D, V) transposed to (V, D)
  const Tensor idt = ids_tensor({3, 3, 0, 7, 10, 1}, {3, 2}).transpose(0, 1);  // [[3, 0, 10], [3, 7, 1]]
  const Tensor wt_base = test::random_tensor({d, v}, 51);
  const Tensor wt = wt_base.transpose(0, 1);
  const Tensor out = embedding(wt, idt);
  CHECK(out.shape() == Shape{2, 3, d});
  const auto wtv = wt.contiguous().to_vector<double>();
  std::vector<double> expected;
  for (int64_t id : idv)
    for (int64_t j = 0; j < d; ++j) expected.push_back(wtv[static_cast<std::size_t>(id * d + j)]);
  CHECK(test::compare(out, expected, 0, 0) == "");
  // 0-d ids give one row of shape (D); bf16 weights are copied bit-exactly
  const Tensor wb = w.to(DType::bf16);
  const Tensor one = embedding(wb, ids_tensor({4}, {}));
  CHECK(one.shape() == Shape{d});
  CHECK(one.dtype() == DType::bf16);
  CHECK(test::compare(one, select(wb, 0, 4), 0, 0) == "");
}

TEST_CASE("embedding backward scatter-adds repeated ids", "[embedding][gradcheck]") {
  const int64_t v = 5, d = 3;
  Tensor w = test::random_tensor({v, d}, 52).set_requires_grad(true);
  embedding(w, ids_tensor({1, 1, 3, 1}, {2, 2})).backward(ones({2, 2, d}, {DType::f64}));
  CHECK(test::compare(w.grad(), {0, 0, 0, 3, 3, 3, 0, 0, 0, 1, 1, 1, 0, 0, 0}, 0, 0) == "");
  // weighted gradient rows
  w.zero_grad();
  const Tensor g = from_vector(std::vector<double>{1, 2, 3, 10, 20, 30}, {2, d}, {DType::f64});
  embedding(w, ids_tensor({4, 4}, {2})).backward(g);
  CHECK(test::compare(select(w.grad(), 0, 4), {11, 22, 33}, 0, 0) == "");
  CHECK(test::compare(sum(w.grad()), {66}, 0, 0) == "");

  Tensor w2 = test::random_tensor({7, 13}, 53).set_requires_grad(true);
  const Tensor ids = ids_tensor({6, 0, 6, 2, 2, 2}, {3, 2}, DType::i32);
  using In = const std::vector<Tensor>&;
  CHECK(test::gradcheck([&](In in) { return embedding(in[0], ids); }, {w2}) == "");
  Tensor w2t = test::random_tensor({13, 7}, 54).set_requires_grad(true);
  CHECK(test::gradcheck([&](In in) { return embedding(in[0].transpose(0, 1), ids.transpose(0, 1)); }, {w2t}) == "");
  // bf16 weights get a bf16 gradient
  Tensor wb = test::random_tensor({7, 13}, 55, DType::bf16).set_requires_grad(true);
  sum(embedding(wb, ids)).backward();
  CHECK(wb.grad().dtype() == DType::bf16);
  CHECK(test::compare(sum(wb.grad(), {1}), {13, 0, 39, 0, 0, 0, 26}, 0, 0) == "");
}

TEST_CASE("embedding reports out-of-range ids and bad inputs", "[embedding][errors]") {
  const Tensor w = test::random_tensor({11, 13}, 56);
  CHECK_THROWS_WITH(embedding(w, ids_tensor({0, 11, 2}, {3})), HasSubstr("id 11") && HasSubstr("V = 11"));
  CHECK_THROWS_WITH(embedding(w, ids_tensor({-1}, {1}, DType::i32)), HasSubstr("id -1") && HasSubstr("V = 11"));
  CHECK_THROWS_WITH(embedding(w, test::random_tensor({3}, 1)), HasSubstr("integer ids (i32 or i64)"));
  CHECK_THROWS_WITH(embedding(test::random_tensor({11}, 1), ids_tensor({0}, {1})),
                    HasSubstr("expected weight of shape (V, D)"));
}
