// HALO training an LLaMA on CUDA through the trainer (configs/llm/sotu_pretrain_small.yaml made tiny, the text
// fixtures, the seven projections "*_proj" through HALO, lm_head exact): with train.cuda_graph true the step is
// recorded into a CUDA graph (true stops the run with the reason when a step cannot be recorded, e.g. a host
// synchronisation), and the replayed steps log the eager run's losses; with activation checkpointing too; and a
// LoRA run whose frozen base runs HALO-2 records and replays likewise, as does HLQ on every projection.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {


TrainerConfig tiny_halo(const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"train.device=cuda", "train.precision=bf16", "train.max_steps=8", "data.seq_len=32",
                                   "data.batch_size=8", "grad_pipeline.layers.*_proj.name=halo"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::tiny_lm_run(test::scratch_dir() / "gpu_halo_llama" / name, sets);
}

std::map<int64_t, double> losses(const TrainerConfig& c) {
  std::ifstream in(fs::path(c.run.out_dir) / "metrics.jsonl");
  REQUIRE(in.good());
  std::map<int64_t, double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "train") out[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  }
  return out;
}

// The graph run (steps 4..8 replayed) against the eager run: the same kernels, so the same losses up to the
// order of the model's floating-point atomics (HALO's own absmax is an exact max).
void check_same_losses(const TrainerConfig& graph, const TrainerConfig& eager) {
  const auto g = losses(graph), e = losses(eager);
  REQUIRE(g.size() == 8);
  REQUIRE(e.size() == 8);
  for (const auto& [step, l] : e) {
    INFO("step " << step);
    CHECK(std::isfinite(l));
    CHECK(std::abs(g.at(step) - l) <= 1e-3 * std::abs(l));
  }
}

}  // namespace

TEST_CASE("a HALO-2 fp8 LLaMA step records into a CUDA graph and replays the eager losses", "[halo_gpu][llama]") {
  const std::vector<std::string> halo = {"grad_pipeline.layers.*_proj.level=2", "grad_pipeline.layers.*_proj.carrier=fp8"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), halo.begin(), halo.end());
    return v;
  };
  const TrainerConfig eager = tiny_halo("fp8_eager", with({"train.cuda_graph=false"}));
  run_training(eager);
  const TrainerConfig graph = tiny_halo("fp8_graph", with({"train.cuda_graph=true"}));
  const TrainResult r = run_training(graph);  // cuda_graph true: a step that cannot be recorded is an error
  CHECK(std::isfinite(r.last_eval.loss));
  check_same_losses(graph, eager);
  const auto l = losses(graph);
  CHECK(l.at(8) < l.at(1));  // it trains
}

TEST_CASE("HALO-0/1/2 int8 LLaMA steps with activation checkpointing record into a CUDA graph", "[halo_gpu][llama]") {
  for (const char* level : {"0", "1", "2"}) {
    INFO("level " << level);
    const std::string lv = std::string("grad_pipeline.layers.*_proj.level=") + level;
    const TrainerConfig eager = tiny_halo(std::string("int8_eager_") + level, {lv, "train.cuda_graph=false"});
    run_training(eager);
    const TrainerConfig graph = tiny_halo(std::string("int8_graph_ckpt_") + level,
                                          {lv, "train.cuda_graph=true", "model.activation_checkpointing=true"});
    run_training(graph);
    check_same_losses(graph, eager);  // checkpointing repeats HALO's products exactly
  }
}

TEST_CASE("a LoRA run whose frozen base runs HALO-2 records into a CUDA graph", "[halo_gpu][llama][lora]") {
  const std::vector<std::string> lora = {"model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0",
                                         "model.lora.target_modules=[q_proj, v_proj, down_proj]"};
  std::vector<std::string> e = lora, g = lora;
  e.push_back("train.cuda_graph=false");
  g.push_back("train.cuda_graph=true");
  const TrainerConfig eager = tiny_halo("lora_eager", e);
  run_training(eager);
  const TrainerConfig graph = tiny_halo("lora_graph", g);
  run_training(graph);
  check_same_losses(graph, eager);
}

// HLQ on every projection: the RMSNorm and SwiGLU outputs are rebuilt and the attention output is shared (Notes
// [Rebuilt inputs], [Shared saved inputs]), and backward compresses them before g_w's chain forks to the side stream
// (Note [HLQ's two chains]; at 32 tokens HLA projects, n 32, so g_w's whole chain runs there). Recorded, with and
// without activation checkpointing (which rebuilds the block and so the inputs), the replayed steps log the eager
// run's losses; with `overlap: false` (one stream) the eager losses are the same.
TEST_CASE("an HLQ LLaMA step with rebuilt and shared inputs records into a CUDA graph, with and without checkpointing",
          "[gpu][llama]") {
  const std::string hlq = "grad_pipeline.layers.*_proj.name=hlq";
  const TrainerConfig eager = tiny_halo("hlq_eager", {hlq, "train.cuda_graph=false"});
  run_training(eager);
  const TrainerConfig serial =
      tiny_halo("hlq_serial", {hlq, "train.cuda_graph=false", "grad_pipeline.layers.*_proj.overlap=false"});
  run_training(serial);
  check_same_losses(serial, eager);
  for (const bool ckpt : {false, true}) {
    INFO("activation checkpointing " << ckpt);
    const std::string checkpointing = std::string("model.activation_checkpointing=") + (ckpt ? "true" : "false");
    const TrainerConfig graph =
        tiny_halo(ckpt ? "hlq_graph_ckpt" : "hlq_graph", {hlq, "train.cuda_graph=true", checkpointing});
    run_training(graph);
    check_same_losses(graph, eager);
  }
  const auto l = losses(eager);
  CHECK(l.at(8) < l.at(1));  // it trains
}
