// Golden tests against PyTorch: torchvision ResNet-18 (CIFAR stem) and a small timm ViT, with weights filled
// by the closed formula of tools/golden/make_fixtures.py, compared in float64 on a fixed batch: logits, loss,
// batch-norm running statistics, and for every parameter its gradient norm and 32 sampled elements.
// The fixtures (tests/fixtures/golden_*.safetensors) were made by that script with torch on the GPU machine.
#include <cmath>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"

using namespace ht;

namespace {

double phase(const std::string& name) {
  int64_t s = 0;
  for (std::size_t k = 0; k < name.size(); ++k) s += static_cast<int64_t>(k + 1) * static_cast<unsigned char>(name[k]);
  return static_cast<double>(s % 1000) / 100.0;
}

// Mirrors formula_values() of tools/golden/make_fixtures.py.
Tensor formula_values(const std::string& name, const Shape& shape) {
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

void check_against(nn::Module& model, const std::string& fixture, double label_smoothing) {
  const auto f = io::load_safetensors(fixture);
  model.to(DType::f64);
  std::map<std::string, Tensor> state;
  for (auto& [name, p] : model.named_parameters()) state[name] = formula_values(name, p->shape());
  model.load_state_dict(state, nn::StrictLoad::no);
  model.train();
  const Tensor x = f.tensors.at("x");
  const Tensor logits = model.forward(x);
  CrossEntropyOptions ce;
  ce.label_smoothing = label_smoothing;
  const Tensor loss = cross_entropy(logits, f.tensors.at("labels"), ce);
  loss.backward();
  CHECK(test::compare(logits, f.tensors.at("logits"), 1e-9, 1e-11) == "");
  CHECK(test::compare(loss.reshape({1}), f.tensors.at("loss"), 1e-10, 1e-12) == "");
  int checked = 0;
  for (auto& [name, p] : model.named_parameters()) {
    INFO("parameter " << name);
    REQUIRE(f.tensors.count("grad_norm." + name) == 1);
    const Tensor g = p->grad().contiguous().reshape({-1});
    const double norm = std::sqrt(sum(mul(g, g)).item());
    CHECK(norm == Approx(f.tensors.at("grad_norm." + name).item()).epsilon(1e-8).margin(1e-14));
    std::vector<int64_t> idx;
    for (int64_t k = 0; k < 32; ++k) idx.push_back(k * g.numel() / 32);
    const auto gv = g.to_vector<double>();
    std::vector<double> sampled;
    for (int64_t i : idx) sampled.push_back(gv[static_cast<std::size_t>(i)]);
    CHECK(test::compare(f.tensors.at("grad_sample." + name), sampled, 1e-7, 1e-12) == "");
    ++checked;
  }
  int fixture_params = 0;
  for (const auto& [k, v] : f.tensors) fixture_params += k.rfind("grad_norm.", 0) == 0 ? 1 : 0;
  CHECK(checked == fixture_params);  // same parameter set as torch, by name
  for (auto& [name, b] : model.named_buffers()) {
    const auto it = f.tensors.find("buffer." + name);
    if (it == f.tensors.end()) continue;
    INFO("buffer " << name);
    // Running statistics stay f32 buffers under Module::to(f64) (torch's .double() converts them), so they
    // agree to f32 rounding of the float64 statistics.
    CHECK(b->dtype() == DType::f32);
    CHECK(test::compare(*b, it->second, 2e-7, 1e-9) == "");
  }
}

}  // namespace

TEST_CASE("ResNet-18 (CIFAR stem) matches torchvision in float64", "[golden]") {
  Generator gen(0);
  models::ResNet r({models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false}, gen);
  check_against(r, "tests/fixtures/golden_resnet18_cifar.safetensors", 0.0);
}

TEST_CASE("a small ViT matches timm in float64", "[golden]") {
  models::VitConfig c;
  c.image_size = 16;
  c.patch_size = 4;
  c.dim = 32;
  c.depth = 2;
  c.heads = 4;
  c.num_classes = 10;
  Generator gen(0);
  models::VisionTransformer v(c, gen, std::make_shared<Generator>(1));
  check_against(v, "tests/fixtures/golden_vit_tiny.safetensors", 0.1);
}
