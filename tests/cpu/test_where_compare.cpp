// Comparisons (broadcasting, dtype promotion, NaN), where / masked_fill (values, broadcasting, gradients),
// and the copy family: copy_, contiguous, clone, to(dtype) over non-contiguous and broadcast sources.
#include <cmath>
#include <functional>
#include <limits>

#include "hadatrain/autograd/engine.h"
#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

std::vector<int64_t> bools(const Tensor& t) {
  REQUIRE(t.dtype() == DType::b8);
  return t.to_vector<int64_t>();
}

}  // namespace

TEST_CASE("comparisons broadcast and match the reference", "[compare]") {
  Tensor a = test::random_tensor({3, 1}, 1, DType::f64, -1, 1);
  Tensor b = test::random_tensor({4}, 2, DType::f64, -1, 1);
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  using Ref = std::function<bool(double, double)>;
  const std::vector<std::pair<Cmp, Ref>> ops = {
      {[](const Tensor& x, const Tensor& y) { return eq(x, y); }, [](double x, double y) { return x == y; }},
      {[](const Tensor& x, const Tensor& y) { return ne(x, y); }, [](double x, double y) { return x != y; }},
      {[](const Tensor& x, const Tensor& y) { return lt(x, y); }, [](double x, double y) { return x < y; }},
      {[](const Tensor& x, const Tensor& y) { return le(x, y); }, [](double x, double y) { return x <= y; }},
      {[](const Tensor& x, const Tensor& y) { return gt(x, y); }, [](double x, double y) { return x > y; }},
      {[](const Tensor& x, const Tensor& y) { return ge(x, y); }, [](double x, double y) { return x >= y; }},
  };
  // Make a few entries equal so eq / le / ge see ties.
  Tensor bt = from_vector(std::vector<double>{bv[0], av[1], bv[2], av[0]}, {4}, {DType::f64});
  const auto btv = bt.to_vector<double>();
  for (std::size_t k = 0; k < ops.size(); ++k) {
    INFO("op " << k);
    Tensor r = ops[k].first(a, bt);
    CHECK(r.shape() == Shape{3, 4});
    std::vector<int64_t> expect;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) expect.push_back(ops[k].second(av[i], btv[j]));
    CHECK(bools(r) == expect);
    // Non-contiguous operands: compare a transposed (4, 3) grid with its contiguous copy.
    Tensor grid = test::random_tensor({3, 4}, 3 + k).transpose(0, 1);
    Tensor other = test::random_tensor({4, 3}, 10 + k);
    CHECK(bools(ops[k].first(grid, other)) == bools(ops[k].first(grid.contiguous(), other)));
  }
  // Ties really occurred.
  CHECK(bools(eq(a, bt))[1 * 4 + 1] == 1);
  CHECK(bools(eq(a, bt))[0 * 4 + 3] == 1);
}

TEST_CASE("comparisons promote dtypes and treat NaN like IEEE", "[compare]") {
  Tensor i = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}, {DType::i32});
  Tensor f = from_vector(std::vector<double>{1.0, 2.5, 2.9, 4.0}, {4}, {DType::f64});
  // Compared as f64: 2 < 2.5 and 3 > 2.9 (an integer comparison would truncate 2.5 and 2.9 to 2).
  CHECK(bools(eq(i, f)) == std::vector<int64_t>{1, 0, 0, 1});
  CHECK(bools(lt(i, f)) == std::vector<int64_t>{0, 1, 0, 0});
  CHECK(bools(gt(i, f)) == std::vector<int64_t>{0, 0, 1, 0});
  // Scalar forms compare in the tensor's dtype.
  CHECK(bools(eq(f, 2.5)) == std::vector<int64_t>{0, 1, 0, 0});
  CHECK(bools(lt(f, 2.9)) == std::vector<int64_t>{1, 1, 0, 0});
  CHECK(bools(gt(i, 2.0)) == std::vector<int64_t>{0, 0, 1, 1});
  // bf16 against f32 compares in f32.
  Tensor h = from_vector(std::vector<double>{1.0, 1.00390625}, {2}, {DType::bf16});  // 1 + 2^-8 rounds to 1
  CHECK(bools(eq(h, from_vector(std::vector<double>{1.0, 1.0}, {2}, {DType::f32}))) == std::vector<int64_t>{1, 1});
  // Bool tensors compare as numbers.
  Tensor t = from_vector(std::vector<int64_t>{1, 0}, {2}, {DType::b8});
  CHECK(bools(gt(t, from_vector(std::vector<int64_t>{0, 0}, {2}, {DType::b8}))) == std::vector<int64_t>{1, 0});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor n = from_vector(std::vector<double>{nan, 1.0}, {2}, {DType::f64});
  CHECK(bools(eq(n, n)) == std::vector<int64_t>{0, 1});
  CHECK(bools(ne(n, n)) == std::vector<int64_t>{1, 0});
  CHECK(bools(le(n, n)) == std::vector<int64_t>{0, 1});
  CHECK(bools(gt(n, 0.0)) == std::vector<int64_t>{0, 1});
  CHECK_THROWS_WITH(eq(zeros({2, 3}), zeros({4})), HasSubstr("(2, 3)"));
}

