// The trainer on CUDA with step graphs (train.cuda_graph; cuda/graph.h): on a small synthetic MNIST-layout
// dataset, a run whose steps are recorded and replayed logs the same losses as the same run without graphs
// (an MLP with AdamW, clipping and a multistep schedule: identical kernels, so to rounding; a ResNet-18 with
// batch norm in bf16: close, cuDNN sums in its own order), and steps that draw noise or masks (HLQ, dropout, drop
// path) replay the eager run's.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// batch 16: 4 steps per epoch (test::idx8_dataset).
fs::path temp_dir() { return test::scratch_dir(); }
fs::path data_dir() { return test::idx8_dataset(); }

TrainerConfig make_config(const std::string& name, std::vector<std::string> sets) {
  const std::string yaml = fmt::format(
      "run:\n  seed: 3\ndata:\n  dataset: mnist\n  root: {}\n  batch_size: 16\n  eval_batch_size: 16\n"
      "  num_workers: 0\ntrain:\n  device: cuda\n  epochs: 3\n  log_every: 1\n",
      data_dir().string());
  sets.insert(sets.begin(), {"run.name=" + name, "run.out_dir=" + (temp_dir() / name).string()});
  return read_trainer_config(ConfigReader::from_string(yaml, "gpu_trainer_test.yaml", sets));
}

// step -> (loss, grad_norm or NaN) of a run's train records.
std::map<int64_t, std::pair<double, double>> losses(const TrainerConfig& c) {
  std::ifstream in(fs::path(c.run.out_dir) / "metrics.jsonl");
  REQUIRE(in.good());
  std::map<int64_t, std::pair<double, double>> out;
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j.at("type") != "train") continue;
    const double gn = j.contains("grad_norm") ? j.at("grad_norm").get<double>() : std::nan("");
    out[j.at("step").get<int64_t>()] = {j.at("loss").get<double>(), gn};
  }
  return out;
}

// The run's --set list plus train.cuda_graph=g.
std::vector<std::string> with_graph(std::vector<std::string> sets, const std::string& g) {
  sets.push_back("train.cuda_graph=" + g);
  return sets;
}

// The run `<name>_graph` with train.cuda_graph true (a refused recording would throw) and `<name>_eager` with false,
// 12 steps each: their train records.
struct GraphAndEager {
  std::map<int64_t, std::pair<double, double>> graph, eager;
};
GraphAndEager graph_and_eager(const std::string& name, const std::vector<std::string>& sets) {
  const TrainerConfig graph = make_config(name + "_graph", with_graph(sets, "true"));
  const TrainerConfig eager = make_config(name + "_eager", with_graph(sets, "false"));
  REQUIRE(run_training(graph).steps == 12);
  REQUIRE(run_training(eager).steps == 12);
  GraphAndEager r{losses(graph), losses(eager)};
  REQUIRE(r.graph.size() == 12);
  REQUIRE(r.eager.size() == 12);
  return r;
}

}  // namespace

TEST_CASE("trainer: replayed MLP steps (AdamW, clipping, multistep) log the eager losses", "[gpu][trainer][graph]") {
  const std::vector<std::string> mlp = {"model.name=mlp",        "model.hidden=[32]",    "optim.name=adamw",
                                        "optim.lr=3e-3",         "optim.weight_decay=0.05",
                                        "optim.clip_grad_norm=0.5", "schedule.name=multistep",
                                        "schedule.milestones=[1.5, 2.25]", "schedule.gamma=0.5"};
  auto with = [&](const std::string& g) { return with_graph(mlp, g); };
  const TrainerConfig graph = make_config("mlp_graph", with("true"));  // a refused recording would throw
  const TrainerConfig eager = make_config("mlp_eager", with("false"));
  const TrainResult a = run_training(graph), b = run_training(eager);
  REQUIRE(a.steps == 12);
  REQUIRE(b.steps == 12);
  const auto la = losses(graph), lb = losses(eager);
  REQUIRE(la.size() == 12);
  REQUIRE(lb.size() == 12);
  CHECK(la.at(1).first != la.at(12).first);  // the loss moves
  for (int64_t s = 1; s <= 12; ++s) {  // steps 4..12 were replayed (3 eager warm-up steps, then recorded)
    INFO("step " << s);
    CHECK(la.at(s).first == Approx(lb.at(s).first).epsilon(1e-6));
    CHECK(la.at(s).second == Approx(lb.at(s).second).epsilon(1e-6));  // the clipped norm, read on logging
  }
  CHECK(a.last_eval.count("correct") == b.last_eval.count("correct"));
}

