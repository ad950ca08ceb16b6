// Unary math ops against std:: formulas (contiguous and strided inputs, f64 / f32 / bf16, integer inputs),
// their derivative conventions at kinks, finite-difference gradients and errors.
#include <cmath>
#include <functional>
#include <string>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input domain (away from kinks and singularities)
};

constexpr double kPi = 3.14159265358979323846;

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -3, 3},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.2, 4},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.2, 4},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }, 0.2, 4},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
       -5, 5},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, -3, 3},
      {"gelu", [](const Tensor& x) { return gelu(x); },
       [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, -4, 4},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); },
       [](double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x))); }, -4,
       4},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x / (1.0 + std::exp(-x)); }, -5, 5},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.7, 1.3); },
       [](double x) { return std::min(1.3, std::max(-0.7, x)); }, -3, 3},
  };
}

std::vector<double> apply_ref(const UnaryCase& c, const Tensor& x) {
  auto v = x.to_vector<double>();
  for (double& e : v) e = c.ref(e);
  return v;
}

}  // namespace

TEST_CASE("unary ops match std:: formulas on contiguous and strided f64 input", "[unary]") {
  uint64_t seed = 1;
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    Tensor x = test::random_tensor({5, 7}, ++seed, DType::f64, c.lo, c.hi);
    Tensor y = c.op(x);
    CHECK(y.dtype() == DType::f64);
    CHECK(y.shape() == x.shape());
    CHECK(test::compare(y, apply_ref(c, x), 1e-14, 1e-15) == "");
    // Transposed and step-sliced views.
    Tensor xt = x.transpose(0, 1);
    CHECK(test::compare(c.op(xt), apply_ref(c, xt), 1e-14, 1e-15) == "");
    Tensor xs = slice(x, 1, 1, 7, 3);  // (5, 2)
    CHECK(test::compare(c.op(xs), apply_ref(c, xs), 1e-14, 1e-15) == "");
    // A broadcast (stride 0) input.
    Tensor xe = slice(x, 0, 2, 3).expand({4, 7});
    CHECK(test::compare(c.op(xe), apply_ref(c, xe), 1e-14, 1e-15) == "");
  }
}

TEST_CASE("unary ops in f32 and bf16 stay close to the f64 result", "[unary]") {
  uint64_t seed = 100;
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    Tensor x = test::random_tensor({3, 11}, ++seed, DType::f64, c.lo, c.hi);
    Tensor xb = x.to(DType::bf16);
    Tensor yb = c.op(xb);
    CHECK(yb.dtype() == DType::bf16);
    // Compare against the f64 op on the same (bf16-rounded) input: only the output rounding and the
    // float arithmetic differ (bf16 keeps 8 significant bits, relative error <= 2^-8).
    CHECK(test::compare(yb, c.op(xb.to(DType::f64)), 8e-3, 1e-6) == "");
    Tensor xf = x.to(DType::f32);
    CHECK(test::compare(c.op(xf), c.op(xf.to(DType::f64)), 1e-6, 1e-7) == "");
  }
}

TEST_CASE("unary ops handle special values", "[unary]") {
  Tensor x = from_vector(std::vector<double>{0.0, -1.0, 1000.0, -1000.0}, {4}, {DType::f64});
  const auto l = log(x).to_vector<double>();
  CHECK((std::isinf(l[0]) && l[0] < 0));
  CHECK(std::isnan(l[1]));
  CHECK(std::isnan(sqrt(x).to_vector<double>()[1]));
  CHECK(std::isinf(rsqrt(x).to_vector<double>()[0]));
  CHECK(std::isinf(exp(x).to_vector<double>()[2]));
  CHECK(test::compare(sigmoid(x), std::vector<double>{0.5, 1.0 / (1.0 + std::exp(1.0)), 1.0, 0.0}, 1e-15, 0) == "");
  CHECK(test::compare(silu(x), std::vector<double>{0.0, -1.0 / (1.0 + std::exp(1.0)), 1000.0, 0.0}, 1e-15, 0) ==
        "");
  CHECK(test::compare(tanh(x), std::vector<double>{0.0, std::tanh(-1.0), 1.0, -1.0}, 1e-15, 0) == "");
  // NaN propagates through every op, including the piecewise ones (as in PyTorch).
  Tensor n = from_vector(std::vector<double>{std::nan("")}, {1}, {DType::f64});
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    CHECK(std::isnan(c.op(n).item()));
    CHECK(std::isnan(c.op(n.to(DType::f32)).item()));
  }
  // The same in f32: no overflow to NaN in sigmoid / silu for large |x|.
  Tensor xf = x.to(DType::f32);
  CHECK(test::compare(sigmoid(xf), std::vector<double>{0.5, 1.0 / (1.0 + std::exp(1.0)), 1.0, 0.0}, 1e-6, 0) == "");
  CHECK(test::compare(silu(xf), std::vector<double>{0.0, -1.0 / (1.0 + std::exp(1.0)), 1000.0, 0.0}, 1e-6, 0) == "");
}

