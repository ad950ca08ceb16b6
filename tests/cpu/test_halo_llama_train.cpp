// HALO and HLQ training an LLaMA (models/llama.h) on the CPU: activation checkpointing around the decoder blocks
// leaves a HALO-2 model's loss and every gradient bit-identical (HALO draws no noise and its forward codes
// depend only on the recomputed input, which is the same tensor again); the config pattern "*_proj" selects the
// seven projections of every block for HLQ and HALO while lm_head stays exact (LoRA: test_halo_llama.cpp); and
// trainer runs with HLQ and with HALO-2 on those projections lower the training loss.
#include "support/catch.h"
#include "support/testing.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/autograd/checkpoint.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/causal_lm.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

const std::string kRoot = fs::current_path().string();  // tests run in the source root

std::unique_ptr<models::Llama> tiny_llama() {
  Generator gen(11);
  models::LlamaBuild b;
  b.gen = &gen;
  return std::make_unique<models::Llama>(models::LlamaConfig::tiny(), b);
}

grad::PipelineConfig halo2_on_projections() {
  grad::PipelineConfig c;
  grad::PipelineSpec halo;
  halo.name = "halo";
  halo.options_as<grad::HaloOptions>().level = 2;
  c.overrides.emplace_back("*_proj", halo);
  return c;
}

// The mean next-token loss of a fixed (2, 12) batch, and the gradients it leaves, by parameter name.
std::pair<double, std::map<std::string, Tensor>> loss_and_grads(models::Llama& m) {
  Generator gen(9);
  const Tensor ids = mul(rand({2, 12}, gen), 127.0).to(DType::i64);
  const Tensor logits = m.forward(ids);  // (2, 12, V)
  const Tensor loss = cross_entropy(reshape(logits, {24, logits.size(2)}), reshape(next_token_targets(ids), {24}),
                                    CrossEntropyOptions{});
  loss.backward();
  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : m.named_parameters()) grads[name] = p->grad();
  return {loss.item(), grads};
}

TrainerConfig tiny_run(const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"train.device=cpu", "train.precision=fp32", "train.epochs=4", "train.max_steps=10",
                                   "train.log_every=1", "data.paths=[" + kRoot + "/tests/fixtures/lm_text]",
                                   "data.val_fraction=0.25", "data.tokenizer=" + kRoot + "/tests/fixtures/lm_char.model",
                                   "data.cache_dir=" + (test::scratch_dir() / "lm_cache").string(), "data.seq_len=16",
                                   "data.batch_size=8", "data.eval_batch_size=16", "model.preset=tiny",
                                   "optim.lr=3.0e-3", "schedule.warmup_steps=1", "checkpoint.every_epochs=0",
                                   "checkpoint.every_steps=0",
                                   "run.out_dir=" + (test::scratch_dir() / "halo_llama" / name).string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_trainer_config(kRoot + "/configs/llm/sotu_pretrain_small.yaml", sets);
}

std::vector<double> train_losses(const TrainerConfig& cfg) {
  std::ifstream in(fs::path(cfg.run.out_dir) / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "train") out.push_back(j.at("loss").get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("HALO-2 on LLaMA: activation checkpointing leaves the loss and every gradient bit-identical",
          "[halo][llama][checkpoint]") {
  auto plain = tiny_llama(), ckpt = tiny_llama();
  auto clock = std::make_shared<grad::StepClock>();
  const auto bound_plain = nn::bind_pipelines(*plain, halo2_on_projections(), clock);
  const auto bound_ckpt = nn::bind_pipelines(*ckpt, halo2_on_projections(), clock);
  REQUIRE(bound_plain.size() == bound_ckpt.size());
  // The trainer's runner for model.activation_checkpointing (causal_lm_setup.cpp): each block keeps only its
  // input and runs again in backward.
  int recorded = 0;
  ckpt->block_runner = [&recorded](models::LlamaBlock& block, const Tensor& x, const models::LlamaBlockContext& ctx) {
    ++recorded;
    return checkpoint([&block, ctx](const std::vector<Tensor>& in) { return std::vector<Tensor>{block.forward(in[0], ctx)}; },
                      {x})[0];
  };
  const auto [loss_p, grads_p] = loss_and_grads(*plain);
  const auto [loss_c, grads_c] = loss_and_grads(*ckpt);
  CHECK(recorded == 2);  // both blocks went through the checkpoint
  CHECK(loss_c == loss_p);
  REQUIRE(grads_c.size() == grads_p.size());
  for (const auto& [name, g] : grads_p) {
    INFO(name);
    REQUIRE(g.defined());
    REQUIRE(grads_c.at(name).defined());
    CHECK(sum(abs(g)).item() > 0.0);
    CHECK(max(abs(sub(grads_c.at(name), g))).item() == 0.0);
  }
}

TEST_CASE("grad_pipeline '*_proj': HLQ and HALO-2 on an LLaMA's projections train, lm_head stays exact",
          "[halo][hlq][llama][trainer]") {
  // The pipelines the pattern binds: 7 projections x 2 blocks, and lm_head (untied in the tiny preset) exact.
  for (const char* name : {"hlq", "halo"}) {
    auto m = tiny_llama();
    grad::PipelineConfig c;
    grad::PipelineSpec s;
    s.name = name;
    c.overrides.emplace_back("*_proj", s);
    auto clock = std::make_shared<grad::StepClock>();
    int selected = 0;
    bool head = false;
    for (const auto& l : nn::bind_pipelines(*m, c, clock)) {
      INFO(l.name << ": " << l.pipeline);
      const bool projection = l.name.ends_with("_proj");
      CHECK((l.pipeline.rfind(name, 0) == 0) == projection);
      selected += projection ? 1 : 0;
      if (l.name == "lm_head") head = l.pipeline == "exact";
    }
    CHECK(selected == 14);
    CHECK(head);
  }

  const TrainerConfig exact = tiny_run("exact", {});
  run_training(exact);
  const auto e = train_losses(exact);
  REQUIRE(e.size() == 10);
  for (const char* pipeline : {"hlq", "halo"}) {
    INFO(pipeline);
    const TrainerConfig cfg = tiny_run(pipeline, {std::string("grad_pipeline.layers.*_proj.name=") + pipeline});
    const TrainResult r = run_training(cfg);
    const auto l = train_losses(cfg);
    REQUIRE(l.size() == 10);
    INFO("losses " << l.front() << " ... " << l.back() << ", exact " << e.front() << " ... " << e.back());
    CHECK(l.back() < l.front() - 0.3);                 // it learns
    CHECK(std::abs(l.back() - e.back()) < 0.1 * e.back());  // about as well as exact
    CHECK(std::isfinite(r.last_eval.loss));
  }
}
