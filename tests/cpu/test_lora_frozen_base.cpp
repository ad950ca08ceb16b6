// A LoRA model's frozen base held in bf16 (Note [Frozen base in the compute dtype], nn/lora.h) on the CPU:
// with a bf16 forward it trains exactly as the f32 base cast in every step (losses and adapters bit for bit,
// also through HALO and HLQ on the base products) in half the base's bytes; through the trainer
// (train.precision bf16) the checkpoint holds the base in bf16, a resumed run repeats the uninterrupted one's
// losses bit for bit, evaluating the checkpoint gives the run's loss, and merging it writes
// f32(bf16 base) + scaling · B A.
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
namespace fs = std::filesystem;

namespace {

const std::string kRoot = fs::current_path().string();  // tests run in the source root

struct LoraRun {
  std::shared_ptr<nn::LoraFactory> factory;
  std::shared_ptr<models::Llama> model;
};

// The tiny LLaMA with rank-4 adapters on every attention projection, the rest frozen, computing in bf16;
// lora_B starts non-zero so that the adapters matter from the first step.
LoraRun lora_llama() {
  nn::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  LoraRun r;
  r.factory = std::make_shared<nn::LoraFactory>(lc, std::make_shared<Generator>(11), nullptr);
  Generator gen(3);
  r.model = std::make_shared<models::Llama>(models::LlamaConfig::tiny(),
                                            models::LlamaBuild{models::LlamaInit::normal, &gen, r.factory->factory()});
  r.factory->check_targets();
  nn::freeze_non_lora(*r.model);
  Generator bgen(7);
  for (auto& [name, l] : nn::lora_layers(*r.model))
    copy_(l->lora_B->weight.detach(), mul(randn(l->lora_B->weight.shape(), bgen), 0.02));
  r.model->compute_dtype = DType::bf16;
  return r;
}

grad::PipelineConfig base_pipeline(const std::string& name) {
  grad::PipelineConfig c;  // adapters and lm_head stay exact
  grad::PipelineSpec s;
  s.name = name;
  if (name == "halo") s.options_as<grad::HaloOptions>().level = 2;
  for (const char* p : {"*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj", "*.gate_proj", "*.up_proj", "*.down_proj"})
    c.overrides.emplace_back(p, s);
  return c;
}

// `steps` AdamW steps over the adapters on fixed token ids; the losses.
std::vector<double> train_adapters(models::Llama& model, const std::string& pipeline, int steps) {
  auto clock = std::make_shared<grad::StepClock>();
  nn::bind_pipelines(model, base_pipeline(pipeline), clock);
  std::vector<optim::ParamRef> params;
  for (auto& p : optim::make_param_refs(model.named_parameters()))
    if (p.param->requires_grad()) params.push_back(p);
  auto opt = optim::make_adamw(params, {.weight_decay = 0.1});
  Generator gen(9);
  const Tensor ids = mul(rand({2, 12}, gen), 127.0).to(DType::i64);     // (B, T) ids in [0, 128)
  const Tensor labels = mul(rand({24}, gen), 127.0).to(DType::i64);     // (B * T)
  std::vector<double> losses;
  for (int s = 1; s <= steps; ++s) {
    clock->set(s);
    const Tensor logits = reshape(model.forward(ids), {24, model.config.vocab_size});
    const Tensor loss = cross_entropy(logits.to(DType::f32), labels);
    opt->zero_grad();
    loss.backward();
    opt->step(1e-2);
    losses.push_back(loss.item());
  }
  return losses;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && test::compare(a, b, 0.0, 0.0).empty();
}

// configs/llm/moby_dick_finetune_lora.yaml (train.precision bf16) on the tiny LM run's data, from `init_from`,
// rank-4 adapters with dropout on three targets, 2 epochs of at most 6 steps, a checkpoint every 3 steps.
train::TrainerConfig lora_bf16_run(const std::string& name, const fs::path& init_from,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "train.device=cpu", "train.epochs=2", "train.max_steps=6", "train.log_every=1",
      "data.paths=[" + kRoot + "/tests/fixtures/lm_text]", "data.val_fraction=0.25",
      "data.tokenizer=" + kRoot + "/tests/fixtures/lm_char.model",
      "data.cache_dir=" + (test::scratch_dir() / "lm_cache").string(), "data.seq_len=16", "data.batch_size=4",
      "data.eval_batch_size=16", "schedule.warmup_steps=2", "model.init_from=" + init_from.string(),
      "model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.1",
      "model.lora.target_modules=[q_proj,v_proj,down_proj]", "optim.lr=1e-2", "checkpoint.every_epochs=0",
      "checkpoint.every_steps=3", "checkpoint.keep_last=0",
      "run.out_dir=" + (test::scratch_dir() / "lora_bf16" / name).string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  const train::TrainerConfig c = train::load_trainer_config(kRoot + "/configs/llm/moby_dick_finetune_lora.yaml", sets);
  REQUIRE(c.train.precision == train::Precision::bf16);
  return c;
}

}  // namespace

