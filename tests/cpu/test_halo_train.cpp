// HALO in training, through the public trainer API (run_training, a config built in code): an MLP whose hidden
// Linear runs HALO-2 (selected by a layer pattern, the head exact) learns, its losses differ from exact training
// (the quantised products really ran), and a run stopped mid-epoch and resumed from its checkpoint repeats the
// uninterrupted run's losses bit for bit (HALO rounds to nearest: its products depend on the weights and inputs only).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

// batch 16 over 64 8x8 images: 4 steps per epoch, 3 epochs. The MLP is Flatten "0", Linear "1" (64 -> 32),
// ReLU "2", Linear "3" (32 -> 10): `pipeline` runs layer 1, the head stays exact.
TrainerConfig make_config(const std::string& name, const std::string& pipeline, const std::vector<std::string>& sets) {
  const std::string yaml = fmt::format(
      "run:\n"
      "  seed: 5\n"
      "data:\n"
      "  dataset: mnist\n"
      "  root: {}\n"
      "  batch_size: 16\n"
      "  eval_batch_size: 16\n"
      "  num_workers: 0\n"
      "model: {{name: mlp, hidden: [32]}}\n"
      "optim: {{name: adamw, lr: 1e-2, weight_decay: 0.0}}\n"
      "train:\n"
      "  epochs: 3\n"
      "  log_every: 1\n"
      "  device: cpu\n"
      "checkpoint:\n"
      "  every_steps: 3\n"
      "  keep_last: 0\n"
      "grad_pipeline:\n"
      "  default: {{name: exact}}\n"
      "  layers:\n"
      "    \"1\": {}\n",
      test::idx8_dataset().string(), pipeline);
  std::vector<std::string> all = {"run.name=" + name, "run.out_dir=" + (test::scratch_dir() / name).string()};
  all.insert(all.end(), sets.begin(), sets.end());
  return read_trainer_config(ConfigReader::from_string(yaml, "test_halo_train.yaml", all));
}

double mean_of(const std::map<int64_t, double>& l, int64_t first, int64_t last) {
  double s = 0;
  for (int64_t i = first; i <= last; ++i) s += l.at(i);
  return s / static_cast<double>(last - first + 1);
}

}  // namespace

TEST_CASE("an MLP with a HALO-2 layer learns, and a resumed run repeats its losses bit for bit", "[trainer][halo]") {
  for (const std::string carrier : {"int8", "fp8"}) {
    const std::string halo = fmt::format("{{name: halo, level: 2, carrier: {}}}", carrier);
    const TrainerConfig full = make_config("halo_full_" + carrier, halo, {});
    REQUIRE(run_training(full).steps == 12);
    const auto ref = test::train_losses(full.run.out_dir);
    REQUIRE(ref.size() == 12);
    INFO(carrier << ": first epoch mean loss " << mean_of(ref, 1, 4) << ", last " << mean_of(ref, 9, 12));
    CHECK(mean_of(ref, 9, 12) < 0.8 * mean_of(ref, 1, 4));

    const TrainerConfig exact = make_config("halo_exact_" + carrier, "{name: exact}", {"train.max_steps=4"});
    REQUIRE(run_training(exact).steps == 4);
    CHECK(test::train_losses(exact.run.out_dir).at(1) != ref.at(1));  // the quantised forward changes the first loss already

    const std::string name = "halo_part_" + carrier;
    const TrainerConfig part = make_config(name, halo, {"train.max_steps=5"});
    REQUIRE(run_training(part).steps == 5);
    REQUIRE(io::latest_checkpoint_step(part.checkpoint.dir) == 5);
    run_training(make_config(name, halo, {}), {ResumeFrom::Kind::latest, ""});
    const auto got = test::train_losses(part.run.out_dir);
    REQUIRE(got.size() == 12);
    for (const auto& [step, loss] : ref) {
      INFO(carrier << ": stopped at step 5, resumed; step " << step);
      CHECK(got.at(step) == loss);
    }
  }
}
