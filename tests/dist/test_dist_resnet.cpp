// ResNet-18 (cifar stem) through `hadatrain train` on a tiny image set (8x8 MNIST-layout, tests/support's
// idx8), Gloo, ranks forked with the launcher's variables: dist.mode fsdp (one unit per stage) against
// dist.mode ddp on the same ranks.
//
// Batch norm computes its statistics over each rank's rows under both modes (as PyTorch's DDP without
// SyncBatchNorm), so neither is one process's run with the same global batch: the per-rank statistics are of
// 8 rows instead of 16, a different function of the batch, not a rounding difference; no tolerance relates
// them, and this test does not compare training with one process (the MLP and LLaMA tests do, without batch
// norm). The evaluation, made with rank 0's statistics, is compared with one process's evaluation of rank 0's
// checkpoint (last test case).
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

// Note [Sharded evaluation]: each rank evaluates its rows of every test batch (here 32 rows: 16 or 8 a rank) with
// rank 0's batch-norm statistics, and the sums are added over the ranks. So every rank logs the same evaluation,
// and it is one process's evaluation of rank 0's checkpoint up to rounding: the f32 forward over 16 rows a batch
// instead of 32 (the products block differently; 5e-8 relative measured) and the order of the sums. The counts
// here are exact. Without rank 0's buffers the ranks would evaluate models with different running statistics.
TEST_CASE("under ddp and fsdp every rank logs one process's evaluation of rank 0's checkpoint", "[dist][trainer]") {
  test::idx8_dataset();
  for (const std::string mode : {"ddp", "fsdp"}) {
    const std::string name = "resnet18_eval_" + mode;
    const fs::path out_dir = test::scratch_dir() / name;
    const auto out = ht::test::run_ranks(
        2,
        [&](const dist::DistEnv& env) {
          set_rank_env(env);
          run_training(config(name, {"dist.mode=" + mode, "dist.engine=gloo", "dist.timeout_s=60",
                                     "train.max_steps=0", "checkpoint.every_epochs=1"}));
        },
        std::chrono::seconds(100));
    INFO(mode << ": exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
    const auto loss0 = values(out_dir, "eval", "test_loss"), loss1 = values(out_dir / "rank1", "eval", "test_loss");
    const auto correct0 = values(out_dir, "eval", "test_correct");
    REQUIRE(loss0.size() == 1);
    CHECK(loss1 == loss0);
    CHECK(values(out_dir / "rank1", "eval", "test_correct") == correct0);
    CHECK(values(out_dir, "eval", "test_total") == std::vector<double>{32});
    const EvalResult one = run_evaluation(config(name, {}), (out_dir / "checkpoints").string());
    INFO(mode << ": ranks " << loss0[0] << ", one process " << one.loss);
    CHECK(std::abs(loss0[0] - one.loss) <= 1e-6 * std::abs(one.loss));
    CHECK(correct0[0] == static_cast<double>(one.count("correct")));
  }
}
