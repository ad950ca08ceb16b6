// Replicated data parallelism (dist/data_parallel.h) with Gloo and 1, 2 and 4 processes: an MLP trained on
// the 8x8 IDX dataset with SGD and momentum, the global batch cut over the ranks, gradients all-reduced in
// buckets. Every rank also trains the same model alone on the whole batch (the reference) and compares
// (Note [Data-parallel equivalence]):
//   - one rank: bit-equal to the reference (the reducer adds nothing and scales by 1);
//   - 2 and 4 ranks: the per-step global losses and the final weights within 1e-5 relative of the reference
//     (the same products, summed in another order), with uneven slices (a batch of 10 over 4 ranks);
//   - every rank ends with bit-identical weights (all-reduce leaves the same bits everywhere);
//   - the reduction during backward (GradientReducer::arm) gives the reduction after it bit for bit;
//   - a trainable parameter that got no gradient is reduced as exact zeros.
#include <cmath>

#include "dist_testing.h"
#include "hadatrain/autograd/checkpoint.h"
#include "hadatrain/data/mnist.h"
#include "hadatrain/dist/data_parallel.h"
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
  std::vector<double> losses;           // the global batch's mean loss per step
  std::map<std::string, Tensor> state;  // the final weights
};

std::shared_ptr<nn::Module> make_mlp() {
  Generator gen(1234);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(64, 32, nn::Bias::yes, gen));
  m->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
  m->push_back(std::make_shared<nn::Linear>(32, 10, nn::Bias::yes, gen));
  return m;
}

// `comm` null: one process on the whole batch. Otherwise rank comm->rank()'s slice, gradients reduced: during
// the backward with `overlap` (GradientReducer::arm), after it without.
Run train(dist::Communicator* comm, int64_t global_batch, int epochs, bool overlap = false) {
  auto data = std::make_shared<const data::MnistData>(data::load_mnist(test::idx8_dataset(), data::MnistSplit::train));
  auto ds = std::make_shared<data::MnistDataset>(data);
  data::DataLoader loader(ds, {.batch_size = global_batch, .num_workers = 0, .seed = 7});
  auto model = make_mlp();
  auto store = nn::ParameterStore::attach(*model);
  auto opt = optim::make_sgd(store, {.momentum = 0.9, .weight_decay = 1e-3});
  std::unique_ptr<dist::GradientReducer> reducer;
  if (comm) {
    reducer = std::make_unique<dist::GradientReducer>(*comm, *store, dist::GradientReducerOptions{.bucket_mb = 0.004});
    expect(reducer->buckets() > 1, "a 4 KiB bucket cap gives several buckets");
    reducer->broadcast_state(0);
  }
  Run run;
  for (int e = 0; e < epochs; ++e) {
    while (auto batch = loader.next()) {
      opt->zero_grad();
      data::Batch mine = *batch;
      double share = 1.0;
      if (comm) {
        const auto s = data::row_slice(batch->size(), comm->rank(), comm->size());
        mine = data::slice_rows(*batch, s);
        share = static_cast<double>(s.rows) / static_cast<double>(batch->size());
      }
      const Tensor logits = model->forward(mine.at(data::batch_key::image));
      const Tensor loss = cross_entropy(logits, mine.at(data::batch_key::label));
      if (overlap) reducer->arm(share);
      loss.backward();
      Tensor global = full({1}, loss.item() * share, {DType::f64});
      if (comm) {
        reducer->reduce(share);
        // Every parameter's gradient arrives in the backward, so every bucket went out during it.
        if (overlap) expect(reducer->issued_during_backward() == reducer->buckets(), "every bucket issued in backward");
        comm->all_reduce(global, dist::ReduceOp::sum)->wait();
      }
      run.losses.push_back(global.item());
      opt->step(0.1);
    }
  }
  run.state = store->state_dict();
  return run;
}

void check_against_reference(const dist::DistEnv& env, int64_t global_batch, double rtol) {
  auto pg = dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
  const Run ddp = train(pg.comm.get(), global_batch, 2);
  const Run ref = train(nullptr, global_batch, 2);
  expect(ddp.losses.size() == ref.losses.size(), "as many steps as the reference");
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    const double d = std::abs(ddp.losses[i] - ref.losses[i]);
    expect(rtol == 0 ? ddp.losses[i] == ref.losses[i] : d <= rtol * std::abs(ref.losses[i]),
           fmt::format("step {}: loss {:.17g} with {} ranks, {:.17g} alone", i + 1, ddp.losses[i], env.world_size,
                       ref.losses[i]));
  }
  expect(ref.losses.back() < ref.losses.front(), "the reference learns");
  // Note [Reduction during backward]: the same buffers summed in the same order, so the same bits.
  const Run overlapped = train(pg.comm.get(), global_batch, 2, true);
  expect(overlapped.losses == ddp.losses, "the losses with the reduction during backward are bit-equal");
  for (const auto& [name, t] : ddp.state)
    expect(test::compare(overlapped.state.at(name), t, 0, 0).empty(),
           fmt::format("final {} differs with the reduction during backward", name));
  for (const auto& [name, t] : ref.state) {
    const std::string diff = test::compare(ddp.state.at(name), t, rtol, rtol == 0 ? 0 : 1e-7);
    expect(diff.empty(), fmt::format("final {} differs from the reference: {}", name, diff));
    // Every rank holds rank 0's bits.
    Tensor mine = ddp.state.at(name).clone(), zeros0 = ddp.state.at(name).clone();
    pg.comm->broadcast(zeros0, 0)->wait();
    expect(test::compare(mine, zeros0, 0, 0).empty(), fmt::format("{} differs between rank {} and rank 0", name,
                                                                  env.rank));
  }
  pg.comm->barrier();
}

}  // namespace

