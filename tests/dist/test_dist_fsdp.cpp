// Sharded data parallelism (dist/fsdp.h) with Gloo and 2 and 4 processes: the MLP of test_dist_ddp.cpp with
// two FSDP units, each rank holding 1/N of every parameter and of the optimiser state. Every rank also
// trains the model alone on the whole batch (the reference) and compares:
//   - per-step losses and the gathered final weights within 1e-5 relative (same products, other summation
//     order), f32 reduce-scatter, prefetch on;
//   - bf16 reduce-scatter: within 2e-2 and half the reduce-scatter bytes;
//   - global-norm clipping across shards: the norm equals the reference's;
//   - a sharded checkpoint written by 2 ranks after epoch 1, consolidated in one process and loaded by 4
//     ranks, trains epoch 2 to the reference's weights (resume on another world size).
#include <cmath>

#include "dist_testing.h"
#include "hadatrain/data/mnist.h"
#include "hadatrain/dist/data_parallel.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using ht::test::expect;

namespace {

struct Run {
  std::vector<double> losses, norms;
  std::map<std::string, Tensor> state;
  int64_t bytes_first_step = 0;
};

std::shared_ptr<nn::Module> make_mlp() {
  Generator gen(1234);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(64, 33, nn::Bias::yes, gen));  // 33: chunks with padding
  m->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
  m->push_back(std::make_shared<nn::Linear>(33, 10, nn::Bias::yes, gen));
  return m;
}

struct RunOptions {
  DType reduce_dtype = DType::f32;
  double clip = 0.0;
  int first_epoch = 0, epochs = 2;
  std::optional<dist::ConsolidatedState> resume_from;
  std::string save_sharded_to;  // after the last epoch
};

// `comm` null: one process, whole batches, plain training.
Run train(dist::Communicator* comm, const RunOptions& o) {
  auto data = std::make_shared<const data::MnistData>(data::load_mnist(test::idx8_dataset(), data::MnistSplit::train));
  data::DataLoader loader(std::make_shared<data::MnistDataset>(data), {.batch_size = 16, .num_workers = 0, .seed = 7},
                          {.epoch = o.first_epoch, .batch = 0});
  auto model = make_mlp();
  auto store = nn::ParameterStore::attach(*model);
  std::unique_ptr<dist::FullyShardedModel> fsdp;
  std::shared_ptr<nn::ParameterStore> opt_store = store;
  if (comm) {
    fsdp = std::make_unique<dist::FullyShardedModel>(
        *comm, store, dist::FsdpOptions{.units = {"1.", "3."}, .reduce_dtype = o.reduce_dtype, .prefetch = true});
    opt_store = fsdp->shard_store();
    expect(fsdp->units() == 2, "two units");
    for (const auto& p : fsdp->params())
      expect(p.shard.numel() == (p.numel + comm->size() - 1) / comm->size(), "each rank holds 1/N of " + p.name);
  }
  auto opt = optim::make_sgd(opt_store, {.momentum = 0.9, .weight_decay = 1e-3});
  if (o.resume_from) {
    if (fsdp) {
      fsdp->load_full_state(o.resume_from->model);
      fsdp->load_full_optimizer_state(o.resume_from->optimizer);
    } else {
      store->load_state_dict(o.resume_from->model);
      store->load_state_tensors(o.resume_from->optimizer);
    }
  }
  Run run;
  for (int e = o.first_epoch; e < o.first_epoch + o.epochs; ++e) {
    while (auto batch = loader.next()) {
      opt->zero_grad();
      data::Batch mine = *batch;
      double share = 1.0;
      if (comm) {
        const auto s = data::row_slice(batch->size(), comm->rank(), comm->size());
        mine = data::slice_rows(*batch, s);
        share = static_cast<double>(s.rows) / static_cast<double>(batch->size());
        fsdp->set_share(share);
      }
      const Tensor loss = cross_entropy(model->forward(mine.at(data::batch_key::image)), mine.at(data::batch_key::label));
      loss.backward();
      Tensor global = full({1}, loss.item() * share, {DType::f64});
      if (comm) comm->all_reduce(global, dist::ReduceOp::sum)->wait();
      run.losses.push_back(global.item());
      if (o.clip > 0) run.norms.push_back(fsdp ? fsdp->clip_grad_norm(o.clip) : optim::clip_grad_norm(opt->params(), o.clip));
      opt->step(0.1);
      if (fsdp) {
        if (run.bytes_first_step == 0) run.bytes_first_step = fsdp->bytes_on_wire();
        fsdp->end_step();
      }
    }
  }
  run.state = fsdp ? fsdp->full_state() : store->state_dict();
  if (fsdp && !o.save_sharded_to.empty()) fsdp->save_sharded(o.save_sharded_to);
  return run;
}

void compare_runs(const Run& got, const Run& ref, double rtol, const std::string& what) {
  expect(got.losses.size() == ref.losses.size(), what + ": as many steps as the reference");
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    expect(std::abs(got.losses[i] - ref.losses[i]) <= rtol * std::abs(ref.losses[i]),
           fmt::format("{}: step {} loss {:.17g}, alone {:.17g}", what, i + 1, got.losses[i], ref.losses[i]));
  for (std::size_t i = 0; i < ref.norms.size(); ++i)
    expect(std::abs(got.norms[i] - ref.norms[i]) <= 1e-5 * ref.norms[i],
           fmt::format("{}: step {} gradient norm {} across shards, {} alone", what, i + 1, got.norms[i], ref.norms[i]));
  for (const auto& [name, t] : ref.state) {
    const std::string diff = test::compare(got.state.at(name), t, rtol, rtol * 1e-2);
    expect(diff.empty(), fmt::format("{}: final {} differs from the reference: {}", what, name, diff));
  }
}

