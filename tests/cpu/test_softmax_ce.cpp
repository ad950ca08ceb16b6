// softmax, log_softmax and cross_entropy: naive references, non-contiguous inputs, gradients, PyTorch
// semantics of cross_entropy (ignore_index, label smoothing, reductions) and error messages.
#include <cmath>
#include <limits>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

// Naive softmax / log_softmax over `dim` of a row-major tensor with shape `s`.
std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& s, int dim, bool log) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= s[i];
  for (int i = dim + 1; i < s.size(); ++i) inner *= s[i];
  const int64_t len = s[dim];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return static_cast<std::size_t>((o * len + j) * inner + i); };
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += std::exp(x[at(j)]);
      for (int64_t j = 0; j < len; ++j) y[at(j)] = log ? x[at(j)] - std::log(total) : std::exp(x[at(j)]) / total;
    }
  return y;
}

// Naive PyTorch cross-entropy: per-row losses (0 for ignored rows) and the number of counted rows.
struct RefCe {
  std::vector<double> rows;
  int64_t count = 0;
};
RefCe ref_cross_entropy(const std::vector<double>& x, int64_t n, int64_t c, const std::vector<int64_t>& t,
                        int64_t ignore, double ls) {
  RefCe r;
  r.rows.assign(static_cast<std::size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[static_cast<std::size_t>(i)] == ignore) continue;
    ++r.count;
    double total = 0;
    for (int64_t k = 0; k < c; ++k) total += std::exp(x[static_cast<std::size_t>(i * c + k)]);
    std::vector<double> nlogp(static_cast<std::size_t>(c));
    double mean_nlogp = 0;
    for (int64_t k = 0; k < c; ++k) {
      nlogp[static_cast<std::size_t>(k)] = -std::log(std::exp(x[static_cast<std::size_t>(i * c + k)]) / total);
      mean_nlogp += nlogp[static_cast<std::size_t>(k)] / static_cast<double>(c);
    }
    r.rows[static_cast<std::size_t>(i)] =
        (1 - ls) * nlogp[static_cast<std::size_t>(t[static_cast<std::size_t>(i)])] + ls * mean_nlogp;
  }
  return r;
}

Tensor targets(const std::vector<int64_t>& v, DType dt = DType::i64) {
  return from_vector(v, {static_cast<int64_t>(v.size())}, {dt});
}

}  // namespace

TEST_CASE("softmax and log_softmax match a naive reference along every dim", "[softmax]") {
  const Tensor x = test::random_tensor({3, 7, 5}, 11, DType::f64, -3.0, 3.0);
  const auto xv = x.to_vector<double>();
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    CHECK(test::compare(softmax(x, d), ref_softmax(xv, x.shape(), d, false), 1e-12, 1e-15) == "");
    CHECK(test::compare(log_softmax(x, d), ref_softmax(xv, x.shape(), d, true), 1e-12, 1e-12) == "");
  }
  // negative dim
  CHECK(test::compare(softmax(x, -1), ref_softmax(xv, x.shape(), 2, false), 1e-12, 1e-15) == "");
  // each line of softmax sums to 1
  CHECK(test::compare(sum(softmax(x, 1), {1}), std::vector<double>(15, 1.0), 1e-12, 1e-12) == "");
  // a 0-d tensor is one line of length 1
  const Tensor s = scalar_tensor(3.0, {DType::f64});
  CHECK(softmax(s, 0).item() == 1.0);
  CHECK(log_softmax(s, -1).item() == 0.0);
}

TEST_CASE("softmax reads non-contiguous input through its strides", "[softmax]") {
  const Tensor base = test::random_tensor({5, 3, 7}, 12, DType::f64, -2.0, 2.0);
  const Tensor xt = base.permute({2, 0, 1});  // (7, 5, 3), non-contiguous
  REQUIRE_FALSE(xt.is_contiguous());
  const auto xv = xt.contiguous().to_vector<double>();
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    CHECK(test::compare(softmax(xt, d), ref_softmax(xv, xt.shape(), d, false), 1e-12, 1e-15) == "");
    CHECK(test::compare(log_softmax(xt, d), ref_softmax(xv, xt.shape(), d, true), 1e-12, 1e-12) == "");
  }
  const Tensor sl = slice(base, 2, 1, 7, 2);  // (5, 3, 3) strided slice
  CHECK(test::compare(softmax(sl, 2), ref_softmax(sl.contiguous().to_vector<double>(), sl.shape(), 2, false), 1e-12,
                      1e-15) == "");
}

