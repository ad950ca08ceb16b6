// ResNet-18 (cifar stem) through `hadatrain train` on a tiny image set (8x8 MNIST-layout, tests/support's
// idx8), Gloo, ranks forked with the launcher's variables: dist.mode fsdp (one unit per stage) against
// dist.mode ddp on the same ranks.
//
// Batch norm computes its statistics over each rank's rows under both modes (as PyTorch's DDP without
// SyncBatchNorm), so neither is one process's run with the same global batch: the per-rank statistics are of
// 8 rows instead of 16, a different function of the batch, not a rounding difference; no tolerance relates
// them, and this test does not compare with one process (the MLP and LLaMA tests do, without batch norm).
// fsdp and ddp compute the same per-rank products and the same share-weighted gradient sums; with 2 ranks a
// sum over ranks is one addition, which does not depend on the order, so the two modes must log the same
// losses and evaluate the same, bit for bit. (Clipping is off: the global norm is summed in another order
// under fsdp, over shards, than under ddp.) With 4 ranks the sums of four gradients are taken in different
// orders (Gloo's ring chunks a ddp bucket and an fsdp parameter differently): within 1e-5 relative.
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dist_testing.h"
#include "dist_trainer_testing.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

TrainerConfig config(const std::string& name, std::vector<std::string> sets) {
  return test::idx8_config(
      "dist_resnet18.yaml",
      "run:\n  seed: 3\n"
      "data:\n  dataset: mnist\n  root: {root}\n  batch_size: 16\n  eval_batch_size: 32\n  num_workers: 0\n"
      "model:\n  name: resnet18\n"
      "optim:\n  name: adamw\n  lr: 0.001\n  weight_decay: 0.01\n"
      "train:\n  epochs: 1\n  max_steps: 2\n  log_every: 1\n",
      name, std::move(sets));
}

using ht::test::set_rank_env;

// The `key` of every record of `type` in <out_dir>/metrics.jsonl, in order.
std::vector<double> values(const fs::path& out_dir, const std::string& type, const std::string& key) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == type) out.push_back(j.at(key).get<double>());
  }
  return out;
}

// Trains on `world` ranks in `mode`; returns the run's folder (rank 0's).
fs::path train_ranks(int world, const std::string& mode) {
  const std::string name = fmt::format("resnet18_{}{}", mode, world);
  const fs::path out_dir = test::scratch_dir() / name;
  const auto out = ht::test::run_ranks(
      world,
      [&](const dist::DistEnv& env) {
        set_rank_env(env);
        run_training(config(name, {"dist.mode=" + mode, "dist.engine=gloo", "dist.timeout_s=60"}));
      },
      std::chrono::seconds(100));
  INFO(name << ": exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  return out_dir;
}

}  // namespace

TEST_CASE("ResNet-18 under fsdp logs ddp's losses: bit for bit on 2 ranks, within 1e-5 on 4", "[dist][fsdp][trainer]") {
  test::idx8_dataset();  // made before the fork, once for every rank
  for (const int world : {2, 4}) {
    const fs::path fsdp = train_ranks(world, "fsdp"), ddp = train_ranks(world, "ddp");
    const double rtol = world == 2 ? 0.0 : 1e-5;
    for (const auto& [type, key] : std::vector<std::pair<std::string, std::string>>{{"train", "loss"}, {"eval", "test_loss"}}) {
      const auto got = values(fsdp, type, key), expected = values(ddp, type, key);
      REQUIRE(got.size() == (type == "train" ? 2u : 1u));
      REQUIRE(got.size() == expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(world << " ranks, " << type << " " << key << " " << i + 1 << ": fsdp " << got[i] << ", ddp " << expected[i]);
        CHECK(std::abs(got[i] - expected[i]) <= rtol * std::abs(expected[i]));
      }
    }
    const auto losses = values(fsdp, "train", "loss");
    CHECK(losses.front() != losses.back());  // the updates reach the shards and are gathered again
  }
}