dist::ProcessGroup connect(const dist::DistEnv& env) {
  return dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
}

}  // namespace

TEST_CASE("fsdp on 2 and 4 processes equals one process", "[dist]") {
  test::idx8_dataset();
  for (int world : {2, 4}) {
    const auto out = ht::test::run_ranks(world, [](const dist::DistEnv& env) {
      auto pg = connect(env);
      compare_runs(train(pg.comm.get(), {}), train(nullptr, {}), 1e-5, "f32 reduce-scatter");
      pg.comm->barrier();
    });
    INFO(world << " ranks, exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
}

TEST_CASE("fsdp with a bf16 reduce-scatter and clipping across shards", "[dist]") {
  test::idx8_dataset();
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env);
    const Run f32 = train(pg.comm.get(), {.clip = 0.5});
    compare_runs(f32, train(nullptr, {.clip = 0.5}), 1e-5, "clipped");
    const Run bf16 = train(pg.comm.get(), {.reduce_dtype = DType::bf16});
    compare_runs(bf16, train(nullptr, {}), 2e-2, "bf16 reduce-scatter");
    // All-gathers (f32 shards) are the same; the reduce-scatter inputs are half the bytes.
    expect(bf16.bytes_first_step < f32.bytes_first_step,
           fmt::format("bf16 sends fewer bytes: {} vs {}", bf16.bytes_first_step, f32.bytes_first_step));
    pg.comm->barrier();
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("a sharded checkpoint of 2 ranks resumes on 4", "[dist]") {
  test::idx8_dataset();
  const auto dir = test::scratch_dir() / "fsdp_sharded";
  const auto saved = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    auto pg = connect(env);
    train(pg.comm.get(), {.epochs = 1, .save_sharded_to = dir.string()});
    pg.comm->barrier();
  });
  REQUIRE(ht::test::all_passed(saved));
  REQUIRE(std::filesystem::exists(dir / "shard-0-of-2.safetensors"));
  REQUIRE(std::filesystem::exists(dir / "shard-1-of-2.safetensors"));
  const auto resumed = ht::test::run_ranks(4, [&](const dist::DistEnv& env) {
    const dist::ConsolidatedState whole = dist::consolidate_sharded(dir);  // one process, no communicator
    expect(whole.world_size == 2, "written by 2 ranks");
    expect(whole.model.at("1.weight").shape() == Shape{33, 64}, "the whole first weight");
    expect(whole.optimizer.count("1.weight.momentum_buffer") == 1, "the momentum is in the checkpoint");
    auto pg = connect(env);
    const Run second = train(pg.comm.get(), {.first_epoch = 1, .epochs = 1, .resume_from = whole});
    const Run ref = train(nullptr, {.epochs = 2});
    Run ref_tail = ref;
    ref_tail.losses.assign(ref.losses.begin() + 4, ref.losses.end());
    compare_runs(second, ref_tail, 1e-5, "resumed on 4 ranks");
    pg.comm->barrier();
  });
  INFO("exit codes " << ht::test::exit_codes(resumed));
  REQUIRE(ht::test::all_passed(resumed));
  std::filesystem::remove(dir / "shard-1-of-2.safetensors");
  REQUIRE_THROWS_WITH(dist::consolidate_sharded(dir), HasSubstr("lacks shard-1-of-2.safetensors (it was written by 2 ranks)"));
  // a shard whose layout metadata is not what hadatrain writes: named by file and key (io/json_metadata.h)
  const auto shard0 = dir / "shard-0-of-2.safetensors";
  io::SafetensorsContents c = io::load_safetensors(shard0);
  io::TensorList tensors(c.tensors.begin(), c.tensors.end());
  c.metadata["hadatrain_fsdp"] = R"({"rank": 0, "world_size": 2})";  // no "shapes"
  io::save_safetensors(shard0, tensors, c.metadata);
  REQUIRE_THROWS_WITH(dist::consolidate_sharded(dir),
                      HasSubstr(shard0.string() + ": the metadata \"hadatrain_fsdp\" is not what hadatrain writes"));
}

TEST_CASE("an fsdp unit prefix that takes no parameter is an error naming it", "[dist]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env);
    auto error = [&](std::vector<std::string> units) {
      auto model = make_mlp();  // parameters 1.weight, 1.bias, 3.weight, 3.bias
      return test::error_of([&] {
        dist::FullyShardedModel(*pg.comm, nn::ParameterStore::attach(*model), {.units = std::move(units)});
      });
    };
    const std::string typo = error({"1.", "layers.3."});
    expect(typo.starts_with("dist.fsdp_units: 'layers.3.' is the start of no parameter name of the model (4 "
                            "parameters, the first '1.weight')"),
           typo);
    const std::string covered = error({"1", "1."});
    expect(covered.starts_with("dist.fsdp_units: '1.' takes no parameter: the earlier prefix '1' takes every name "
                               "it would"),
           covered);
    expect(error({"1.", "3."}).empty(), "prefixes that each take parameters are accepted");
    pg.comm->barrier();
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}