TEST_CASE("trainer: replayed ResNet-18 steps (bf16, batch norm, channels last) track the eager run",
          "[gpu][trainer][graph]") {
  const std::vector<std::string> resnet = {"model.name=resnet18", "model.stem=cifar", "train.precision=bf16",
                                           "optim.lr=0.05", "optim.momentum=0.9", "optim.weight_decay=5e-4"};
  const auto [la, lb] = graph_and_eager("resnet", resnet);
  for (int64_t s = 1; s <= 12; ++s) {
    INFO("step " << s << ": graph " << la.at(s).first << ", eager " << lb.at(s).first);
    CHECK(std::isfinite(la.at(s).first));
    // bf16 forward, cuDNN's atomics: the runs drift apart slowly; a wrong learning rate, a missed update or a
    // stale batch moves the loss by far more
    CHECK(std::abs(la.at(s).first - lb.at(s).first) <= 5e-2 * std::abs(lb.at(s).first));
  }
}

TEST_CASE("trainer: steps with dropout and drop path are recorded and replay the eager run's masks",
          "[gpu][trainer][graph]") {
  // The run's dropout generator is keyed by the step clock's device word (Note [Step-keyed streams]): a recorded
  // step draws each step's own masks, so the losses equal the eager run's to rounding. A graph that replayed the
  // recorded step's masks, or drew other ones, moves the losses by far more than 1e-5.
  const std::vector<std::string> vit = {"model.name=vit", "model.patch_size=4", "model.dim=16", "model.depth=2",
                                        "model.heads=2",  "model.mlp_ratio=2",  "model.dropout=0.2",
                                        "model.drop_path=0.3", "optim.name=adamw", "optim.lr=3e-3"};
  const auto [la, lb] = graph_and_eager("vit_dropout", vit);
  for (int64_t s = 1; s <= 12; ++s) {
    INFO("step " << s << ": graph " << la.at(s).first << ", eager " << lb.at(s).first);
    CHECK(la.at(s).first == Approx(lb.at(s).first).epsilon(1e-5));
  }
}

TEST_CASE("trainer: HLQ steps are recorded and replay the eager run's noise", "[gpu][trainer][graph]") {
  // The quantisers read the step from the clock's device word (Note [Pipeline noise]), so the recorded step
  // draws each step's own stochastic-rounding noise: the losses equal the eager run's to rounding. A graph
  // that replayed one step's noise, or a wrong step, changes the 4-bit g_x and the 8-bit g_w quantisation
  // and moves the losses by far more than 1e-5.
  const std::vector<std::string> mlp = {"model.name=mlp", "model.hidden=[64]", "optim.name=sgd", "optim.lr=0.05",
                                        "optim.momentum=0.9", "grad_pipeline.default.name=hlq"};
  const auto [la, lb] = graph_and_eager("hlq", mlp);
  CHECK(la.at(1).first != la.at(12).first);
  for (int64_t s = 1; s <= 12; ++s) {
    INFO("step " << s << ": graph " << la.at(s).first << ", eager " << lb.at(s).first);
    CHECK(la.at(s).first == Approx(lb.at(s).first).epsilon(1e-6));
  }
}

TEST_CASE("trainer: evaluations between replayed steps (train.eval_every_steps) leave the graph's steps as eager",
          "[gpu][trainer][graph]") {
  // Evaluations every 2 steps: after steps 2, 6 and 10 inside an epoch, between replays of the recorded step, and at
  // the epoch ends (steps 4, 8, 12). An evaluation runs eagerly on the step stream in eval mode (dropout off); the
  // replays after it must still draw their own masks in train mode and update the same weights, so the train losses
  // and every evaluation equal the eager run's to rounding. A replay that read memory the evaluation reused, or an
  // evaluation under the recorded step's mode, moves them by far more.
  const std::vector<std::string> vit = {"model.name=vit", "model.patch_size=4", "model.dim=16", "model.depth=2",
                                        "model.heads=2",  "model.mlp_ratio=2",  "model.dropout=0.2",
                                        "optim.name=adamw", "optim.lr=3e-3",   "train.eval_every_steps=2"};
  const auto [la, lb] = graph_and_eager("vit_eval_steps", vit);
  for (int64_t s = 1; s <= 12; ++s) {
    INFO("step " << s << ": graph " << la.at(s).first << ", eager " << lb.at(s).first);
    CHECK(la.at(s).first == Approx(lb.at(s).first).epsilon(1e-5));
  }
  // step -> test_loss of each run's eval records
  auto evals = [](const std::string& name) {
    std::ifstream in(temp_dir() / name / "metrics.jsonl");
    std::map<int64_t, double> out;
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.at("type") == "eval") out[j.at("step").get<int64_t>()] = j.at("test_loss").get<double>();
    }
    return out;
  };
  const auto ea = evals("vit_eval_steps_graph"), eb = evals("vit_eval_steps_eager");
  REQUIRE(ea.size() == 6);
  REQUIRE(eb.size() == 6);
  for (const auto& [step, loss] : eb) {
    INFO("evaluation at step " << step);
    REQUIRE(ea.count(step) == 1);
    CHECK(ea.at(step) == Approx(loss).epsilon(1e-5));
  }
  CHECK(ea.at(2) != ea.at(12));  // the evaluations see the weights move
}
