// FSDP (dist/fsdp.h) on a small LLaMA (LlamaConfig::tiny with tied embeddings: the embedding matrix is read
// twice per step, by the embedding and by the head, so its shard receives two reduce-scatters), one unit per
// decoder block, with Gloo and 2 and 4 processes: per-step losses and the gathered final weights within
// 1e-5 relative of one process training the same batches alone (Note [Data-parallel equivalence]).
#include <cmath>

#include "dist_testing.h"
#include "hadatrain/dist/data_parallel.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using ht::test::expect;

namespace {

constexpr int64_t kBatch = 8, kSeq = 16;

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> state;
};

Run train(dist::Communicator* comm) {
  models::LlamaConfig cfg = models::LlamaConfig::tiny();
  cfg.tie_word_embeddings = true;
  Generator init(11);
  auto model = std::make_shared<models::Llama>(cfg, models::LlamaBuild{.gen = &init});
  auto store = nn::ParameterStore::attach(*model);
  std::unique_ptr<dist::FullyShardedModel> fsdp;
  std::shared_ptr<nn::ParameterStore> opt_store = store;
  if (comm) {
    fsdp = std::make_unique<dist::FullyShardedModel>(
        *comm, store, dist::FsdpOptions{.units = {"model.layers.0.", "model.layers.1."}});
    opt_store = fsdp->shard_store();
  }
  auto opt = optim::make_sgd(opt_store, {.momentum = 0.9});
  Generator data(5);
  Run run;
  for (int step = 0; step < 6; ++step) {
    test::RuleBatch batch = test::rule_batch(data, kBatch, kSeq, cfg.vocab_size);
    const double share = test::keep_rank_rows(batch, comm);
    const auto& [ids, targets] = batch;
    if (comm) fsdp->set_share(share);
    opt->zero_grad();
    const Tensor logits = model->forward(ids);  // (b, T, V)
    const Tensor loss = cross_entropy(logits.reshape({-1, cfg.vocab_size}), targets.reshape({-1}));
    loss.backward();
    Tensor global = full({1}, loss.item() * share, {DType::f64});
    if (comm) comm->all_reduce(global, dist::ReduceOp::sum)->wait();
    run.losses.push_back(global.item());
    opt->step(0.2);
    if (fsdp) fsdp->end_step();
  }
  run.state = fsdp ? fsdp->full_state() : store->state_dict();
  return run;
}

void check(const dist::DistEnv& env) {
  auto pg = dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
  const Run got = train(pg.comm.get()), ref = train(nullptr);
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    expect(std::abs(got.losses[i] - ref.losses[i]) <= 1e-5 * ref.losses[i],
           fmt::format("step {}: loss {:.17g} on {} ranks, {:.17g} alone", i + 1, got.losses[i], env.world_size,
                       ref.losses[i]));
  expect(ref.losses.back() < ref.losses.front(), "the reference learns");
  for (const auto& [name, t] : got.state) {
    const std::string diff = test::compare(t, ref.state.at(name), 1e-5, 1e-7);
    expect(diff.empty(), fmt::format("final {}: {}", name, diff));
  }
  pg.comm->barrier();
}

}  // namespace

TEST_CASE("fsdp of a small llama on 2 and 4 processes equals one process", "[dist]") {
  for (int world : {2, 4}) {
    const auto out = ht::test::run_ranks(world, check);
    INFO(world << " ranks, exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
}
