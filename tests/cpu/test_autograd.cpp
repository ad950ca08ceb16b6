// Autograd engine: deep chains, accumulation across backward calls, hooks, retain_graph, grad().
#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/autograd/meta.h"

using namespace ht;

TEST_CASE("a 10,000-node chain runs backward and frees without stack overflow", "[autograd]") {
  Tensor x = from_vector(std::vector<double>{0.5, -1.0}, {2}, {DType::f64, Device::cpu(), true});
  std::weak_ptr<Node> first_node;
  {
    Tensor y = x;
    for (int i = 0; i < 10000; ++i) {
      y = mul(y, 1.0001);
      if (i == 0) first_node = y.grad_fn();
    }
    sum(y).backward();
    const double expected = std::pow(1.0001, 10000);
    const auto g = x.grad().to_vector<double>();
    CHECK(g[0] == Approx(expected).epsilon(1e-9));
    CHECK(g[1] == Approx(expected).epsilon(1e-9));
    CHECK_FALSE(first_node.expired());
  }
  CHECK(first_node.expired());  // the whole graph was destroyed when y went out of scope
  // A far longer chain only checks destruction (no recursion anywhere).
  {
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = add(y, 0.0);
  }
  SUCCEED("200k-node graph destroyed");
}

TEST_CASE("gradients accumulate across two backward calls", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}, {DType::f64, Device::cpu(), true});
  Tensor b = from_vector(std::vector<double>{4, 5, 6}, {3}, {DType::f64, Device::cpu(), true});
  sum(mul(a, b)).backward();
  sum(mul(a, b)).backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{8, 10, 12});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{2, 4, 6});
  a.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("a tensor used twice sums both paths", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{3}, {1}, {DType::f64, Device::cpu(), true});
  Tensor y = add(mul(a, a), mul(a, 2.0));  // a^2 + 2a
  sum(y).backward();
  CHECK(a.grad().item() == 8.0);
}

TEST_CASE("leaf hooks fire once per backward and can replace the gradient", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{1, 2}, {2}, {DType::f64, Device::cpu(), true});
  int calls = 0, post_calls = 0;
  a.register_hook([&](const Tensor& g) {
    ++calls;
    return mul(g, 10.0);
  });
  a.register_post_accumulate_hook([&](Tensor& leaf) {
    ++post_calls;
    CHECK(leaf.grad().defined());
  });
  // a reaches the loss along three paths; the hook still fires once with the summed gradient.
  Tensor y = add(add(a, a), mul(a, 3.0));
  sum(y).backward();
  CHECK(calls == 1);
  CHECK(post_calls == 1);
  CHECK(a.grad().to_vector<double>() == std::vector<double>{50, 50});
  sum(mul(a, 1.0)).backward();
  CHECK(calls == 2);
}

TEST_CASE("retain_graph allows a second backward; without it the error says what to do", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{2}, {1}, {DType::f64, Device::cpu(), true});
  Tensor y = sum(mul(a, a));
  y.backward({}, BackwardOptions{.retain_graph = true});
  y.backward();
  CHECK(a.grad().item() == 8.0);
  CHECK_THROWS_WITH(y.backward(), HasSubstr("retain_graph"));
}

TEST_CASE("grad() returns gradients without touching .grad", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{1, 2}, {2}, {DType::f64, Device::cpu(), true});
  Tensor mid = mul(a, 3.0);
  Tensor y = sum(mul(mid, mid));
  auto g = grad({y}, {a, mid});
  CHECK(g[0].to_vector<double>() == std::vector<double>{18, 36});
  CHECK(g[1].to_vector<double>() == std::vector<double>{6, 12});
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("no_grad records nothing; backward on a tensor without history is an error", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{1}, {1}, {DType::f64, Device::cpu(), true});
  Tensor y;
  {
    NoGradGuard ng;
    y = mul(a, 2.0);
  }
  CHECK_FALSE(y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
  CHECK_THROWS_WITH(y.backward(), HasSubstr("does not require grad"));
  Tensor z = mul(a, 2.0);
  CHECK_THROWS_WITH(mul(z, 1.0).backward(ones({2}, {DType::f64})), HasSubstr("does not match"));
}

namespace {

// The identity, whose backward takes the engine's offer of the gradient gathered so far for its input (Note
// [Gradients accumulated in place]) and, with `accept`, adds its own gradient into it.
class AddIntoNode final : public Node {
 public:
  explicit AddIntoNode(bool accept) : accept_(accept) {}
  std::string name() const override { return "AddIntoTest"; }
  bool accepts_grad_buffers() const override { return true; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return {grads[0]}; }
  std::vector<Tensor> apply_into(std::vector<Tensor>&& grads, std::vector<Tensor>& into) override {
    offered = into[0].defined();
    if (!offered) return {grads[0]};
    offered_values = into[0].to_vector<double>();
    if (!accept_) return {grads[0]};
    add_(into[0], grads[0]);
    return {into[0]};
  }
  bool offered = false;
  std::vector<double> offered_values;