TEST_CASE("where selects with broadcasting and dtype promotion", "[where]") {
  Tensor cond = from_vector(std::vector<int64_t>{1, 0, 1}, {3, 1}, {DType::b8});
  Tensor a = test::random_tensor({1, 4}, 5, DType::f32);
  Tensor b = from_vector(std::vector<double>{7.0}, {}, {DType::f64});
  Tensor out = where(cond, a, b);
  CHECK(out.dtype() == DType::f64);
  CHECK(out.shape() == Shape{3, 4});
  const auto av = a.to_vector<double>();
  std::vector<double> expect;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) expect.push_back(r != 1 ? av[c] : 7.0);
  CHECK(test::compare(out, expect, 0, 0) == "");
  // Integer and float branches promote to float; non-contiguous condition and operands.
  Tensor x = test::random_tensor({4, 3}, 6);
  Tensor m = gt(x, 0.0).transpose(0, 1);  // (3, 4) bool view
  Tensor y = arange(12, {DType::i32}).reshape({4, 3}).transpose(0, 1);
  Tensor w = where(m, x.transpose(0, 1), y);
  CHECK(w.dtype() == DType::f64);
  const auto xv = x.to_vector<double>();
  std::vector<double> expect2;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) {
      const double xval = xv[c * 3 + r];
      expect2.push_back(xval > 0 ? xval : static_cast<double>(c * 3 + r));
    }
  CHECK(test::compare(w, expect2, 0, 0) == "");
  CHECK_THROWS_WITH(where(x, x, x), HasSubstr("condition must be bool"));
  CHECK_THROWS_WITH(where(cond, zeros({2, 4}), b), HasSubstr("where"));
}

TEST_CASE("masked_fill writes the value where the mask is true", "[where]") {
  Tensor x = test::random_tensor({2, 3, 4}, 8);
  Tensor mask = from_vector(std::vector<int64_t>{0, 1, 0, 1}, {4}, {DType::b8});  // broadcast over (2, 3)
  Tensor y = masked_fill(x, mask, -1e9);
  CHECK(y.shape() == x.shape());
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == (i % 4 % 2 == 1 ? -1e9 : xv[i]));
  // Causal-mask style with -inf on an f32 tensor keeps the dtype.
  Tensor s = test::random_tensor({3, 3}, 9, DType::f32);
  Tensor upper = gt(arange(3, {DType::i64}).reshape({1, 3}), arange(3, {DType::i64}).reshape({3, 1}));
  Tensor sm = masked_fill(s, upper, -std::numeric_limits<double>::infinity());
  CHECK(sm.dtype() == DType::f32);
  const auto smv = sm.to_vector<double>();
  CHECK((std::isinf(smv[1]) && smv[1] < 0));
  CHECK(smv[3] == s.to_vector<double>()[3]);
  CHECK_THROWS_WITH(masked_fill(zeros({4}), from_vector(std::vector<int64_t>{1, 0, 1, 0, 1, 0, 1, 0}, {2, 4},
                                                          {DType::b8}),
                                0.0),
                    HasSubstr("does not broadcast"));
}

TEST_CASE("where and masked_fill gradients flow to the selected side", "[where][gradcheck]") {
  Tensor cond = gt(test::random_tensor({3, 4}, 11), 0.0);
  Tensor a = test::random_tensor({3, 4}, 12).set_requires_grad(true);
  Tensor b = test::random_tensor({1, 4}, 13).set_requires_grad(true);  // broadcast: gradient summed over rows
  CHECK(test::gradcheck([cond](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {a, b}) == "");
  CHECK(test::gradcheck(
            [cond](const std::vector<Tensor>& in) { return where(cond.transpose(0, 1), in[0].transpose(0, 1), in[1].transpose(0, 1)); },
            {a, b}) == "");
  CHECK(test::gradcheck([cond](const std::vector<Tensor>& in) { return masked_fill(in[0], cond, 3.0); }, {a}) == "");
  // Exact values: d/da sum(where) = cond, d/db = number of false rows per column.
  const auto g = grad({sum(where(cond, a, b))}, {a, b});
  const auto cv = cond.to_vector<int64_t>();
  std::vector<double> ga, gb(4, 0.0);
  for (std::size_t i = 0; i < cv.size(); ++i) {
    ga.push_back(cv[i] ? 1.0 : 0.0);
    if (!cv[i]) gb[i % 4] += 1.0;
  }
  CHECK(test::compare(g[0], ga, 0, 0) == "");
  CHECK(test::compare(g[1], gb, 0, 0) == "");
  // Gradients return in each input's dtype after promotion.
  Tensor af = test::random_tensor({3, 4}, 14, DType::f32).set_requires_grad(true);
  const auto g2 = grad({sum(where(cond, af, b))}, {af, b});
  CHECK(g2[0].dtype() == DType::f32);
  CHECK(g2[1].dtype() == DType::f64);
}

TEST_CASE("copy_ converts and broadcasts into strided destinations", "[copy]") {
  // Destination: a transposed view of a (4, 3) f32 buffer; source: an f64 (4) broadcast to (3, 4).
  Tensor buf = zeros({4, 3}, {DType::f32});
  Tensor dst = buf.transpose(0, 1);  // (3, 4)
  Tensor src = from_vector(std::vector<double>{0.5, -1.25, 3.0, 1e10}, {4}, {DType::f64});
  copy_(dst, src);
  const auto bv = buf.to_vector<double>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) CHECK(bv[r * 3 + c] == static_cast<double>(static_cast<float>(src.to_vector<double>()[r])));
  // Into an integer slice: truncation toward zero, saturation, NaN -> 0.
  Tensor ibuf = zeros({2, 6}, {DType::i8});
  Tensor islice = slice(ibuf, 1, 0, 6, 2);  // (2, 3), stride 2
  copy_(islice, from_vector(std::vector<double>{-2.7, 2.7, 1000.0, -1000.0, std::nan(""), 0.4}, {2, 3}, {DType::f64}));
  CHECK(ibuf.to_vector<int64_t>() == std::vector<int64_t>{-2, 0, 2, 0, 127, 0, -128, 0, 0, 0, 0, 0});
  CHECK_THROWS_WITH(copy_(zeros({3}), zeros({4})), HasSubstr("copy_"));
  CHECK_THROWS_WITH(copy_(zeros({3}), zeros({2, 3})), HasSubstr("cannot be broadcast"));
  Tensor leaf = zeros({3}, {DType::f64}).set_requires_grad(true);
  CHECK_THROWS_WITH(copy_(leaf, zeros({3})), HasSubstr("requires grad"));
}

