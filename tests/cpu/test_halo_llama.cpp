// HALO on the LLaMA model (models/llama.h): layer patterns select the seven projections by their HF names while
// lm_head stays exact; the quantised forward and backward run through the whole model, close to the exact model's
// logits and embedding gradient but not equal to them; and with LoRA adapters on q_proj / v_proj the frozen base
// products run through HALO (g_x only, no weight gradient) while the adapters, which the patterns do not name,
// stay exact and train. The projections that read one input (q, k, v; gate, up) quantise it once.
#include <cmath>
#include <memory>
#include <string>

#include "support/catch.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;

namespace {

grad::PipelineConfig halo_on_projections(int level) {
  grad::PipelineConfig c;  // default exact: embeddings are no Linear, lm_head matches no pattern
  grad::PipelineSpec halo;
  halo.name = "halo";
  halo.options_as<grad::HaloOptions>().level = level;
  for (const char* p : {"*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj", "*.gate_proj", "*.up_proj", "*.down_proj"})
    c.overrides.emplace_back(p, halo);
  return c;
}

std::unique_ptr<models::Llama> tiny_llama(uint64_t seed, const models::LinearFactory& make = {}) {
  Generator gen(seed);
  models::LlamaBuild b;
  b.gen = &gen;
  b.make_linear = make;
  return std::make_unique<models::Llama>(models::LlamaConfig::tiny(), b);
}

double rel_err(const Tensor& a, const Tensor& b) {
  const Tensor d = sub(a.to(DType::f64), b.to(DType::f64));
  return std::sqrt(sum(mul(d, d)).item() / sum(mul(b.to(DType::f64), b.to(DType::f64))).item());
}

Tensor embedding_grad(models::Llama& m) {
  for (const auto& [name, p] : m.named_parameters())
    if (name == "model.embed_tokens.weight") return p->grad();
  FAIL("no model.embed_tokens.weight");
  return {};
}

Tensor token_ids() {
  Generator gen(9);
  return mul(rand({2, 12}, gen), 127.0).to(DType::i64);  // (B, T) ids in [0, 128)
}

}  // namespace

TEST_CASE("halo on LLaMA: patterns select the projections, lm_head stays exact, the quantised model trains close to exact",
          "[halo][llama]") {
  auto exact = tiny_llama(1), halo = tiny_llama(1);
  auto clock = std::make_shared<grad::StepClock>();
  const auto layers = nn::bind_pipelines(*halo, halo_on_projections(2), clock);
  int quantised = 0;
  for (const auto& l : layers) {
    INFO(l.name << ": " << l.pipeline);
    const bool projection = l.name.size() > 5 && l.name.substr(l.name.size() - 5) == "_proj";
    CHECK((l.pipeline.rfind("halo (level 2", 0) == 0) == projection);
    quantised += projection ? 1 : 0;
    if (l.name == "lm_head") CHECK(l.pipeline == "exact");
  }
  CHECK(quantised == 7 * 2);  // seven projections in each of the two blocks

  const Tensor ids = token_ids();
  // q, k and v share one Q(x·H) of their input, gate and up another (Note [Shared product inputs]): per block
  // four quantisations of an input (those two, o_proj's and down_proj's) and three reuses
  int quantised_x = 0, shared_x = 0;
  grad::set_halo_phase_hook([&](const char* phase) {
    quantised_x += std::string(phase) == "fwd Q(x·H)";
    shared_x += std::string(phase) == "fwd Q(x·H) shared";
  });
  const Tensor le = exact->forward(ids), lh = halo->forward(ids);  // (B, T, V) logits
  grad::set_halo_phase_hook({});
  CHECK(quantised_x == 4 * 2);
  CHECK(shared_x == 3 * 2);
  const double err = rel_err(lh, le);
  INFO("logits relative error " << err);
  CHECK(err > 0.0);   // the projections' forward is quantised
  CHECK(err < 0.05);  // and int8 HALO-2 stays close
  Generator gen(3);
  const Tensor probe = randn(le.shape(), gen);
  sum(mul(le, probe)).backward();
  sum(mul(lh, probe)).backward();
  for (const auto& [name, p] : halo->named_parameters()) {
    INFO(name);
    REQUIRE(p->grad().defined());
    CHECK(std::isfinite(sum(abs(p->grad())).item()));
  }
  const Tensor ge = embedding_grad(*exact), gh = embedding_grad(*halo);
  INFO("embedding gradient relative error " << rel_err(gh, ge));
  CHECK(rel_err(gh, ge) < 0.2);
}

TEST_CASE("halo with LoRA on LLaMA: the frozen base runs HALO, the adapters stay exact and get gradients",
          "[halo][llama][lora]") {
  nn::LoraConfig lc;
  lc.rank = 4;
  lc.target_modules = {"q_proj", "v_proj"};
  nn::LoraFactory factory(lc, std::make_shared<Generator>(5), std::make_shared<Generator>(6));
  auto model = tiny_llama(2, factory.factory());
  factory.check_targets();
  nn::freeze_non_lora(*model);
  for (auto& [name, lora] : nn::lora_layers(*model)) {  // non-zero B so that the adapters change the output
    NoGradGuard no_grad;
    Generator gen(7);
    copy_(lora->lora_B->weight, mul(randn(lora->lora_B->weight.shape(), gen), 0.02));
  }
  auto clock = std::make_shared<grad::StepClock>();
  const auto layers = nn::bind_pipelines(*model, halo_on_projections(2), clock);
  for (const auto& l : layers) {
    INFO(l.name << ": " << l.pipeline);
    const bool adapter = l.name.find("lora_") != std::string::npos;
    if (adapter) CHECK(l.pipeline == "exact");
    if (l.name.size() > 7 && l.name.substr(l.name.size() - 7) == ".q_proj") CHECK(l.pipeline.rfind("halo", 0) == 0);
  }
  const Tensor logits = model->forward(token_ids());
  Generator gen(8);
  sum(mul(logits, randn(logits.shape(), gen))).backward();
  int adapters_with_grad = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const bool adapter = name.find("lora_") != std::string::npos;
    INFO(name);
    if (adapter) {
      REQUIRE(p->grad().defined());
      CHECK(std::isfinite(sum(abs(p->grad())).item()));
      CHECK(sum(abs(p->grad())).item() > 0.0);
      ++adapters_with_grad;
    } else {
      CHECK_FALSE(p->grad().defined());  // frozen base: HALO computed g_x only
    }
  }
  CHECK(adapters_with_grad == 2 * 2 * 2);  // A and B of q_proj and v_proj in two blocks

  // Note [HALO's frozen weight codes]: from the second step that sees the frozen base unchanged, each of the 14
  // projections (7 in each of two blocks) reuses its codes, with the same logits; a write into one base weight (as
  // a checkpoint load or a LoRA merge makes) has the next step quantise that one again.
  auto step = [&] {
    const Tensor out = model->forward(token_ids());
    sum(mul(out, randn(out.shape(), gen))).backward();
    return out.to(DType::f64).contiguous().to_vector<double>();
  };
  const int64_t before = grad::frozen_weight_uses();
  const auto second = step();
  CHECK(grad::frozen_weight_uses() == before);
  const auto third = step();
  CHECK(grad::frozen_weight_uses() == before + 14);
  CHECK(third == second);
  for (const auto& [name, p] : model->named_parameters())
    if (name == "model.layers.0.mlp.up_proj.weight") {
      NoGradGuard no_grad;
      mul_(*p, 0.5);
    }
  const auto written = step();
  CHECK(grad::frozen_weight_uses() == before + 14 + 13);
  CHECK(written != third);
}