 private:
  bool accept_;
};

// The identity, whose backward keeps a reference to the gradient it hands on (as a hook that stores it would).
class KeepNode final : public Node {
 public:
  std::string name() const override { return "KeepTest"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    kept = grads[0].clone();
    return {kept};
  }
  Tensor kept;
};

Tensor through(const std::shared_ptr<Node>& node, const Tensor& y) {
  Tensor out = clone(y.detach());
  connect(node, {&y}, {&out});
  return out;
}

}  // namespace

TEST_CASE("a node may add its gradient into the buffer gathered so far, only one nothing else holds",
          "[autograd]") {
  // loss = sum(w * (3y + id(y))), y = 1 * x: g_y = 3w (the mul branch, which runs first) + w (the node's).
  const std::vector<double> w{5, 7};
  for (const bool accept : {true, false}) {
    INFO("accept " << accept);
    Tensor x = from_vector(std::vector<double>{1, 2}, {2}, {DType::f64, Device::cpu(), true});
    const Tensor wt = from_vector(w, {2}, {DType::f64});
    auto node = std::make_shared<AddIntoNode>(accept);
    const Tensor y = mul(x, 1.0);
    const int64_t before = grads_accumulated_in_place();
    sum(mul(add(through(node, y), mul(y, 3.0)), wt)).backward();
    CHECK(grads_accumulated_in_place() - before == (accept ? 1 : 0));
    CHECK(node->offered);
    CHECK(node->offered_values == std::vector<double>{15, 21});
    CHECK(x.grad().to_vector<double>() == std::vector<double>{20, 28});
  }
  // The other branch's gradient is also held elsewhere: no offer, the sum as usual.
  Tensor x = from_vector(std::vector<double>{1, 2}, {2}, {DType::f64, Device::cpu(), true});
  const Tensor wt = from_vector(w, {2}, {DType::f64});
  auto node = std::make_shared<AddIntoNode>(true);
  auto keep = std::make_shared<KeepNode>();
  const Tensor y = mul(x, 1.0);
  sum(mul(add(through(node, y), mul(through(keep, y), 3.0)), wt)).backward();
  CHECK_FALSE(node->offered);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{20, 28});
  CHECK(keep->kept.to_vector<double>() == std::vector<double>{15, 21});  // untouched by the accumulation
}

TEST_CASE("saved tensors are released after backward", "[autograd]") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}, {DType::f64, Device::cpu(), true});
  Tensor b = from_vector(std::vector<double>{1, 2, 3}, {3}, {DType::f64, Device::cpu(), true});
  Tensor y = mul(a, b);
  CHECK(y.grad_fn()->saved_bytes() == 48);
  sum(y).backward();
  CHECK(y.grad_fn()->saved_bytes() == 0);
}

TEST_CASE("arithmetic gradients with broadcasting pass the finite-difference check", "[autograd][gradcheck]") {
  const TensorOptions g{DType::f64, Device::cpu(), true};
  Tensor a = test::random_tensor({3, 4}, 1).set_requires_grad(true);
  Tensor b = test::random_tensor({4}, 2, DType::f64, 0.5, 1.5).set_requires_grad(true);
  Tensor c = test::random_tensor({3, 1}, 3, DType::f64, 0.5, 1.5).set_requires_grad(true);
  (void)g;
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return add(in[0], in[1]); }, {a, b}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return sub(in[0], in[1]); }, {a, c}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[1]); }, {a, b}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return div(in[0], in[1]); }, {a, c}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return maximum(in[0], in[1]); }, {a, b}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], 3.0); }, {b}) == "");
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return rsub(2.0, mul(in[0], 0.5)); }, {a}) == "");
  // Non-contiguous operand (a transposed view).
  Tensor d = test::random_tensor({4, 3}, 4).set_requires_grad(true);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return mul(transpose(in[0], 0, 1), in[1]); }, {d, a}) == "");
}

TEST_CASE("arithmetic matches a naive reference with broadcasting and views", "[ops]") {
  Tensor a = test::random_tensor({2, 3, 4}, 11);
  Tensor b = test::random_tensor({3, 1}, 12, DType::f64, 1.0, 2.0);
  Tensor out = div(a, b);
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), ov = out.to_vector<double>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) REQUIRE(ov[(i * 3 + j) * 4 + k] == av[(i * 3 + j) * 4 + k] / bv[j]);
  CHECK_THROWS_WITH(add(a, test::random_tensor({5}, 1)), HasSubstr("cannot be broadcast"));
  // Mixed dtypes promote.
  CHECK(add(a.to(DType::bf16), a.to(DType::f32)).dtype() == DType::f32);
}