TEST_CASE("softmax is numerically stable for large logits", "[softmax]") {
  const Tensor x = from_vector(std::vector<double>{1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}, {DType::f32});
  const double e = std::exp(1.0), z = 1 + e + e * e;
  CHECK(test::compare(softmax(x, 1), {1 / z, e / z, e * e / z, e * e / z, e / z, 1 / z}, 1e-6, 1e-7) == "");
  CHECK(test::compare(log_softmax(x, 1), {-2 - std::log(z / (e * e)), -1 - std::log(z / (e * e)),
                                          -std::log(z / (e * e)), -std::log(z / (e * e)), -1 - std::log(z / (e * e)),
                                          -2 - std::log(z / (e * e))},
                      1e-6, 1e-6) == "");
  CHECK(softmax(x, 1).dtype() == DType::f32);
}

TEST_CASE("softmax and log_softmax gradients pass the finite-difference check", "[softmax][gradcheck]") {
  Tensor x = test::random_tensor({4, 7, 3}, 13, DType::f64, -2.0, 2.0).set_requires_grad(true);
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    CHECK(test::gradcheck([d](const std::vector<Tensor>& in) { return softmax(in[0], d); }, {x}) == "");
    CHECK(test::gradcheck([d](const std::vector<Tensor>& in) { return log_softmax(in[0], d); }, {x}) == "");
  }
  // through a non-contiguous view
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0].permute({2, 0, 1}), 2); }, {x}) ==
        "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return log_softmax(in[0].transpose(0, 1), 0); }, {x}) ==
        "");
}

TEST_CASE("bf16 softmax stays within bf16 tolerance of the f64 result", "[softmax][dtype]") {
  const Tensor x = test::random_tensor({6, 13}, 14, DType::f64, -4.0, 4.0);
  const Tensor xb = x.to(DType::bf16);
  const Tensor yb = softmax(xb, 1);
  CHECK(yb.dtype() == DType::bf16);
  // reference on the bf16-rounded inputs; bf16 output rounding is at most 2^-9 relative
  CHECK(test::compare(yb, softmax(xb.to(DType::f64), 1), 1.0 / 256, 1e-6) == "");
  CHECK(test::compare(log_softmax(xb, 1), log_softmax(xb.to(DType::f64), 1), 1.0 / 256, 1e-3) == "");
  // gradient in bf16 follows the f64 gradient
  Tensor xr = xb.detach().set_requires_grad(true);
  sum(mul(softmax(xr, 1), arange(13, {DType::bf16}))).backward();
  CHECK(xr.grad().dtype() == DType::bf16);
  Tensor xd = xb.to(DType::f64).set_requires_grad(true);
  sum(mul(softmax(xd, 1), arange(13, {DType::f64}))).backward();
  CHECK(test::compare(xr.grad(), xd.grad(), 2e-2, 2e-2) == "");
}

TEST_CASE("softmax rejects integer input and bad dims", "[softmax][errors]") {
  const Tensor xi = from_vector(std::vector<int64_t>{1, 2, 3}, {3}, {DType::i64});
  CHECK_THROWS_WITH(softmax(xi, 0), HasSubstr("softmax") && HasSubstr("floating"));
  CHECK_THROWS_WITH(log_softmax(xi, 0), HasSubstr("log_softmax") && HasSubstr("floating"));
  const Tensor x = test::random_tensor({2, 3}, 1);
  CHECK_THROWS_WITH(softmax(x, 2), HasSubstr("dim 2 is out of range"));
}

