// A model of your own: a residual MLP defined as a Module subclass with its own parameter (a learned
// per-channel residual scale) and child modules, trained for a few steps on synthetic data with a bf16
// forward through a parameter store and AdamW, then saved to a safetensors file and loaded into a fresh
// copy. Exits non-zero when the loss does not fall or the loaded copy computes something else.
//
//   custom_model [steps]      (default 60)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "hadatrain/io/safetensors.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;

namespace {

// x + scale ⊙ fc2(gelu(fc1(norm(x)))): a pre-norm residual block whose branch is scaled per channel by a
// parameter of the block itself ("layer scale").
class ResidualBlock : public nn::Module {
 public:
  ResidualBlock(int64_t dim, int64_t hidden, Generator& gen) {
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(dim));
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(dim, hidden, nn::Bias::yes, gen));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(hidden, dim, nn::Bias::yes, gen));
    scale = full({dim}, 0.5);
    register_parameter("scale", &scale);
  }
  std::string type_name() const override { return "ResidualBlock"; }
  Tensor forward(const Tensor& x) override {  // (N, dim) -> (N, dim)
    const Tensor branch = fc2_->forward(gelu(fc1_->forward(norm_->forward(x))));
    // A parameter is read through materialise, in the dtype the block computes in (here x's: bf16).
    return add(x, mul(branch, materialise(scale, x.dtype())));
  }
  Tensor scale;  // (dim)

 private:
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// features -> dim, `depth` residual blocks, -> classes.
class ResidualMlp : public nn::Module {
 public:
  ResidualMlp(int64_t features, int64_t dim, int64_t depth, int64_t classes, Generator& gen) {
    embed_ = register_module("embed", std::make_shared<nn::Linear>(features, dim, nn::Bias::yes, gen));
    blocks_ = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int64_t i = 0; i < depth; ++i) blocks_->push_back(std::make_shared<ResidualBlock>(dim, 2 * dim, gen));
    head_ = register_module("head", std::make_shared<nn::Linear>(dim, classes, nn::Bias::yes, gen));
  }
  std::string type_name() const override { return "ResidualMlp"; }
  Tensor forward(const Tensor& x) override { return head_->forward(blocks_->forward(embed_->forward(x))); }

 private:
  std::shared_ptr<nn::Linear> embed_, head_;
  std::shared_ptr<nn::Sequential> blocks_;
};

constexpr int64_t kFeatures = 16, kClasses = 4, kSamples = 256;

int fail(const std::string& what) {
  std::fprintf(stderr, "custom_model: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 60;
  if (steps < 10) return fail("steps must be at least 10, got " + std::to_string(steps));

  // Synthetic data: four Gaussian blobs in 16 dimensions, labels 0..3.
  Generator data_gen(1);
  const Tensor centres = randn({kClasses, kFeatures}, data_gen);
  std::vector<int64_t> label_values(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) label_values[i] = i % kClasses;
  const Tensor labels = from_vector(label_values, {kSamples}, {DType::i64});
  const Tensor x = add(embedding(centres, labels), mul(randn({kSamples, kFeatures}, data_gen), 0.8));
  const Tensor x16 = x.to(DType::bf16);  // the forward runs in bf16; the master weights stay f32

  Generator init_gen(2);
  auto model = std::make_shared<ResidualMlp>(kFeatures, 32, 2, kClasses, init_gen);
  // The store holds every parameter by name (and decides what decays: weights yes, biases, norms and the
  // 1-dim scales no); the optimiser steps over it and keeps its moments in it.
  auto store = nn::ParameterStore::attach(*model);
  auto opt = optim::make_adamw(store, {.weight_decay = 0.01});
  std::printf("custom_model: %zu parameters in the store (%lld values)\n", store->size(),
              static_cast<long long>(model->num_parameters()));

  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    const Tensor loss = cross_entropy(model->forward(x16), labels);
    loss.backward();
    opt->step(3e-3);
    const double v = loss.item();
    if (s == 0) first = v;
    last = v;
    if (s % 10 == 0 || s == steps - 1) std::printf("step %3d  loss %.4f\n", s, v);
  }
  if (!(last < 0.5 * first))
    return fail("the loss did not halve: " + std::to_string(first) + " -> " + std::to_string(last));

  // The state dict (parameters and buffers by full name, e.g. "blocks.1.scale") through a safetensors file
  // into a freshly initialised copy, which then computes the same logits bit for bit.
  const auto path =
      std::filesystem::temp_directory_path() / ("custom_model_" + std::to_string(::getpid()) + ".safetensors");
  io::TensorList saved;
  for (const auto& [name, t] : store->state_dict()) saved.emplace_back(name, t);
  io::save_safetensors(path, saved);
  Generator other_gen(3);
  ResidualMlp copy(kFeatures, 32, 2, kClasses, other_gen);
  copy.load_state_dict(io::load_safetensors(path).tensors);
  std::filesystem::remove(path);
  if (copy.state_dict().count("blocks.1.scale") != 1) return fail("the state dict lacks blocks.1.scale");
  const auto a = model->forward(x16).to_vector<float>(), b = copy.forward(x16).to_vector<float>();
  if (a != b) return fail("the loaded copy computes different logits");
  std::printf("custom_model: loss %.4f -> %.4f; state dict round trip exact\n", first, last);
  return 0;
}
