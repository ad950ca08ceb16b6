// LoRA on a tiny LLaMA: peft's names, a fresh adapter changes nothing, merged equals unmerged, the frozen base
// gets no gradient and no optimiser state, a merged model writes a plain HF checkpoint that loads back to the
// same logits, and a pattern that selects nothing is an error.
#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/init.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"

using namespace ht;
using models::Llama;
using models::LlamaConfig;

namespace {

struct LoraModel {
  std::shared_ptr<nn::LoraFactory> factory;
  std::shared_ptr<Llama> model;
};

LoraModel lora_llama(const LlamaConfig& c, const nn::LoraConfig& lc, uint64_t seed) {
  LoraModel r;
  r.factory = std::make_shared<nn::LoraFactory>(lc, std::make_shared<Generator>(seed + 100), nullptr);
  Generator gen(seed);
  r.model = std::make_shared<Llama>(c, models::LlamaBuild{models::LlamaInit::normal, &gen, r.factory->factory(),
                                                           DType::f64});
  r.factory->check_targets();
  return r;
}

std::shared_ptr<Llama> plain_llama(const LlamaConfig& c, uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<Llama>(c, models::LlamaBuild{models::LlamaInit::normal, &gen, {}, DType::f64});
}

Tensor ids() { return from_vector(std::vector<int64_t>{1, 5, 9, 33, 2, 77, 120, 64, 3, 4}, {2, 5}, {DType::i64}); }

}  // namespace

TEST_CASE("LoRA layers carry peft's names and a fresh adapter changes nothing", "[lora]") {
  const LlamaConfig c = LlamaConfig::tiny();
  nn::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  LoraModel lm = lora_llama(c, lc, 1);
  CHECK(lm.factory->wrapped().size() == 2u * static_cast<std::size_t>(c.num_hidden_layers));
  std::map<std::string, Shape> names;
  for (auto& [n, t] : lm.model->named_parameters()) names[n] = t->shape();
  CHECK(names.at("model.layers.1.self_attn.q_proj.lora_A.weight") == Shape{4, 64});
  CHECK(names.at("model.layers.1.self_attn.q_proj.lora_B.weight") == Shape{64, 4});
  CHECK(names.at("model.layers.0.self_attn.v_proj.lora_B.weight") == Shape{32, 4});
  CHECK(names.at("model.layers.0.self_attn.v_proj.weight") == Shape{32, 64});
  CHECK(names.count("model.layers.0.self_attn.k_proj.lora_A.weight") == 0);
  CHECK(nn::lora_state_dict(*lm.model).size() == 4u * static_cast<std::size_t>(c.num_hidden_layers));
  // The same init generator without LoRA gives the same base weights: B = 0 leaves the logits unchanged.
  auto plain = plain_llama(c, 1);
  NoGradGuard ng;
  CHECK(test::compare(lm.model->forward(ids()), plain->forward(ids()), 0, 0) == "");
}

TEST_CASE("LoRA merged equals unmerged, and the merged model writes a plain HF checkpoint", "[lora]") {
  LlamaConfig c = LlamaConfig::tiny();
  nn::LoraConfig lc;
  lc.rank = 3;
  lc.alpha = 5;
  lc.target_modules = {"q_proj", "self_attn.v_proj", "down_proj", "lm_head"};
  LoraModel lm = lora_llama(c, lc, 2);
  Generator g(9);
  for (auto& [name, l] : nn::lora_layers(*lm.model)) nn::init::normal_(l->lora_B->weight, 0.0, 0.1, g);
  NoGradGuard ng;
  const Tensor unmerged = lm.model->forward(ids());
  CHECK_THROWS_WITH(models::hf_state_dict(*lm.model), HasSubstr("not merged"));
  CHECK(nn::merge_lora(*lm.model) == 2 * c.num_hidden_layers + c.num_hidden_layers + 1);
  const Tensor merged = lm.model->forward(ids());
  CHECK(test::compare(merged, unmerged, 1e-12, 1e-12) == "");
  CHECK(test::compare(merged, plain_llama(c, 2)->forward(ids()), 1e-3, 1e-3) != "");  // the adapters did change it

  test::TempDir tmp("lora_merged");
  models::HfWriteOptions o;
  o.dtype = DType::f32;
  models::save_hf_checkpoint(tmp.path, *lm.model, o);
  auto back = models::load_hf_llama(tmp.path, {models::LlamaInit::none, nullptr, {}, DType::f64});
  CHECK(nn::lora_layers(*back).empty());
  CHECK(test::compare(back->forward(ids()), merged, 1e-5, 1e-5) == "");  // f32 storage
}

TEST_CASE("LoRA's frozen base gets no gradient and no optimiser state", "[lora]") {
  const LlamaConfig c = LlamaConfig::tiny();
  nn::LoraConfig lc;
  lc.rank = 2;
  lc.dropout = 0.0;
  LoraModel lm = lora_llama(c, lc, 3);
  const int64_t frozen = nn::freeze_non_lora(*lm.model);
  const int64_t all = static_cast<int64_t>(lm.model->named_parameters().size());
  // Everything but the 4 adapters per layer, less the 2 wrapped bases per layer that were frozen already.
  CHECK(frozen == all - 4 * c.num_hidden_layers - 2 * c.num_hidden_layers);
  auto store = nn::ParameterStore::attach(*lm.model);
  auto opt = optim::make_adamw(store, {});
  const Tensor logits = lm.model->forward(ids());  // (2, 5, V)
  const Tensor loss = cross_entropy(reshape(logits, {10, c.vocab_size}), reshape(ids(), {10}));
  loss.backward();
  for (auto& [name, t] : lm.model->named_parameters()) {
    INFO(name);
    const bool adapter = name.find(".lora_") != std::string::npos;
    CHECK(t->grad().defined() == adapter);
  }
  // Every adapter has a gradient (A's is zero while B is), so each gets AdamW's two state tensors.
  opt->step(1e-2);
  const std::map<std::string, Tensor> state = opt->state_tensors();
  CHECK(state.size() == 2u * 4u * static_cast<std::size_t>(c.num_hidden_layers));  // exp_avg, exp_avg_sq
  for (const auto& [name, t] : state) CHECK(name.find(".lora_") != std::string::npos);
}

TEST_CASE("LoRA target patterns: suffix matching and unmatched patterns", "[lora]") {
  CHECK(nn::lora_target_matches("model.layers.0.self_attn.q_proj", "q_proj"));
  CHECK(nn::lora_target_matches("model.layers.0.self_attn.q_proj", "self_attn.q_proj"));
  CHECK(nn::lora_target_matches("lm_head", "lm_head"));
  CHECK_FALSE(nn::lora_target_matches("model.layers.0.self_attn.qq_proj", "q_proj"));
  CHECK_FALSE(nn::lora_target_matches("model.layers.0.self_attn.q_proj", "proj"));
  nn::LoraConfig lc;
  lc.target_modules = {"q_proj", "qproj"};
  CHECK_THROWS_WITH(lora_llama(LlamaConfig::tiny(), lc, 4), HasSubstr("[qproj]"));
  lc.rank = 0;
  CHECK_THROWS_WITH(lc.validate(), HasSubstr("rank"));
}