TEST_CASE("cross_entropy matches a hand-computed value", "[cross_entropy]") {
  // logits [0, ln 3] -> p = [1/4, 3/4]; target 1 -> loss = -log(3/4)
  const Tensor logits = from_vector(std::vector<double>{0.0, std::log(3.0)}, {1, 2}, {DType::f32});
  const Tensor loss = cross_entropy(logits, targets({1}));
  CHECK(loss.dtype() == DType::f32);
  CHECK(loss.dim() == 0);
  CHECK(loss.item() == Approx(-std::log(0.75)).epsilon(1e-6));
  // label smoothing 0.2: 0.8 * -log(3/4) + 0.2 * mean(-log(1/4), -log(3/4))
  CrossEntropyOptions o;
  o.label_smoothing = 0.2;
  const double expected = 0.8 * -std::log(0.75) + 0.2 * 0.5 * (-std::log(0.25) - std::log(0.75));
  CHECK(cross_entropy(logits, targets({1}), o).item() == Approx(expected).epsilon(1e-6));
  // the gradient of the mean loss is softmax - onehot: [1/4, -1/4]
  Tensor lr = logits.detach().set_requires_grad(true);
  cross_entropy(lr, targets({1})).backward();
  CHECK(test::compare(lr.grad(), {0.25, -0.25}, 1e-6, 1e-7) == "");
}

TEST_CASE("cross_entropy matches a naive PyTorch-semantics reference", "[cross_entropy]") {
  const int64_t n = 6, c = 7;
  const Tensor logits = test::random_tensor({n, c}, 21, DType::f64, -3.0, 3.0);
  const auto xv = logits.to_vector<double>();
  const std::vector<int64_t> t = {3, 0, -100, 6, 2, 3};
  for (double ls : {0.0, 0.1, 1.0}) {
    INFO("label_smoothing " << ls);
    const RefCe ref = ref_cross_entropy(xv, n, c, t, -100, ls);
    double total = 0;
    for (double v : ref.rows) total += v;
    CrossEntropyOptions o;
    o.label_smoothing = ls;
    o.reduction = Reduction::none;
    const Tensor rows = cross_entropy(logits, targets(t), o);
    CHECK(rows.shape() == Shape{n});
    CHECK(rows.dtype() == DType::f64);
    CHECK(test::compare(rows, ref.rows, 1e-12, 1e-12) == "");
    CHECK(rows.to_vector<double>()[2] == 0.0);  // ignored row
    o.reduction = Reduction::sum;
    CHECK(cross_entropy(logits, targets(t), o).item() == Approx(total).epsilon(1e-12));
    o.reduction = Reduction::mean;  // divides by the 5 counted rows, not 6
    REQUIRE(ref.count == 5);
    CHECK(cross_entropy(logits, targets(t), o).item() == Approx(total / 5).epsilon(1e-12));
    // i32 targets give the same result
    CHECK(cross_entropy(logits, targets(t, DType::i32), o).item() == Approx(total / 5).epsilon(1e-12));
  }
  // a custom ignore_index, and a non-contiguous logits view
  const Tensor lt = test::random_tensor({c, n}, 22, DType::f64, -3.0, 3.0).transpose(0, 1);  // (N, C)
  REQUIRE_FALSE(lt.is_contiguous());
  const std::vector<int64_t> t2 = {1, 5, 5, 0, 6, 2};
  CrossEntropyOptions o;
  o.ignore_index = 5;
  o.label_smoothing = 0.05;
  o.reduction = Reduction::none;
  const RefCe ref = ref_cross_entropy(lt.contiguous().to_vector<double>(), n, c, t2, 5, 0.05);
  CHECK(test::compare(cross_entropy(lt, targets(t2), o), ref.rows, 1e-12, 1e-12) == "");
}

TEST_CASE("cross_entropy with every row ignored: mean is NaN, sum is 0", "[cross_entropy]") {
  const Tensor logits = test::random_tensor({3, 4}, 23);
  const Tensor t = targets({-100, -100, -100});
  CHECK(std::isnan(cross_entropy(logits, t).item()));
  CrossEntropyOptions o;
  o.reduction = Reduction::sum;
  CHECK(cross_entropy(logits, t, o).item() == 0.0);
  // its gradient is zero (nothing counted)
  Tensor lr = logits.detach().set_requires_grad(true);
  cross_entropy(lr, t, o).backward();
  CHECK(test::compare(lr.grad(), std::vector<double>(12, 0.0), 0, 0) == "");
}