TEST_CASE("a bf16 frozen base trains bit for bit as the f32 base cast in each step, in half the bytes",
          "[lora][frozen_base]") {
  for (const std::string pipeline : {"exact", "halo", "hlq"}) {
    INFO("pipeline " << pipeline);
    LoraRun f32 = lora_llama(), bf16 = lora_llama();
    const nn::FrozenStore fs16 = nn::store_frozen_in(*bf16.model, DType::bf16);
    CHECK(fs16.params == 2 * 7 + 2);  // 7 matrices per layer, the embedding and lm_head
    CHECK(fs16.bytes_after * 2 == fs16.bytes_before);
    std::map<std::string, Tensor*> masters;
    for (auto& [name, t] : f32.model->named_parameters()) masters[name] = t;
    int64_t base_f32 = 0, base_bf16 = 0;
    for (auto& [name, t] : bf16.model->named_parameters()) {
      INFO(name);
      const Tensor& m = *masters.at(name);
      if (t->requires_grad()) {  // an adapter: f32, trains
        CHECK(name.find(".lora_") != std::string::npos);
        CHECK(t->dtype() == DType::f32);
      } else if (t->dim() >= 2) {  // a frozen matrix: the f32 master's bf16 rounding, half its bytes
        CHECK(t->dtype() == DType::bf16);
        CHECK(bitwise_equal(*t, m.to(DType::bf16)));
        CHECK(t->nbytes() * 2 == m.nbytes());
        base_f32 += static_cast<int64_t>(m.nbytes());
        base_bf16 += static_cast<int64_t>(t->nbytes());
      } else {  // norm scales stay f32 (the norm multiplies in its master dtype)
        CHECK(t->dtype() == DType::f32);
      }
    }
    CHECK(base_bf16 == fs16.bytes_after);
    CHECK(base_f32 == fs16.bytes_before);
    CHECK(nn::store_frozen_in(*bf16.model, DType::bf16).params == 0);  // once

    const std::vector<double> expected = train_adapters(*f32.model, pipeline, 4);
    const std::vector<double> got = train_adapters(*bf16.model, pipeline, 4);
    REQUIRE(got.size() == expected.size());
    for (std::size_t s = 0; s < got.size(); ++s) {
      INFO("step " << s + 1);
      CHECK(got[s] == expected[s]);
    }
    CHECK(expected.back() < expected.front());  // it trains
    const auto adapters = nn::lora_state_dict(*bf16.model), reference = nn::lora_state_dict(*f32.model);
    for (const auto& [name, t] : adapters) {
      INFO(name);
      CHECK(bitwise_equal(t, reference.at(name)));
    }
    for (auto& [name, t] : bf16.model->named_parameters()) {
      INFO(name);
      if (!t->requires_grad()) CHECK_FALSE(t->grad().defined());
    }
  }
}

