// max (along a dim and over all elements) and argmax: naive references, ties, NaN, integer dtypes,
// non-contiguous inputs, gradient routing to the first maximal element, and errors.
#include <cmath>
#include <limits>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

struct RefMax {
  std::vector<double> values;
  std::vector<int64_t> indices;
};

// Naive first-maximum over `dim` of a row-major tensor of shape `s` (NaN is maximal).
RefMax ref_max(const std::vector<double>& x, const Shape& s, int dim) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= s[i];
  for (int i = dim + 1; i < s.size(); ++i) inner *= s[i];
  RefMax r;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < s[dim]; ++j) {
        const double v = x[static_cast<std::size_t>((o * s[dim] + j) * inner + i)];
        const double b = x[static_cast<std::size_t>((o * s[dim] + best) * inner + i)];
        if (std::isnan(b)) break;
        if (std::isnan(v) || v > b) best = j;
      }
      r.indices.push_back(best);
      r.values.push_back(x[static_cast<std::size_t>((o * s[dim] + best) * inner + i)]);
    }
  return r;
}

Shape without(const Shape& s, int dim) {
  Shape out = s;
  out.erase(dim);
  return out;
}

}  // namespace

TEST_CASE("max and argmax match a naive reference along every dim", "[max]") {
  const Tensor x = test::random_tensor({4, 7, 5}, 61);
  const auto xv = x.to_vector<double>();
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    const RefMax ref = ref_max(xv, x.shape(), d);
    const Tensor m = max(x, d);
    const Tensor a = argmax(x, d);
    CHECK(m.shape() == without(x.shape(), d));
    CHECK(a.shape() == without(x.shape(), d));
    CHECK(a.dtype() == DType::i64);
    CHECK(test::compare(m, ref.values, 0, 0) == "");
    CHECK(a.to_vector<int64_t>() == ref.indices);
    Shape ks = x.shape();
    ks[d] = 1;
    CHECK(max(x, d, KeepDim::yes).shape() == ks);
    CHECK(argmax(x, d, KeepDim::yes).shape() == ks);
    CHECK(argmax(x, d, KeepDim::yes).to_vector<int64_t>() == ref.indices);
  }
  CHECK(test::compare(max(x, -1), ref_max(xv, x.shape(), 2).values, 0, 0) == "");
  // all elements
  double best = -1e300;
  for (double v : xv) best = std::max(best, v);
  CHECK(max(x).dim() == 0);
  CHECK(max(x).item() == best);
}

TEST_CASE("max and argmax read non-contiguous input", "[max]") {
  const Tensor base = test::random_tensor({5, 3, 7}, 62);
  const Tensor xt = base.permute({2, 0, 1});  // (7, 5, 3)
  REQUIRE_FALSE(xt.is_contiguous());
  const auto xv = xt.contiguous().to_vector<double>();
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    const RefMax ref = ref_max(xv, xt.shape(), d);
    CHECK(test::compare(max(xt, d), ref.values, 0, 0) == "");
    CHECK(argmax(xt, d).to_vector<int64_t>() == ref.indices);
  }
  const Tensor sl = slice(base, 2, 0, 7, 3);  // (5, 3, 3)
  CHECK(argmax(sl, 0).to_vector<int64_t>() == ref_max(sl.contiguous().to_vector<double>(), sl.shape(), 0).indices);
  CHECK(max(xt).item() == max(base).item());
}