TEST_CASE("cross_entropy gradients pass the finite-difference check", "[cross_entropy][gradcheck]") {
  Tensor x = test::random_tensor({5, 7}, 24, DType::f64, -2.0, 2.0).set_requires_grad(true);
  const Tensor t = targets({6, -100, 0, 3, 3});
  for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum})
    for (double ls : {0.0, 0.3}) {
      INFO("reduction " << static_cast<int>(red) << " label_smoothing " << ls);
      CrossEntropyOptions o;
      o.reduction = red;
      o.label_smoothing = ls;
      CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, o); }, {x}) == "");
    }
  // through a non-contiguous view: the parameter is (C, N) and the op sees its transpose
  Tensor xt = test::random_tensor({7, 5}, 25, DType::f64, -2.0, 2.0).set_requires_grad(true);
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0].transpose(0, 1), t, o); },
                        {xt}) == "");
  // the ignored row gets exactly zero gradient
  Tensor xr = x.detach().clone().set_requires_grad(true);
  cross_entropy(xr, t, o).backward();
  const auto g = xr.grad().to_vector<double>();
  for (int k = 0; k < 7; ++k) CHECK(g[static_cast<std::size_t>(7 + k)] == 0.0);
}

TEST_CASE("cross_entropy on bf16 logits returns an f32 loss close to the f64 one", "[cross_entropy][dtype]") {
  const Tensor logits = test::random_tensor({9, 13}, 26, DType::f64, -4.0, 4.0);
  const Tensor lb = logits.to(DType::bf16);
  const Tensor t = targets({0, 12, 5, 5, 7, -100, 1, 2, 3});
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  const Tensor loss_b = cross_entropy(lb, t, o);
  CHECK(loss_b.dtype() == DType::f32);
  // same bf16-rounded inputs in f64: only f32 rounding separates them
  CHECK(loss_b.item() == Approx(cross_entropy(lb.to(DType::f64), t, o).item()).epsilon(1e-6));
  // and the unrounded f64 logits: bf16 input rounding (2^-9 relative) bounds the difference
  CHECK(std::abs(loss_b.item() - cross_entropy(logits, t, o).item()) < 0.05);
  Tensor lr = lb.detach().set_requires_grad(true);
  cross_entropy(lr, t, o).backward();
  CHECK(lr.grad().dtype() == DType::bf16);
  Tensor ld = lb.to(DType::f64).set_requires_grad(true);
  cross_entropy(ld, t, o).backward();
  CHECK(test::compare(lr.grad(), ld.grad(), 1e-2, 1e-4) == "");
}

TEST_CASE("cross_entropy reports bad targets and shapes", "[cross_entropy][errors]") {
  const Tensor logits = test::random_tensor({3, 7}, 27);
  CHECK_THROWS_WITH(cross_entropy(logits, targets({0, 1, 7})),
                    HasSubstr("target[2] = 7") && HasSubstr("out of range for 7 classes"));
  CHECK_THROWS_WITH(cross_entropy(logits, targets({0, -1, 2})), HasSubstr("target[1] = -1"));
  CrossEntropyOptions o;
  o.ignore_index = 9;  // -100 is no longer ignored
  CHECK_THROWS_WITH(cross_entropy(logits, targets({0, -100, 2}), o), HasSubstr("target[1] = -100"));
  // On the CPU a deferred check still throws in the call (only CUDA defers), and the check is a no-op.
  CrossEntropyOptions deferred;
  deferred.target_check = TargetCheck::deferred;
  CHECK_THROWS_WITH(cross_entropy(logits, targets({0, 1, 7}), deferred), HasSubstr("target[2] = 7"));
  CHECK_NOTHROW(check_deferred_targets(Device::cpu()));
  CHECK(cross_entropy(logits, targets({0, 1, 2}), deferred).item() ==
        cross_entropy(logits, targets({0, 1, 2})).item());
  CHECK_THROWS_WITH(cross_entropy(logits, targets({0, 1})), HasSubstr("expected target of shape (3)"));
  CHECK_THROWS_WITH(cross_entropy(logits, test::random_tensor({3}, 1)), HasSubstr("i32 or i64"));
  CHECK_THROWS_WITH(cross_entropy(test::random_tensor({3, 7, 2}, 1), targets({0, 1, 2})),
                    HasSubstr("expected logits of shape (N, C)"));
  o = {};
  o.label_smoothing = 1.5;
  CHECK_THROWS_WITH(cross_entropy(logits, targets({0, 1, 2}), o), HasSubstr("label_smoothing must be in [0, 1]"));
}