TEST_CASE("contiguous, clone and to(dtype) handle views and broadcast sources", "[copy]") {
  Tensor x = arange(24, {DType::f64}).reshape({2, 3, 4});
  CHECK(x.contiguous().is_same(x));  // already contiguous: no copy
  Tensor p = x.permute({2, 0, 1});   // (4, 2, 3)
  Tensor pc = p.contiguous();
  CHECK(pc.is_contiguous());
  CHECK(pc.storage() != x.storage());
  std::vector<double> expect;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) expect.push_back(i * 12 + j * 4 + k);
  CHECK(test::compare(pc, expect, 0, 0) == "");
  // clone copies even contiguous tensors; writes to the clone do not reach the original.
  Tensor c = x.clone();
  CHECK(c.storage() != x.storage());
  fill_(c, 5.0);
  CHECK(x.to_vector<double>()[3] == 3.0);
  // A broadcast (stride 0) source materialises.
  Tensor e = from_vector(std::vector<double>{1, 2, 3}, {3, 1}, {DType::f64}).expand({3, 4});
  CHECK(e.contiguous().to_vector<double>() == std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK(e.clone().strides() == Strides{4, 1});
  // to(dtype) over a non-contiguous source, with rounding per the conversion rules.
  Tensor v = from_vector(std::vector<double>{1.00390625, 1.01171875, -2.5, 65504.0, 1e6, 0.1}, {3, 2}, {DType::f64});
  Tensor vt = v.transpose(0, 1);  // (2, 3): 1.0039, -2.5, 1e6 / 1.0117, 65504, 0.1
  CHECK(test::compare(vt.to(DType::bf16), std::vector<double>{1.0, -2.5, 999424.0, 1.015625, 65536.0, 0.10009765625},
                      0, 0) == "");  // ties to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6
  const auto f16v = vt.to(DType::f16).to_vector<double>();
  CHECK(f16v[4] == 65504.0);
  CHECK(std::isinf(f16v[2]));  // 1e6 overflows f16
  CHECK(vt.to(DType::i32).to_vector<int64_t>() == std::vector<int64_t>{1, -2, 1000000, 1, 65504, 0});
  CHECK(vt.to(DType::b8).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1, 1, 1});
  CHECK(x.to(DType::f64).is_same(x));
  // Packed int4: round to nearest, clamp to [-8, 7].
  Tensor q = from_vector(std::vector<double>{-9.0, -8.0, 3.7, 7.0, 8.0}, {5}, {DType::f64}).to(DType::i4x2);
  CHECK(q.to_vector<int64_t>() == std::vector<int64_t>{-8, -8, 4, 7, 7});
}

TEST_CASE("copy-family gradients", "[copy][gradcheck]") {
  Tensor x = test::random_tensor({3, 4}, 21).set_requires_grad(true);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return in[0].transpose(0, 1).contiguous(); }, {x}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return mul(in[0].clone(), in[0]); }, {x}) == "");
  // to(dtype) returns the gradient in the source dtype.
  Tensor y = x.to(DType::f32);
  const auto g = grad({sum(mul(y, y))}, {x});
  CHECK(g[0].dtype() == DType::f64);
  CHECK(test::compare(g[0], mul(x.to(DType::f32).to(DType::f64), 2.0), 1e-12, 0) == "");
  CHECK_THROWS_WITH(x.to(DType::i32), HasSubstr("requires grad"));
}
