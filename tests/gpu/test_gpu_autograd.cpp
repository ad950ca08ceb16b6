// Autograd through CUDA tensors: gradients of graphs built from the CUDA ops (broadcasting arithmetic,
// sums and means, unary math, where, maximum, dtype conversions) match the CPU gradients of the same graph.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <functional>

using namespace ht;

namespace {

using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

// Leaves with the same values on `dev` (requires grad).
std::vector<Tensor> leaves(const std::vector<Tensor>& values, Device dev) {
  std::vector<Tensor> out;
  for (const Tensor& v : values) {
    Tensor t = v.to(dev).detach();
    t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// Runs the graph's backward on both devices; "" when the loss and every gradient agree within tol.
std::string check_grads(const Graph& f, const std::vector<Tensor>& values, test::Tolerance tol) {
  auto cpu = leaves(values, Device::cpu());
  auto gpu = leaves(values, test::kCuda);
  const Tensor lc = f(cpu), lg = f(gpu);
  if (!lg.is_cuda()) return "the CUDA graph's loss is not on CUDA";
  lc.backward();
  lg.backward();
  std::string msg = test::compare_to_cpu(lg, lc, tol);
  if (!msg.empty()) return "loss: " + msg;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].grad().defined()) {  // an input the graph does not use: no gradient on either device
      if (gpu[i].grad().defined()) return fmt::format("input {}: a gradient on CUDA but none on the CPU", i);
      continue;
    }
    if (!gpu[i].grad().defined()) return fmt::format("input {}: no gradient on CUDA", i);
    if (!gpu[i].grad().is_cuda()) return fmt::format("input {}: gradient not on CUDA", i);
    msg = test::compare_to_cpu(gpu[i].grad(), cpu[i].grad(), tol);
    if (!msg.empty()) return fmt::format("gradient of input {}: {}", i, msg);
  }
  return {};
}

}  // namespace

TEST_CASE("mul, add and sum backward on CUDA match the CPU gradients", "[gpu][autograd]") {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dtype_name(dt));
    const auto x = test::random_input({4, 5}, 1, dt), y = test::random_input({5}, 2, dt),
               z = test::random_input({4, 1}, 3, dt);
    // broadcasting in both directions, so the backward reduces with sum_to
    CHECK(check_grads([](const std::vector<Tensor>& in) { return sum(mul(add(in[0], in[1]), in[2])); }, {x, y, z},
                      test::tolerance(dt)) == "");
    CHECK(check_grads([](const std::vector<Tensor>& in) {
            return sum(mean(sub(mul(in[0], in[0]), div(in[1], add(in[2], 3.0))), {0}, KeepDim::yes));
          }, {x, y, z}, test::tolerance(dt)) == "");
    // a non-contiguous input view
    CHECK(check_grads([](const std::vector<Tensor>& in) { return sum(mul(in[0].transpose(0, 1), in[1].unsqueeze(1))); },
                      {x, y}, test::tolerance(dt)) == "");
  }
}

TEST_CASE("unary, where, maximum and conversion gradients on CUDA match the CPU", "[gpu][autograd]") {
  const auto x = test::random_input({37}, 4, DType::f32, 0.2, 2.0);
  const auto y = test::random_input({37}, 5, DType::f32, -2.0, 2.0);
  const std::vector<std::pair<const char*, Graph>> graphs = {
      {"exp log sqrt rsqrt", [](const std::vector<Tensor>& in) {
         return sum(add(add(exp(in[1]), log(in[0])), add(sqrt(in[0]), rsqrt(in[0]))));
       }},
      {"tanh sigmoid relu", [](const std::vector<Tensor>& in) {
         return sum(mul(add(tanh(in[1]), sigmoid(in[1])), relu(in[1])));
       }},
      {"gelu silu", [](const std::vector<Tensor>& in) {
         return sum(add(add(gelu(in[1]), gelu(in[1], GeluApprox::tanh)), silu(in[1])));
       }},
      {"abs neg clamp pow", [](const std::vector<Tensor>& in) {
         return sum(add(mul(abs(in[1]), neg(clamp(in[1], -0.5, 0.5))), pow(in[0], 3.0)));
       }},
      {"where maximum minimum", [](const std::vector<Tensor>& in) {
         return sum(add(where(gt(in[1], 0.0), mul(in[0], 2.0), in[1]), sub(maximum(in[0], in[1]), minimum(in[0], in[1]))));
       }},
      {"bf16 round trip", [](const std::vector<Tensor>& in) { return sum(mul(in[0].to(DType::bf16), 3.0).to(DType::f32)); }},
  };
  for (const auto& [name, g] : graphs) {
    INFO(name);
    CHECK(check_grads(g, {x, y}, {1e-5, 1e-5}) == "");
  }
}

TEST_CASE("gradients accumulate on CUDA leaves across backward calls", "[gpu][autograd]") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}, {DType::f32, test::kCuda, true});
  Tensor b = from_vector(std::vector<double>{4, 5, 6}, {3}, {DType::f32, test::kCuda, true});
  sum(mul(a, b)).backward();
  sum(mul(a, b)).backward();
  CHECK(a.grad().is_cuda());
  CHECK(a.grad().to_vector<float>() == std::vector<float>{8, 10, 12});
  CHECK(b.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
}