TEST_CASE("a bf16 LoRA run through the trainer: bf16 base in the checkpoint, exact resume, eval and merge",
          "[lora][frozen_base][lm_train]") {
  const train::TrainerConfig base = test::tiny_lm_run(test::scratch_dir() / "lora_bf16" / "base",
                                                                {"train.max_steps=3", "checkpoint.every_steps=3"});
  train::run_training(base);
  const fs::path base_ck = fs::path(base.run.out_dir) / "checkpoints";

  const train::TrainerConfig whole = lora_bf16_run("whole", base_ck);
  train::TrainResult r;
  {
    const test::LogCapture capture;  // info
    r = train::run_training(whole);
    CHECK(capture.str().find("model.init_from: weights of " + (base_ck / "step_3").string()) != std::string::npos);
  }
  REQUIRE(r.steps == 6);
  const auto expected = test::train_losses(whole.run.out_dir);
  const train::TrainerConfig first = lora_bf16_run("resumed", base_ck, {"train.max_steps=3"});
  train::run_training(first);
  const train::TrainerConfig rest = lora_bf16_run("resumed", base_ck);
  train::TrainResult r2;
  {
    // A resumed run reads model.init_from's architecture only: its checkpoint holds every weight, the frozen base
    // included, so the source's weights are not read a second time (16 GB for an 8B base).
    const test::LogCapture capture;
    r2 = train::run_training(rest, {.kind = train::ResumeFrom::Kind::latest});
    INFO(capture.str());
    CHECK(capture.str().find("model.init_from: the architecture of") != std::string::npos);
    CHECK(capture.str().find("model.init_from: weights of") == std::string::npos);
  }
  CHECK(r2.steps == 6);
  const auto got = test::train_losses(rest.run.out_dir);
  REQUIRE(expected.size() == 6);
  for (int64_t s = 1; s <= 6; ++s) {
    INFO("step " << s);
    REQUIRE(got.count(s) == 1);
    CHECK(got.at(s) == expected.at(s));
  }
  CHECK(r2.last_eval.loss == r.last_eval.loss);

  // The checkpoint: frozen matrices in bf16 (the f32 base rounded once), norm scales f32, adapters f32.
  const fs::path ck = fs::path(whole.run.out_dir) / "checkpoints" / "step_6";
  const io::SafetensorsContents before = io::load_safetensors(base_ck / "step_3" / "model.safetensors");
  const io::SafetensorsContents after = io::load_safetensors(ck / "model.safetensors");
  int frozen_matrices = 0;
  for (const auto& [name, t] : after.tensors) {
    INFO(name);
    if (name.find(".lora_") != std::string::npos) {
      CHECK(t.dtype() == DType::f32);
      continue;
    }
    const Tensor& b = before.at(name);
    REQUIRE(b.dtype() == DType::f32);
    if (t.dim() >= 2) {
      CHECK(bitwise_equal(t, b.to(DType::bf16)));
      ++frozen_matrices;
    } else {
      CHECK(bitwise_equal(t, b));
    }
  }
  CHECK(frozen_matrices == 2 * 7 + 2);  // 7 per layer, the embedding and lm_head

  // train.freeze's "!" patterns come after LoRA's rule: an unfrozen base matrix trains and stays an f32 master.
  const train::TrainerConfig unfrozen =
      lora_bf16_run("unfrozen", base_ck, {"train.max_steps=3", "train.freeze=['!model.layers.0.mlp.down_proj.*']"});
  train::run_training(unfrozen);
  const io::SafetensorsContents u =
      io::load_safetensors(fs::path(unfrozen.run.out_dir) / "checkpoints" / "step_3" / "model.safetensors");
  const std::string trained = "model.layers.0.mlp.down_proj.weight";
  CHECK(u.at(trained).dtype() == DType::f32);
  CHECK_FALSE(bitwise_equal(u.at(trained), before.at(trained)));
  const std::string frozen = "model.layers.1.mlp.down_proj.weight";
  CHECK(bitwise_equal(u.at(frozen), before.at(frozen).to(DType::bf16)));

  // Evaluating the checkpoint (f32 slots, the bf16 values copied in exactly) gives the run's last loss.
  const train::EvalResult ev = train::run_evaluation(whole, (fs::path(whole.run.out_dir) / "checkpoints").string());
  CHECK(ev.loss == r.last_eval.loss);

  // Merged: f32(bf16 base) + scaling · B A computed in f32, then written as asked.
  const train::LlamaSource src = train::find_llama_source(ck);
  REQUIRE(src.lora.has_value());
  std::shared_ptr<models::Llama> model = train::load_llama_source(src);
  for (auto& [name, t] : model->named_parameters()) CHECK(t->dtype() == DType::f32);
  CHECK(nn::merge_lora(*model) == 3 * 2);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const fs::path hf = test::scratch_dir() / "lora_bf16" / (dtype == DType::f32 ? "merged_f32" : "merged_bf16");
    models::save_hf_checkpoint(hf, *model, {.dtype = dtype});
    const models::HfWeights w = models::read_hf_weights(hf);
    for (const char* layer : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"}) {
      INFO(layer << " in " << dtype_name(dtype));
      const std::string l = layer;
      const Tensor a = after.at(l + ".lora_A.weight"), b = after.at(l + ".lora_B.weight");
      const Tensor merged = add(after.at(l + ".weight").to(DType::f32), mul(matmul(b, a), 8.0 / 4.0));
      const Tensor& written = w.tensors.at(l + ".weight");
      CHECK(bitwise_equal(written, merged.to(dtype)));
      CHECK_FALSE(bitwise_equal(merged.to(DType::bf16), after.at(l + ".weight")));  // the adapters moved it
    }
    CHECK(w.tensors.count("model.layers.0.self_attn.q_proj.lora_A.weight") == 0);
  }
}
