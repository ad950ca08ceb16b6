// Golden tests against PyTorch (golden_testing.h).
#include "golden_testing.h"

#include <cmath>
#include <map>
#include <vector>

#include "catch.h"
#include "testing.h"

#include "hadatrain/io/safetensors.h"
#include "hadatrain/ops/ops.h"

namespace ht::test {
namespace {

double phase(const std::string& name) {
  int64_t s = 0;
  for (std::size_t k = 0; k < name.size(); ++k) s += static_cast<int64_t>(k + 1) * static_cast<unsigned char>(name[k]);
  return static_cast<double>(s % 1000) / 100.0;
}

}  // namespace

// Mirrors formula_values() of tools/golden/make_fixtures.py.
Tensor golden_formula_values(const std::string& name, const Shape& shape) {
  const int64_t n = numel_of(shape);
  std::vector<double> v(static_cast<std::size_t>(n));
  const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
  for (int64_t i = 0; i < n; ++i) {
    const double s = std::sin(0.7071 * static_cast<double>(i) + phase(name));
    double x;
    if (shape.size() >= 2 && weight) x = s / std::sqrt(static_cast<double>(n / shape[0]));
    else if (shape.size() >= 2) x = 0.02 * s;
    else if (weight) x = 1.0 + 0.2 * s;
    else x = 0.1 * s;
    v[static_cast<std::size_t>(i)] = x;
  }
  return from_vector(v, shape, {DType::f64});
}

void check_against_golden(nn::Module& model, const std::string& fixture, double label_smoothing, double grad_atol) {
  const auto f = io::load_safetensors(fixture);
  model.to(DType::f64);
  {
    std::map<std::string, Tensor> state;
    for (auto& [name, p] : model.named_parameters()) state[name] = golden_formula_values(name, p->shape());
    model.load_state_dict(state, nn::StrictLoad::no);
  }
  model.train();
  const Tensor x = f.tensors.at("x");
  const Tensor logits = model.forward(x);
  CrossEntropyOptions ce;
  ce.label_smoothing = label_smoothing;
  const Tensor loss = cross_entropy(logits, f.tensors.at("labels"), ce);
  loss.backward();
  CHECK(compare(logits, f.tensors.at("logits"), 1e-9, 1e-11) == "");
  CHECK(compare(loss.reshape({1}), f.tensors.at("loss"), 1e-10, 1e-12) == "");
  int checked = 0;
  for (auto& [name, p] : model.named_parameters()) {
    INFO("parameter " << name);
    REQUIRE(f.tensors.count("grad_norm." + name) == 1);
    const Tensor g = p->grad().contiguous().reshape({-1});
    const double norm = std::sqrt(sum(mul(g, g)).item());
    CHECK(norm == Approx(f.tensors.at("grad_norm." + name).item()).epsilon(1e-8).margin(1e-14));
    const auto gv = g.to_vector<double>();
    std::vector<double> sampled;
    for (int64_t k = 0; k < 32; ++k) sampled.push_back(gv[static_cast<std::size_t>(k * g.numel() / 32)]);
    CHECK(compare(f.tensors.at("grad_sample." + name), sampled, 1e-7, grad_atol) == "");
    ++checked;
  }
  int fixture_params = 0;
  for (const auto& [k, v] : f.tensors) fixture_params += k.rfind("grad_norm.", 0) == 0 ? 1 : 0;
  CHECK(checked == fixture_params);  // same parameter set as torch, by name
  int buffers = 0;
  for (auto& [name, b] : model.named_buffers()) {
    const auto it = f.tensors.find("buffer." + name);
    if (it == f.tensors.end()) continue;
    INFO("buffer " << name);
    // Running statistics stay f32 buffers under Module::to(f64) (torch's .double() converts them), so they
    // agree to f32 rounding of the float64 statistics.
    CHECK(b->dtype() == DType::f32);
    CHECK(compare(*b, it->second, 2e-7, 1e-9) == "");
    ++buffers;
  }
  int fixture_buffers = 0;
  for (const auto& [k, v] : f.tensors) fixture_buffers += k.rfind("buffer.", 0) == 0 ? 1 : 0;
  CHECK(buffers == fixture_buffers);  // every running statistic of the fixture was compared
}

}  // namespace ht::test