TEST_CASE("neg, abs, relu and clamp work on integers; the others require floating input", "[unary]") {
  Tensor i = from_vector(std::vector<int64_t>{-5, -1, 0, 2, 9}, {5}, {DType::i32});
  CHECK(neg(i).dtype() == DType::i32);
  CHECK(neg(i).to_vector<int64_t>() == std::vector<int64_t>{5, 1, 0, -2, -9});
  CHECK(abs(i).to_vector<int64_t>() == std::vector<int64_t>{5, 1, 0, 2, 9});
  CHECK(relu(i).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 2, 9});
  CHECK(clamp(i.to(DType::i64), -2, 3).to_vector<int64_t>() == std::vector<int64_t>{-2, -1, 0, 2, 3});
  CHECK_THROWS_WITH(exp(i), HasSubstr("floating"));
  CHECK_THROWS_WITH(gelu(i), HasSubstr("floating"));
  CHECK_THROWS_WITH(sqrt(i), HasSubstr("floating"));
  CHECK_THROWS_WITH(clamp(i, 2, 1), HasSubstr("greater than hi"));
  CHECK_THROWS(neg(from_vector(std::vector<int64_t>{1, 0}, {2}, {DType::b8})));
}

TEST_CASE("unary gradients pass the finite-difference check", "[unary][gradcheck]") {
  uint64_t seed = 200;
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    Tensor x = test::random_tensor({3, 4}, ++seed, DType::f64, c.lo, c.hi).set_requires_grad(true);
    const auto op = c.op;
    CHECK(test::gradcheck([op](const std::vector<Tensor>& in) { return op(in[0]); }, {x}) == "");
    // Through a transposed view followed by a composition (chain rule across two nodes).
    CHECK(test::gradcheck([op](const std::vector<Tensor>& in) { return mul(op(in[0].transpose(0, 1)), 1.5); },
                          {x}) == "");
  }
}

TEST_CASE("unary derivative conventions at kinks", "[unary]") {
  // relu'(0) = 0, abs'(0) = 0, clamp passes the gradient at its inclusive bounds.
  Tensor x = from_vector(std::vector<double>{0.0, -0.5, 0.5, 2.0}, {4}, {DType::f64}).set_requires_grad(true);
  auto grad_of = [&](const std::function<Tensor(const Tensor&)>& f) {
    x.zero_grad();
    sum(f(x)).backward();
    return x.grad().to_vector<double>();
  };
  CHECK(grad_of([](const Tensor& t) { return relu(t); }) == std::vector<double>{0, 0, 1, 1});
  CHECK(grad_of([](const Tensor& t) { return abs(t); }) == std::vector<double>{0, -1, 1, 1});
  CHECK(grad_of([](const Tensor& t) { return clamp(t, -0.5, 0.5); }) == std::vector<double>{1, 1, 1, 0});
  CHECK(grad_of([](const Tensor& t) { return neg(t); }) == std::vector<double>{-1, -1, -1, -1});
  // gelu'(0) = 0.5 in both forms; silu'(0) = 0.5; sigmoid'(0) = 0.25.
  CHECK(grad_of([](const Tensor& t) { return gelu(t); })[0] == Approx(0.5));
  CHECK(grad_of([](const Tensor& t) { return gelu(t, GeluApprox::tanh); })[0] == Approx(0.5));
  CHECK(grad_of([](const Tensor& t) { return silu(t); })[0] == Approx(0.5));
  CHECK(grad_of([](const Tensor& t) { return sigmoid(t); })[0] == Approx(0.25));
}

TEST_CASE("unary gradients keep a low-precision input's dtype", "[unary]") {
  Tensor x = test::random_tensor({8}, 300, DType::f64, 0.5, 2.0);
  Tensor xb = x.to(DType::bf16).set_requires_grad(true);
  sum(log(xb)).backward();
  REQUIRE(xb.grad().defined());
  CHECK(xb.grad().dtype() == DType::bf16);
  std::vector<double> expect;
  for (double v : xb.to_vector<double>()) expect.push_back(1.0 / v);
  CHECK(test::compare(xb.grad(), expect, 8e-3, 0) == "");
}
