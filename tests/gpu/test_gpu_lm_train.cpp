// Language-model training on CUDA (configs/llm/sotu_pretrain_small.yaml made tiny, the text fixtures): the step
// recorded into a CUDA graph with gradient accumulation logs the eager run's losses; activation checkpointing
// leaves them as they are; the first step's loss equals the CPU's; a bf16 run logs its model FLOPs utilisation.
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
using json = nlohmann::json;

namespace {


TrainerConfig tiny_lm(const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"train.device=cuda", "train.max_steps=8", "data.seq_len=32", "data.batch_size=8"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::tiny_lm_run(test::scratch_dir() / "gpu_lm" / name, sets);
}

std::map<int64_t, json> train_records(const TrainerConfig& c) {
  std::ifstream in(fs::path(c.run.out_dir) / "metrics.jsonl");
  REQUIRE(in.good());
  std::map<int64_t, json> out;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.at("type") == "train") out[j.at("step").get<int64_t>()] = j;
  }
  return out;
}

void check_close(const TrainerConfig& a, const TrainerConfig& b, double rtol) {
  const auto x = train_records(a), y = train_records(b);
  REQUIRE(x.size() == 8);
  REQUIRE(y.size() == 8);
  for (const auto& [step, r] : x) {
    INFO("step " << step);
    const double l = r.at("loss").get<double>(), m = y.at(step).at("loss").get<double>();
    CHECK(std::abs(l - m) <= rtol * std::abs(l));
  }
}

}  // namespace

TEST_CASE("an LM step with gradient accumulation recorded into a CUDA graph logs the eager losses", "[lm_gpu]") {
  const TrainerConfig eager = tiny_lm("eager", {"train.cuda_graph=false", "train.grad_accum_steps=2"});
  run_training(eager);
  const TrainerConfig graph = tiny_lm("graph", {"train.cuda_graph=true", "train.grad_accum_steps=2"});
  run_training(graph);
  check_close(graph, eager, 1e-5);  // the same kernels; atomics may sum in another order
  // The same update without accumulation (one pass over the 8 rows).
  const TrainerConfig whole = tiny_lm("whole", {"train.cuda_graph=true"});
  run_training(whole);
  check_close(whole, eager, 1e-4);
}

TEST_CASE("activation checkpointing on CUDA leaves an LM run's losses as they are", "[lm_gpu]") {
  const TrainerConfig plain = tiny_lm("plain", {"train.cuda_graph=false"});
  run_training(plain);
  const TrainerConfig ck = tiny_lm("ckpt", {"train.cuda_graph=false", "model.activation_checkpointing=true"});
  run_training(ck);
  check_close(ck, plain, 1e-6);
  // CPU and CUDA agree on the first step (the same initial weights and batch).
  const TrainerConfig cpu = tiny_lm("cpu", {"train.device=cpu", "train.max_steps=1"});
  run_training(cpu);
  const double l_cpu = train_records(cpu).at(1).at("loss").get<double>();
  const double l_gpu = train_records(plain).at(1).at("loss").get<double>();
  CHECK(std::abs(l_cpu - l_gpu) <= 1e-4 * l_cpu);
}

TEST_CASE("a bf16 LM run on CUDA logs tokens per second and its model FLOPs utilisation", "[lm_gpu]") {
  const TrainerConfig bf16 = tiny_lm("bf16", {"train.precision=bf16", "train.cuda_graph=auto"});
  const TrainResult r = run_training(bf16);
  CHECK(std::isfinite(r.last_eval.loss));
  const auto recs = train_records(bf16);
  const json& last = recs.at(8);
  REQUIRE(last.contains("mfu"));
  REQUIRE(last.contains("tok_per_s"));
  CHECK(last.at("mfu").get<double>() > 0);
  CHECK(last.at("mfu").get<double>() < 1);
  CHECK(last.at("tok_per_s").get<double>() > 0);
}
