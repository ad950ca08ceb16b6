// View ops: reshape/view stride logic, permute/transpose/slice/select/expand, and their gradients.
#include <numeric>
#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

TEST_CASE("views share storage and index correctly", "[views]") {
  Tensor x = arange(24, {DType::f64}).reshape({2, 3, 4});
  Tensor t = x.transpose(0, 2);  // (4, 3, 2)
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.storage() == x.storage());
  CHECK_FALSE(t.is_contiguous());
  const auto tv = t.contiguous().to_vector<double>();
  CHECK(tv[0 * 6 + 1 * 2 + 1] == 1 * 12 + 1 * 4 + 0);  // t[0][1][1] = x[1][1][0]
  Tensor s = slice(x, 2, 1, 4, 2);                     // columns 1 and 3
  CHECK(s.contiguous().to_vector<double>() == std::vector<double>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
  CHECK(select(x, 1, -1).to_vector<double>() == std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23});
  CHECK(x.reshape({6, -1}).shape() == Shape{6, 4});
  CHECK(x.unsqueeze(0).shape() == Shape{1, 2, 3, 4});
  CHECK(x.unsqueeze(-1).squeeze(-1).shape() == x.shape());
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  Tensor e = from_vector(std::vector<double>{1, 2, 3}, {3, 1}).expand({3, 4});
  CHECK(e.strides()[1] == 0);
  CHECK(e.contiguous().to_vector<double>()[5] == 2);
}

TEST_CASE("an in-place write raises its storage's version, seen through every view", "[views]") {
  // Note [Storage versions] (tensor/allocator.h)
  Tensor t = zeros({4, 6});
  const Tensor view = narrow(t, 0, 1, 2);
  CHECK(storage_version(Tensor{}) == 0);
  uint64_t v = storage_version(t);  // zeros() filled it
  auto raised = [&] {
    const uint64_t now = storage_version(t);
    const bool up = now > v && storage_version(view) == now;
    v = now;
    return up;
  };
  copy_(view, ones({2, 6}));
  CHECK(raised());
  fill_(t, 2.0);
  CHECK(raised());
  add_(view, ones({2, 6}));
  CHECK(raised());
  mul_(t, 3.0);
  CHECK(raised());
  mark_written(view);
  CHECK(raised());
  (void)add(t, t);  // reading t, writing a new tensor: t's version stays
  (void)t.clone();
  CHECK(storage_version(t) == v);
}

TEST_CASE("reshape views when it can and copies when it must; view refuses to copy", "[views]") {
  Tensor x = arange(24, {DType::f64}).reshape({2, 3, 4});
  Tensor merged = x.reshape({6, 4});
  CHECK(merged.storage() == x.storage());
  Tensor split = x.reshape({2, 3, 2, 2});
  CHECK(split.storage() == x.storage());
  Tensor t = x.transpose(1, 2);  // (2, 4, 3) non-contiguous
  Tensor r = t.reshape({2, 12});
  CHECK(r.storage() != x.storage());
  CHECK(r.to_vector<double>()[1] == 4);  // t[0][0][1] = x[0][1][0]
  CHECK(t.reshape({2, 4, 3, 1}).storage() == x.storage());  // adding a unit dim is always a view
  CHECK_THROWS_WITH(t.view({2, 12}), HasSubstr("without a copy"));
  CHECK_THROWS_WITH(x.reshape({5, -1}), HasSubstr("cannot infer"));
  CHECK_THROWS_WITH(x.reshape({-1, -1}), HasSubstr("only one dimension"));
}

TEST_CASE("view gradients pass the finite-difference check", "[views][gradcheck]") {
  Tensor x = test::random_tensor({2, 3, 4}, 5).set_requires_grad(true);
  auto check = [&](test::GradcheckFn f) { CHECK(test::gradcheck(f, {x}) == ""); };
  check([](const std::vector<Tensor>& in) { return in[0].transpose(0, 2).reshape({4, 6}); });
  check([](const std::vector<Tensor>& in) { return slice(in[0], 2, 1, 4, 2); });
  check([](const std::vector<Tensor>& in) { return select(in[0], 1, 2); });
  check([](const std::vector<Tensor>& in) { return in[0].permute({2, 0, 1}).flatten(); });
  check([](const std::vector<Tensor>& in) { return slice(in[0], 1, 0, 1).expand({2, 5, 4}); });
  check([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}); });
  check([](const std::vector<Tensor>& in) { return mean(in[0], {1}, KeepDim::yes); });
  check([](const std::vector<Tensor>& in) { return var(in[0], {2}); });
}

TEST_CASE("sum and mean match a naive reference, including non-contiguous input", "[reduce]") {
  Tensor x = test::random_tensor({3, 5, 2}, 7);
  Tensor xt = x.permute({2, 0, 1});  // (2, 3, 5)
  const auto v = x.to_vector<double>();
  std::vector<double> expect(2 * 5, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 2; ++k) expect[k * 5 + j] += v[(i * 5 + j) * 2 + k];
  CHECK(test::compare(sum(xt, {1}), expect, 1e-12, 1e-12) == "");
  CHECK(sum(xt, {1}, KeepDim::yes).shape() == Shape{2, 1, 5});
  CHECK(mean(x).item() == Approx(std::accumulate(v.begin(), v.end(), 0.0) / 30).epsilon(1e-12));
  CHECK(sum(arange(5, {DType::i32})).dtype() == DType::i64);
  CHECK(sum(arange(5, {DType::i32})).item() == 10);
  CHECK_THROWS_WITH(sum(x, {0, -3}), HasSubstr("appears twice"));
  CHECK_THROWS_WITH(sum(x, {3}), HasSubstr("out of range"));
}