TEST_CASE("ddp with one process is bit-equal to training alone", "[dist]") {
  test::idx8_dataset();  // written before the fork
  const auto out = ht::test::run_ranks(1, [](const dist::DistEnv& env) { check_against_reference(env, 16, 0.0); });
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("ddp with 2 processes x batch 8 equals one process with batch 16", "[dist]") {
  test::idx8_dataset();
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) { check_against_reference(env, 16, 1e-5); });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("ddp with 4 processes and uneven slices equals one process", "[dist]") {
  test::idx8_dataset();
  // Batches of 10 rows (slices 3 3 2 2) and a last batch of 4 (one row each).
  const auto out = ht::test::run_ranks(4, [](const dist::DistEnv& env) { check_against_reference(env, 10, 1e-5); });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("rank slices cover a batch in order, sizes as even as possible", "[dist]") {
  CHECK(data::row_slice(10, 0, 4).start == 0);
  CHECK(data::row_slice(10, 0, 4).rows == 3);
  CHECK(data::row_slice(10, 1, 4).start == 3);
  CHECK(data::row_slice(10, 2, 4).start == 6);
  CHECK(data::row_slice(10, 2, 4).rows == 2);
  CHECK(data::row_slice(10, 3, 4).start == 8);
  REQUIRE_THROWS_WITH(data::row_slice(3, 0, 4), HasSubstr("a batch of 3 rows cannot be cut over 4 ranks"));
}

// Note [Reduction during backward]: a weight used by two activation-checkpointed segments gets its gradient in
// each segment's recomputed backward, so its bucket is complete (and issued) after the first and gets the
// second gradient afterwards. reduce() must then issue it again: the sums equal the reduction after backward's,
// bit for bit, and the stale bucket's bytes go on the wire twice.
TEST_CASE("ddp: a bucket that gets a gradient after it was issued is reduced again", "[dist]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
    auto grads = [&](bool overlap) {
      Generator gen(11);
      auto lin = std::make_shared<nn::Linear>(8, 8, nn::Bias::yes, gen);
      auto store = nn::ParameterStore::attach(*lin);
      dist::GradientReducer reducer(*pg.comm, *store, {.bucket_mb = 0.0001});  // weight and bias apart
      expect(reducer.buckets() == 2, "two buckets");
      const Tensor x = test::random_tensor({4, 8}, 100 + static_cast<uint64_t>(env.rank), DType::f32);
      const CheckpointFn segment = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{relu(lin->forward(in[0]))};
      };
      const Tensor h = checkpoint(segment, {x})[0];
      const Tensor loss = sum(checkpoint(segment, {h})[0]);
      if (overlap) reducer.arm(0.5);
      loss.backward();
      reducer.reduce(0.5);
      std::map<std::string, Tensor> g;
      for (const auto& p : store->params()) g[p.name] = p.param->grad().clone();
      return std::make_pair(g, reducer.bytes_last_reduce());
    };
    const auto [after, bytes_after] = grads(false);
    const auto [during, bytes_during] = grads(true);
    for (const auto& [name, t] : after)
      expect(test::compare(during.at(name), t, 0, 0).empty(), name + " differs with the reduction during backward");
    expect(bytes_after == (8 * 8 + 8) * 4, fmt::format("{} bytes after backward", bytes_after));
    expect(bytes_during == 2 * bytes_after, fmt::format("{} bytes during: both buckets went out twice", bytes_during));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

// A trainable parameter that gets no gradient in a step (a layer the step did not use) shares a bucket with used
// ones: the reduction gives it a gradient of exact zeros and the others their weighted sum over the ranks. Over
// several steps the buckets' buffers are freed and allocated again, so a slot left unwritten would hold old sums.
TEST_CASE("ddp: a trainable parameter without a gradient is reduced as zeros", "[dist]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
    Generator gen(5);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(8, 8, nn::Bias::yes, gen));  // used
    m->push_back(std::make_shared<nn::Linear>(8, 8, nn::Bias::yes, gen));  // never used
    auto store = nn::ParameterStore::attach(*m);
    dist::GradientReducer reducer(*pg.comm, *store, {.bucket_mb = 1.0});
    expect(reducer.buckets() == 1, "one bucket for all four parameters");
    auto& used = dynamic_cast<nn::Linear&>(*(*m)[0]);
    for (int step = 0; step < 4; ++step) {
      for (const auto& p : store->params()) p.param->zero_grad();
      const Tensor x = test::random_tensor({4, 8}, 10 * step + static_cast<uint64_t>(env.rank), DType::f32);
      sum(used.forward(x)).backward();
      const Tensor own = used.weight.grad().clone();  // this rank's gradient of the used weight
      reducer.reduce(0.5);
      Tensor expected = mul(own, 0.5);  // the other rank's half, from its own input
      const Tensor other = test::random_tensor({4, 8}, 10 * step + static_cast<uint64_t>(1 - env.rank), DType::f32);
      expected = add(expected, mul(matmul(full({8, 4}, 1.0, {DType::f32}), other), 0.5));
      expect(test::compare(used.weight.grad(), expected, 1e-6, 1e-6).empty(), "the used weight's sum");
      for (const auto& p : store->params()) {
        if (p.name.rfind("1.", 0) != 0) continue;
        expect(p.param->grad().defined(), p.name + " has no gradient after the reduction");
        expect(test::compare(p.param->grad(), zeros(p.param->shape(), {DType::f32}), 0, 0).empty(),
               fmt::format("{} at step {}: not zeros", p.name, step + 1));
      }
    }
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}
