// cat and stack: values against index arithmetic (incl. non-contiguous inputs and negative dims), dtype
// promotion across inputs, gradients (gradcheck and dtype of returned gradients), errors naming the input.
#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

namespace {
Tensor rand_t(const Shape& s, uint64_t seed, DType dt = DType::f64) { return test::random_tensor(s, seed, dt); }
}  // namespace

TEST_CASE("cat joins along any dim, reading non-contiguous inputs", "[cat]") {
  Tensor a = rand_t({2, 3, 4}, 1), b = rand_t({2, 5, 4}, 2);
  Tensor c = rand_t({4, 1, 2}, 3).permute({2, 1, 0});  // (2, 1, 4), non-contiguous
  Tensor y = cat({a, b, c}, 1);
  REQUIRE(y.shape() == Shape{2, 9, 4});
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), cv = c.contiguous().to_vector<double>();
  std::vector<double> expect;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) expect.push_back(av[static_cast<std::size_t>((i * 3 + j) * 4 + k)]);
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 4; ++k) expect.push_back(bv[static_cast<std::size_t>((i * 5 + j) * 4 + k)]);
    for (int k = 0; k < 4; ++k) expect.push_back(cv[static_cast<std::size_t>(i * 4 + k)]);
  }
  CHECK(test::compare(y, expect, 0, 0) == "");
  CHECK(test::compare(cat({a, b, c}, -2), expect, 0, 0) == "");
  // dim 0 is plain concatenation of the flat values; a single input is a copy.
  Tensor z = cat({a, a.transpose(0, 0)}, 0);
  std::vector<double> twice = av;
  twice.insert(twice.end(), av.begin(), av.end());
  CHECK(test::compare(z, twice, 0, 0) == "");
  Tensor one = cat({a}, 2);
  CHECK(test::compare(one, av, 0, 0) == "");
  CHECK(one.storage() != a.storage());
  // Zero-size pieces are allowed.
  CHECK(cat({a, zeros({2, 0, 4}, {DType::f64})}, 1).shape() == a.shape());
}

TEST_CASE("cat promotes dtypes across all inputs", "[cat][dtype]") {
  Tensor f = from_vector(std::vector<double>{1.5, -2.25}, {2}, {DType::f32});
  Tensor h = from_vector(std::vector<double>{3.0}, {1}, {DType::bf16});
  Tensor i = from_vector(std::vector<int64_t>{7, 8}, {2}, {DType::i32});
  Tensor l = from_vector(std::vector<int64_t>{9}, {1}, {DType::i64});
  Tensor y = cat({h, f, i}, 0);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.to_vector<double>() == std::vector<double>{3.0, 1.5, -2.25, 7, 8});
  CHECK(cat({h, i}, 0).dtype() == DType::bf16);
  CHECK(cat({i, l}, 0).dtype() == DType::i64);
  CHECK(cat({i, l}, 0).to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9});
  CHECK(cat({h, h.to(DType::f16)}, 0).dtype() == DType::f32);  // bf16 with f16 gives f32
  CHECK(stack({f, f.to(DType::f64)}, 0).dtype() == DType::f64);
}

TEST_CASE("stack adds a new dim at any position", "[cat][stack]") {
  Tensor a = rand_t({2, 3}, 4), b = rand_t({3, 2}, 5).transpose(0, 1);
  const auto av = a.to_vector<double>(), bv = b.contiguous().to_vector<double>();
  Tensor s0 = stack({a, b}, 0);
  REQUIRE(s0.shape() == Shape{2, 2, 3});
  std::vector<double> e0 = av;
  e0.insert(e0.end(), bv.begin(), bv.end());
  CHECK(test::compare(s0, e0, 0, 0) == "");
  Tensor s2 = stack({a, b}, -1);
  REQUIRE(s2.shape() == Shape{2, 3, 2});
  std::vector<double> e2;
  for (std::size_t k = 0; k < av.size(); ++k) {
    e2.push_back(av[k]);
    e2.push_back(bv[k]);
  }
  CHECK(test::compare(s2, e2, 0, 0) == "");
  CHECK(stack({a, b, a}, 1).shape() == Shape{2, 3, 3});
  CHECK(stack({scalar_tensor(1.0, {DType::f64}), scalar_tensor(2.0, {DType::f64})}, 0).to_vector<double>() ==
        std::vector<double>{1, 2});
}

TEST_CASE("cat and stack gradients", "[cat][gradcheck]") {
  Tensor a = rand_t({2, 3}, 6).set_requires_grad(true), b = rand_t({2, 4}, 7).set_requires_grad(true);
  Tensor c = rand_t({3, 2}, 8).set_requires_grad(true);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2].transpose(0, 1)}, 1); },
                        {a, b, c}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return cat({in[0].transpose(0, 1), in[2]}, 0); },
                        {a, b, c}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return stack({in[0], in[1].transpose(0, 1)}, 1); },
                        {a, c}) == "");
  // Each input receives exactly its slice of the gradient, in its own dtype; inputs without grad get none.
  Tensor p = from_vector(std::vector<double>{1, 2}, {2}, {DType::bf16, Device::cpu(), true});
  Tensor q = from_vector(std::vector<double>{3, 4, 5}, {3}, {DType::f32, Device::cpu(), true});
  Tensor r = from_vector(std::vector<double>{6}, {1}, {DType::f32});
  Tensor y = cat({p, r, q}, 0);  // f32 (6)
  Tensor gy = from_vector(std::vector<double>{10, 20, 30, 40, 50, 60}, {6}, {DType::f32});
  auto g = grad({y}, {p, q}, {gy});
  CHECK(g[0].dtype() == DType::bf16);
  CHECK(g[0].to_vector<double>() == std::vector<double>{10, 20});
  CHECK(g[1].dtype() == DType::f32);
  CHECK(g[1].to_vector<double>() == std::vector<double>{40, 50, 60});
}

TEST_CASE("cat and stack errors name the offending input", "[cat][errors]") {
  Tensor a = rand_t({2, 3}, 9), b = rand_t({2, 4}, 10);
  CHECK_THROWS_WITH(cat({}, 0), HasSubstr("at least one tensor"));
  CHECK_THROWS_WITH(cat({a, a, b}, 0), HasSubstr("input 2") && HasSubstr("in dim 1"));
  CHECK_THROWS_WITH(cat({a, rand_t({2, 3, 1}, 11)}, 1), HasSubstr("input 1") && HasSubstr("has 3 dims"));
  CHECK_THROWS_WITH(cat({a, b}, 2), HasSubstr("out of range"));
  CHECK_THROWS_WITH(cat({scalar_tensor(1.0), scalar_tensor(2.0)}, 0), HasSubstr("use stack"));
  CHECK_THROWS_WITH(cat({a, Tensor()}, 0), HasSubstr("input 1 is an undefined tensor"));
  CHECK_THROWS_WITH(stack({a, a, b}, 0), HasSubstr("input 2") && HasSubstr("different shape"));
  CHECK_THROWS_WITH(stack({a, a}, 3), HasSubstr("out of range"));
  CHECK_THROWS_WITH(stack({}, 0), HasSubstr("at least one tensor"));
}