TEST_CASE("ties pick the first index and NaN counts as maximal", "[max]") {
  const Tensor t = from_vector(std::vector<double>{3, 1, 3, -2, 5, 3}, {2, 3}, {DType::f64});
  CHECK(argmax(t, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK(argmax(t, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor n = from_vector(std::vector<double>{1, nan, 5, nan, 7, 2, 3, 4}, {2, 4}, {DType::f32});
  CHECK(argmax(n, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  const auto mv = max(n, 1).to_vector<double>();
  CHECK(std::isnan(mv[0]));
  CHECK(mv[1] == 7.0);
  CHECK(std::isnan(max(n).item()));
  CHECK(argmax(n, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0});
}

TEST_CASE("max and argmax work on integer tensors and 0-d tensors", "[max]") {
  const std::vector<int64_t> v = {4, -9, 12, 12, 0, -3, 7, 1, 1};
  for (DType dt : {DType::i64, DType::i32}) {
    const Tensor x = from_vector(v, {3, 3}, {dt});
    const Tensor m = max(x, 1);
    CHECK(m.dtype() == dt);
    CHECK(m.to_vector<int64_t>() == std::vector<int64_t>{12, 12, 7});
    CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{2, 0, 0});
    CHECK(max(x).item() == 12.0);
  }
  // values beyond 2^53 are compared exactly in i64
  const int64_t big = (int64_t{1} << 60);
  const Tensor b = from_vector(std::vector<int64_t>{big + 1, big + 2, big}, {3}, {DType::i64});
  CHECK(argmax(b, 0).item() == 1.0);
  const Tensor s = scalar_tensor(2.5, {DType::f64});
  CHECK(max(s, 0).item() == 2.5);
  CHECK(argmax(s, -1).item() == 0.0);
  CHECK(max(s).item() == 2.5);
}

TEST_CASE("max gradient goes to the first maximal element only", "[max][gradcheck]") {
  Tensor t = from_vector(std::vector<double>{3, 1, 3, -2, 5, 3}, {2, 3}, {DType::f64, Device::cpu(), true});
  max(t, 1).backward(from_vector(std::vector<double>{10, 20}, {2}, {DType::f64}));
  CHECK(test::compare(t.grad(), {10, 0, 0, 0, 20, 0}, 0, 0) == "");
  t.zero_grad();
  max(t, 0, KeepDim::yes).backward(ones({1, 3}, {DType::f64}));
  CHECK(test::compare(t.grad(), {1, 0, 1, 0, 1, 0}, 0, 0) == "");
  t.zero_grad();
  max(t).backward();
  CHECK(test::compare(t.grad(), {0, 0, 0, 0, 1, 0}, 0, 0) == "");
  // through a non-contiguous view, all-element max
  t.zero_grad();
  max(t.transpose(0, 1)).backward();
  CHECK(test::compare(t.grad(), {0, 0, 0, 0, 1, 0}, 0, 0) == "");
}

TEST_CASE("max gradients pass the finite-difference check", "[max][gradcheck]") {
  Tensor x = test::random_tensor({4, 7, 5}, 63).set_requires_grad(true);  // continuous values: no ties
  using In = const std::vector<Tensor>&;
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    CHECK(test::gradcheck([d](In in) { return max(in[0], d); }, {x}) == "");
    CHECK(test::gradcheck([d](In in) { return max(in[0], d, KeepDim::yes); }, {x}) == "");
  }
  CHECK(test::gradcheck([](In in) { return max(in[0].permute({2, 0, 1}), 1); }, {x}) == "");
  CHECK(test::gradcheck([](In in) { return max(in[0]); }, {x}) == "");
  CHECK(test::gradcheck([](In in) { return max(in[0].transpose(0, 2)); }, {x}) == "");
}

TEST_CASE("bf16 max equals the max of the bf16-rounded values", "[max][dtype]") {
  const Tensor x = test::random_tensor({6, 13}, 64, DType::f64, -10.0, 10.0);
  const Tensor xb = x.to(DType::bf16);
  const Tensor mb = max(xb, 1);
  CHECK(mb.dtype() == DType::bf16);
  CHECK(test::compare(mb, max(xb.to(DType::f64), 1), 0, 0) == "");
  // and is within bf16 rounding (2^-9 relative) of the f64 max
  CHECK(test::compare(mb, max(x, 1), 1.0 / 256, 0) == "");
  CHECK(argmax(xb.to(DType::f32), 1).to_vector<int64_t>() == argmax(xb, 1).to_vector<int64_t>());
}

TEST_CASE("max and argmax report bad dims and empty reductions", "[max][errors]") {
  const Tensor x = test::random_tensor({2, 3}, 65);
  CHECK_THROWS_WITH(max(x, 2), HasSubstr("max: dim 2 is out of range"));
  CHECK_THROWS_WITH(argmax(x, -3), HasSubstr("argmax: dim -3 is out of range"));
  const Tensor e = zeros({2, 0}, {DType::f64});
  CHECK_THROWS_WITH(max(e, 1), HasSubstr("max: cannot reduce dim 1 of size 0"));
  CHECK_THROWS_WITH(argmax(e, 1), HasSubstr("argmax: cannot reduce dim 1 of size 0"));
  CHECK_THROWS_WITH(max(e), HasSubstr("max: cannot take the max of an empty tensor"));
}
