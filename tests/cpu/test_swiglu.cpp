// swiglu(g, u) = silu(g) * u: values and both gradients against the formulas in double, the finite-difference
// check. (On the CPU swiglu is the mul(silu(g), u) composition; tests/gpu/test_gpu_swiglu.cpp checks the
// fused CUDA kernels against it.)
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

TEST_CASE("swiglu matches silu(g) * u and its gradients from the formulas", "[swiglu]") {
  Tensor g = test::random_tensor({3, 4, 5}, 51).set_requires_grad(true);
  Tensor u = test::random_tensor({3, 4, 5}, 52).set_requires_grad(true);
  Tensor y = swiglu(g, u);
  const Tensor dy = test::random_tensor(y.shape(), 53);
  const auto grads = grad({y}, {g, u}, {dy});
  const auto gv = g.to_vector<double>(), uv = u.to_vector<double>(), dv = dy.to_vector<double>();
  std::vector<double> ey(gv.size()), eg(gv.size()), eu(gv.size());
  for (std::size_t i = 0; i < gv.size(); ++i) {
    const double s = 1.0 / (1.0 + std::exp(-gv[i]));
    ey[i] = gv[i] * s * uv[i];
    eu[i] = dv[i] * gv[i] * s;
    eg[i] = dv[i] * uv[i] * s * (1.0 + gv[i] * (1.0 - s));
  }
  CHECK(test::compare(y, ey, 1e-12, 1e-14) == "");
  CHECK(test::compare(grads[0], eg, 1e-12, 1e-14) == "");
  CHECK(test::compare(grads[1], eu, 1e-12, 1e-14) == "");
}

TEST_CASE("swiglu passes the finite-difference check", "[swiglu][gradcheck]") {
  Tensor g = test::random_tensor({2, 7}, 54).set_requires_grad(true);
  Tensor u = test::random_tensor({2, 7}, 55).set_requires_grad(true);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, {g, u}) == "");
}
