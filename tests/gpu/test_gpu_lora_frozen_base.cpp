// A LoRA LLaMA's frozen base held in bf16 (Note [Frozen base in the compute dtype], nn/lora.h) on CUDA: the
// training losses and adapters equal those of the f32 base cast in every step (exact products and HALO-2 on
// the base), as on the CPU (tests/cpu/test_lora_frozen_base.cpp): bit for bit when two runs of the f32 form
// agree bit for bit on this device, otherwise to within what those two runs differ by (atomics).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"

using namespace ht;

namespace {

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> adapters;  // on the host
};

// The tiny LLaMA with rank-4 adapters on every projection (lora_B non-zero), the rest frozen, bf16 compute on
// cuda:0, its base in bf16 when `bf16_base`; 4 AdamW steps over the adapters with the base through `pipeline`.
Run train_lora(bool bf16_base, const std::string& pipeline) {
  nn::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  nn::LoraFactory factory(lc, std::make_shared<Generator>(11), nullptr);
  Generator gen(3);
  models::Llama model(models::LlamaConfig::tiny(),
                      models::LlamaBuild{models::LlamaInit::normal, &gen, factory.factory()});
  factory.check_targets();
  nn::freeze_non_lora(model);
  Generator bgen(7);
  for (auto& [name, l] : nn::lora_layers(model))
    copy_(l->lora_B->weight.detach(), mul(randn(l->lora_B->weight.shape(), bgen), 0.02));
  if (bf16_base) REQUIRE(nn::store_frozen_in(model, DType::bf16).params == 2 * 7 + 2);
  model.compute_dtype = DType::bf16;
  const Device dev = Device::cuda(0);
  model.to(dev);
  grad::PipelineConfig pc;
  grad::PipelineSpec s;
  s.name = pipeline;
  if (pipeline == "halo") s.options_as<grad::HaloOptions>().level = 2;
  pc.overrides.emplace_back("*_proj", s);
  auto clock = std::make_shared<grad::StepClock>();
  if (nn::any_draws_noise(nn::bind_pipelines(model, pc, clock))) clock->keep_on_device(dev);
  std::vector<optim::ParamRef> params;
  for (auto& p : optim::make_param_refs(model.named_parameters()))
    if (p.param->requires_grad()) params.push_back(p);
  auto opt = optim::make_adamw(params, {.weight_decay = 0.1});
  Generator dgen(9);
  const Tensor ids = mul(rand({2, 12}, dgen), 127.0).to(DType::i64).to(dev);  // (B, T) ids in [0, 128)
  const Tensor labels = mul(rand({24}, dgen), 127.0).to(DType::i64).to(dev);  // (B * T)
  Run r;
  for (int step = 1; step <= 4; ++step) {
    clock->set(step);
    const Tensor logits = reshape(model.forward(ids), {24, model.config.vocab_size});
    const Tensor loss = cross_entropy(logits.to(DType::f32), labels);
    opt->zero_grad();
    loss.backward();
    opt->step(1e-2);
    r.losses.push_back(loss.to(Device::cpu()).item());
  }
  for (const auto& [name, t] : nn::lora_state_dict(model)) r.adapters[name] = t.to(Device::cpu());
  return r;
}

// The largest relative difference between two runs' losses and adapters.
double run_difference(const Run& a, const Run& b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    d = std::max(d, std::abs(a.losses[i] - b.losses[i]) / std::abs(b.losses[i]));
  for (const auto& [name, t] : a.adapters) d = std::max(d, test::rel_error(t, b.adapters.at(name)));
  return d;
}

}  // namespace

TEST_CASE("a bf16 frozen base trains on CUDA as the f32 base cast in each step", "[lora][frozen_base]") {
  for (const std::string pipeline : {"exact", "halo"}) {
    INFO("pipeline " << pipeline);
    const Run f32 = train_lora(false, pipeline), f32_again = train_lora(false, pipeline);
    const Run bf16 = train_lora(true, pipeline);
    const double noise = run_difference(f32_again, f32);
    INFO("two f32-base runs differ by " << noise << ", the bf16 base by " << run_difference(bf16, f32));
    CHECK(bf16.losses.back() < bf16.losses.front());  // it trains
    if (noise == 0.0) {
      CHECK(bf16.losses == f32.losses);
      for (const auto& [name, t] : bf16.adapters) {
        INFO(name);
        CHECK(test::compare(t, f32.adapters.at(name), 0.0, 0.0) == "");
      }
    } else {
      CHECK(run_difference(bf16, f32) <= 4.0 * noise);
    }
  }
}
