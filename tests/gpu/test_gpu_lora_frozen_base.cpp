// A LoRA LLaMA's frozen base held in bf16 (Note [Frozen base in the compute dtype], nn/lora.h) on CUDA computes
// as the f32 base cast in each step (exact products and HALO-2 on the base), as on the CPU
// (tests/cpu/test_lora_frozen_base.cpp, which compares whole runs bit for bit). On CUDA the attention backward adds
// dQ's partial products with fp32 atomics (cuda/kernels/flash_attention.cuh), so two runs of the same model may
// differ in the last bits of every gradient, and HALO's quantisers can turn such a difference into a different
// code, which AdamW then spreads through the adapters: whole runs are not comparable bit for bit, nor within a
// bound set by two f32 runs (their difference may be 0 where the bf16 base's run drew another code). So the two models run in lockstep: before every step the bf16-base
// model takes the f32-base model's adapters; the forward (no atomics) must give the same loss bit for bit, and the
// adapters' gradients must agree up to the atomics' effect (relative error 2 %; a wrong base weight gives
// errors of order one).
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

// The tiny LLaMA with rank-4 adapters on every projection (lora_B non-zero), the rest frozen, bf16 compute on
// cuda:0, its base in bf16 when `bf16_base`; the base products through `pipeline`.
struct Side {
  std::shared_ptr<nn::LoraFactory> factory;
  std::shared_ptr<models::Llama> model;
  std::shared_ptr<grad::StepClock> clock = std::make_shared<grad::StepClock>();
  std::vector<optim::ParamRef> params;  // the adapters
};

Side make_side(bool bf16_base, const std::string& pipeline) {
  nn::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  Side s;
  s.factory = std::make_shared<nn::LoraFactory>(lc, std::make_shared<Generator>(11), nullptr);
  Generator gen(3);
  s.model = std::make_shared<models::Llama>(models::LlamaConfig::tiny(),
                                            models::LlamaBuild{models::LlamaInit::normal, &gen, s.factory->factory()});
  s.factory->check_targets();
  nn::freeze_non_lora(*s.model);
  Generator bgen(7);
  for (auto& [name, l] : nn::lora_layers(*s.model))
    copy_(l->lora_B->weight.detach(), mul(randn(l->lora_B->weight.shape(), bgen), 0.02));
  if (bf16_base) REQUIRE(nn::store_frozen_in(*s.model, DType::bf16).params == 2 * 7 + 2);
  s.model->compute_dtype = DType::bf16;
  const Device dev = Device::cuda(0);
  s.model->to(dev);
  grad::PipelineConfig pc;
  grad::PipelineSpec spec;
  spec.name = pipeline;
  if (pipeline == "halo") spec.options_as<grad::HaloOptions>().level = 2;
  pc.overrides.emplace_back("*_proj", spec);
  if (nn::any_draws_noise(nn::bind_pipelines(*s.model, pc, s.clock))) s.clock->keep_on_device(dev);
  for (auto& p : optim::make_param_refs(s.model->named_parameters()))
    if (p.param->requires_grad()) s.params.push_back(p);
  return s;
}

// Forward and backward of one step; returns the loss (the adapters' gradients are left in place).
double forward_backward(Side& s, int step, const Tensor& ids, const Tensor& labels) {
  s.clock->set(step);
  for (auto& p : s.params) p.param->zero_grad();
  const Tensor logits = reshape(s.model->forward(ids), {24, s.model->config.vocab_size});
  const Tensor loss = cross_entropy(logits.to(DType::f32), labels);
  loss.backward();
  return loss.to(Device::cpu()).item();
}

}  // namespace

TEST_CASE("a bf16 frozen base computes on CUDA as the f32 base cast in each step", "[lora][frozen_base]") {
  for (const std::string pipeline : {"exact", "halo"}) {
    INFO("pipeline " << pipeline);
    Side f32 = make_side(false, pipeline), bf16 = make_side(true, pipeline);
    REQUIRE(f32.params.size() == bf16.params.size());
    auto opt = optim::make_adamw(f32.params, {.weight_decay = 0.1});
    Generator dgen(9);
    const Tensor ids = mul(rand({2, 12}, dgen), 127.0).to(DType::i64).to(Device::cuda(0));  // (B, T) in [0, 128)
    const Tensor labels = mul(rand({24}, dgen), 127.0).to(DType::i64).to(Device::cuda(0));  // (B * T)
    std::vector<double> losses;
    for (int step = 1; step <= 4; ++step) {
      INFO("step " << step);
      for (std::size_t i = 0; i < f32.params.size(); ++i)  // the same adapters on both sides
        copy_(bf16.params[i].param->detach(), f32.params[i].param->detach());
      const double a = forward_backward(f32, step, ids, labels), b = forward_backward(bf16, step, ids, labels);
      CHECK(b == a);  // bit for bit: the forward has no atomics
      for (std::size_t i = 0; i < f32.params.size(); ++i) {
        INFO(f32.params[i].name);
        CHECK(test::rel_error(bf16.params[i].param->grad(), f32.params[i].param->grad()) <= 0.02);
      }
      opt->step(1e-2);
      losses.push_back(a);
    }
    CHECK(losses.back() < losses.front());  // it trains
  }
}
