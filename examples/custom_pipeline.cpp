// A gradient pipeline of one's own, registered from this file and chosen per layer by a YAML config.
//
// The pipeline, `half_saved`, keeps the activation a layer needs for its weight gradient in a 16-bit dtype
// (bf16 or f16, its option `dtype`) instead of the compute dtype: half the saved memory of an f32 model,
// at the cost of rounding x once in g_w = g_yᵀ·x. g_x = g_y·W stays exact. It trains a small MLP on a synthetic
// 4-class problem, the hidden layers through half_saved and the head exact, and checks that
//   - the loss falls (the gradients are right enough to learn with),
//   - each half_saved layer kept half the bytes an exact layer keeps for the same input,
//   - the head, exact, runs its plain ops.
// Exit status 0 when all hold, 1 otherwise.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/registry.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/pipeline_config.h"

using namespace ht;

namespace {

// ---- the pipeline ------------------------------------------------------------------------------------

struct HalfSavedOptions {
  DType dtype = DType::bf16;  // what x is kept in for backward
};

struct HalfSaved final : grad::SavedState {
  Tensor x16;  // (B, L, I) in the option's dtype
  Tensor w;    // (O, I), the weight itself (a parameter: no extra memory)
};

class HalfSavedPipeline final : public grad::Pipeline {
 public:
  explicit HalfSavedPipeline(const HalfSavedOptions& o) : o_(o) {}
  std::string name() const override { return "half_saved"; }

  // x (B, L, I), w (O, I) -> y (B, L, O) = x·wᵀ + bias, the plain product.
  grad::ForwardResult forward(const Tensor& x, const Tensor& w, const grad::ProductInfo& info, const grad::NoiseKey&,
                              grad::SaveForBackward save) override {
    grad::ForwardResult r;
    r.y = linear(x, w, info.bias);
    if (save == grad::SaveForBackward::yes) {
      auto s = std::make_unique<HalfSaved>();
      s->x16 = x.to(o_.dtype);
      s->w = w;
      s->bytes = static_cast<int64_t>(storage_bytes(o_.dtype, s->x16.numel()));
      r.saved = std::move(s);
    }
    return r;
  }

  grad::Grads backward(grad::SavedState& saved, const Tensor& g_y, grad::Wanted wanted) override {
    auto& s = static_cast<HalfSaved&>(saved);
    grad::Grads g;
    if (wanted.x) g.x = matmul(g_y, s.w);  // (B, L, I)
    if (wanted.w) {
      const Tensor g2 = reshape(g_y, {-1, g_y.size(-1)});                         // (B·L, O)
      const Tensor x2 = reshape(s.x16.to(g_y.dtype()), {-1, s.x16.size(-1)});     // (B·L, I)
      g.w = matmul(g2.transpose(0, 1), x2).to(s.w.dtype());                       // (O, I)
    }
    return g;
  }

 private:
  HalfSavedOptions o_;
};

// Registered when the program starts: its name, how a config spells its options, how to build one per layer and
// the line the logs show.
const grad::PipelineRegistrar half_saved{grad::PipelineKind<HalfSavedOptions>{
    .name = "half_saved",
    .read_options =
        [](ConfigReader& r) {
          return HalfSavedOptions{r.get_choice("dtype", DType::bf16, {{"bf16", DType::bf16}, {"f16", DType::f16}})};
        },
    .make = [](const HalfSavedOptions& o) { return std::make_shared<HalfSavedPipeline>(o); },
    .describe = [](const HalfSavedOptions& o) { return fmt::format("half_saved (x kept in {})", dtype_name(o.dtype)); },
}};

// ---- the problem -------------------------------------------------------------------------------------

constexpr int64_t kIn = 16, kHidden = 64, kClasses = 4, kBatch = 64;

// x (kBatch, kIn) ~ N(0, 1) and its class, the argmax of a fixed random linear teacher.
struct Batch {
  Tensor x, y;
};
Batch make_batch(Generator& gen, const Tensor& teacher) {
  Batch b;
  b.x = randn({kBatch, kIn}, gen);
  b.y = argmax(matmul(b.x, teacher), 1);  // (kBatch) i64
  return b;
}

}  // namespace

int main() {
  Generator gen(7);
  nn::Sequential model;  // layers "0" (Linear), "1", "2" (Linear), "3", "4" (Linear, the head)
  model.push_back(std::make_shared<nn::Linear>(kIn, kHidden, nn::Bias::yes, gen));
  model.push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
  model.push_back(std::make_shared<nn::Linear>(kHidden, kHidden, nn::Bias::yes, gen));
  model.push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
  model.push_back(std::make_shared<nn::Linear>(kHidden, kClasses, nn::Bias::yes, gen));

  // The pipelines as a config file would choose them: half_saved everywhere, the head ("4") exact.
  auto cfg_reader = ConfigReader::from_string(
      "grad_pipeline:\n"
      "  default: {name: half_saved, dtype: bf16}\n"
      "  layers:\n"
      "    '4': {name: exact}\n",
      "custom_pipeline.yaml");
  const grad::PipelineConfig pipelines = train::read_grad_pipeline(cfg_reader.child("grad_pipeline"), /*seed=*/7);
  cfg_reader.finish();
  const auto bound = nn::bind_pipelines(model, pipelines, std::make_shared<grad::StepClock>());
  for (const auto& l : bound) std::printf("%s %s -> %s\n", l.type.c_str(), l.name.c_str(), l.pipeline.c_str());

  auto opt = optim::make_sgd(nn::ParameterStore::attach(model), {.momentum = 0.9});
  const Tensor teacher = randn({kIn, kClasses}, gen);
  double first_loss = 0, last_loss = 0;
  constexpr int kSteps = 150;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = make_batch(gen, teacher);
    opt->zero_grad();
    const Tensor loss = cross_entropy(model.forward(b.x), b.y);
    loss.backward();
    opt->step(0.05);
    if (step == 0) first_loss = loss.item();
    last_loss = loss.item();
    if (step % 50 == 0 || step == kSteps - 1) std::printf("step %3d  loss %.4f\n", step, last_loss);
  }
  const Batch test = make_batch(gen, teacher);
  double accuracy = 0;
  {
    NoGradGuard no_grad;
    accuracy = mean(eq(argmax(model.forward(test.x), 1), test.y).to(DType::f32)).item();
  }
  std::printf("test accuracy %.3f\n", accuracy);

  bool ok = true;
  auto expect = [&](bool cond, const std::string& what) {
    if (!cond) std::printf("FAILED: %s\n", what.c_str());
    ok = ok && cond;
  };
  expect(last_loss < 0.5 * first_loss, fmt::format("the loss falls by half: {:.4f} -> {:.4f}", first_loss, last_loss));
  expect(accuracy > 0.8, fmt::format("test accuracy above 0.8: {:.3f}", accuracy));
  // The last step kept, for layer "2" (input (kBatch, kHidden) f32), kBatch·kHidden bf16 values: half of exact.
  const auto& hidden = bound[1];
  expect(hidden.binding->active() && hidden.binding->saved_bytes == kBatch * kHidden * 2,
         fmt::format("layer {} kept {} bytes through half_saved (expected {})", hidden.name, hidden.binding->saved_bytes,
                     kBatch * kHidden * 2));
  expect(!bound[2].binding->active(), "the exact head runs its plain ops");
  std::printf("%s\n", ok ? "custom_pipeline: OK" : "custom_pipeline: FAILED");
  return ok ? 0 : 1;
}
