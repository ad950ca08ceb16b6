// FSDP's reshard_after_forward (dist/fsdp.h, Note [Resharding after forward]) with Gloo on 2 and 4
// processes: a 4-block LLaMA with tied embeddings (the embedding's unit is entered again by the head) trains
// the same steps with the gathered weights freed after each unit's forward and gathered again in backward as
// with them kept, bit for bit (losses and final weights), also (2 ranks) with activation checkpointing,
// gradient accumulation and a bf16 forward (casts freed and made again); and the high-water mark of gathered
// bytes is one or two units (plus the tied embedding) with it on, the whole model with it off.
#include <cstring>

#include "dist_testing.h"
#include "hadatrain/autograd/checkpoint.h"
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

constexpr int64_t kBatch = 8, kSeq = 8;

struct Variant {
  bool reshard = true, prefetch = true, checkpointing = false, bf16 = false;
  int micro_steps = 1;  // > 1: gradient accumulation without communication on early micro-steps
};

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> state;
  int64_t peak = 0;                     // the most gathered bytes alive during any step
  int64_t whole = 0, largest_unit = 0;  // gathered bytes of every unit together, of the largest one
  int64_t embedding = 0;                // gathered bytes of the (tied) embedding's unit
};

Run train(dist::Communicator& comm, const Variant& v) {
  models::LlamaConfig cfg = models::LlamaConfig::tiny();
  cfg.num_hidden_layers = 4;
  cfg.tie_word_embeddings = true;
  Generator init(11);
  auto model = std::make_shared<models::Llama>(cfg, models::LlamaBuild{.gen = &init});
  if (v.bf16) model->compute_dtype = DType::bf16;
  if (v.checkpointing)
    model->block_runner = [](models::LlamaBlock& block, const Tensor& x, const models::LlamaBlockContext& ctx) {
      return checkpoint([&block, ctx](const std::vector<Tensor>& in) { return std::vector<Tensor>{block.forward(in[0], ctx)}; },
                        {x})[0];
    };
  auto store = nn::ParameterStore::attach(*model);
  std::vector<std::string> units;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) units.push_back(fmt::format("model.layers.{}.", l));
  dist::FullyShardedModel fsdp(comm, store,
                               {.units = units, .prefetch = v.prefetch, .reshard_after_forward = v.reshard});
  fsdp.set_defer_reduce(v.micro_steps > 1);
  Run run;
  std::vector<int64_t> unit_bytes(fsdp.units(), 0);
  for (const auto& p : fsdp.params()) {
    unit_bytes[p.unit] += p.chunk * comm.size() * 4;
    if (p.name == "model.embed_tokens.weight") run.embedding = p.chunk * comm.size() * 4;
  }
  for (int64_t b : unit_bytes) run.whole += b, run.largest_unit = std::max(run.largest_unit, b);
  // (the embedding is its own unit: model.embed_tokens.)
  auto opt = optim::make_adamw(fsdp.shard_store(), {.weight_decay = 0.01});
  Generator data(5);
  for (int step = 0; step < 3; ++step) {
    const test::RuleBatch whole = test::rule_batch(data, kBatch, kSeq, cfg.vocab_size);
    const auto s = data::row_slice(kBatch, comm.rank(), comm.size());
    const Tensor ids = whole.ids.narrow(0, s.start, s.rows);
    const Tensor targets = whole.targets.narrow(0, s.start, s.rows);
    const double share = static_cast<double>(s.rows) / kBatch;
    fsdp.set_share(share);
    opt->zero_grad();
    fsdp.reset_gathered_peak();
    double local = 0.0;
    const int64_t rows = s.rows / v.micro_steps;
    for (int m = 0; m < v.micro_steps; ++m) {
      const Tensor logits = model->forward(ids.narrow(0, m * rows, rows));  // (b, T, V)
      const Tensor loss = mul(cross_entropy(logits.reshape({-1, cfg.vocab_size}),
                                            targets.narrow(0, m * rows, rows).reshape({-1})),
                              1.0 / v.micro_steps);
      loss.backward();
      local += loss.item();
    }
    fsdp.reduce_deferred();
    Tensor global = full({1}, local * share, {DType::f64});
    comm.all_reduce(global, dist::ReduceOp::sum)->wait();
    run.losses.push_back(global.item());
    fsdp.clip_grad_norm(1.0);
    opt->step(3e-3);
    run.peak = std::max(run.peak, fsdp.gathered_bytes_peak());
    fsdp.end_step();
    expect(fsdp.gathered_bytes() == 0, "end_step frees every gathered tensor");
  }
  run.state = fsdp.full_state();
  return run;
}

void expect_bit_equal(const Run& got, const Run& ref, const std::string& what) {
  expect(got.losses.size() == ref.losses.size(), what + ": as many steps");
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    expect(got.losses[i] == ref.losses[i],
           fmt::format("{}: step {} loss {:.17g}, {:.17g} without resharding", what, i + 1, got.losses[i], ref.losses[i]));
  expect(ref.losses.back() < ref.losses.front(), what + ": the model learns");
  for (const auto& [name, t] : ref.state) {
    const Tensor& g = got.state.at(name);
    expect(g.nbytes() == t.nbytes() && std::memcmp(g.data_ptr(), t.data_ptr(), t.nbytes()) == 0,
           fmt::format("{}: final {} differs from the run without resharding", what, name));
  }
}

void check(const dist::DistEnv& env) {
  auto pg = dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
  dist::Communicator& comm = *pg.comm;
  std::vector<Variant> variants{Variant{}};
  if (env.world_size == 2) variants.push_back({.checkpointing = true, .bf16 = true, .micro_steps = 2});
  for (const Variant& base : variants) {
    const std::string what = fmt::format("{} ranks{}", env.world_size,
                                         base.checkpointing ? ", checkpointing, bf16, 2 micro-steps" : "");
    Variant off = base;
    off.reshard = false;
    const Run kept = train(comm, off);
    const Run freed = train(comm, base);
    expect_bit_equal(freed, kept, what);
    Variant no_prefetch = base;
    no_prefetch.prefetch = false;
    const Run freed_no_prefetch = train(comm, no_prefetch);
    expect_bit_equal(freed_no_prefetch, kept, what + ", no prefetch");
    // Kept: every unit is gathered at the end of the forward. Freed: in forward the current unit and, with
    // prefetch, the next; in backward the unit being reduced and the one below it (issued early with prefetch,
    // or when the recompute of a checkpointed unit starts), and the tied embedding, which the first layer reads
    // and whose gradient comes last. bf16: each gathered unit's bf16 casts (half its f32 bytes) as well.
    const double per_unit = static_cast<double>(kept.largest_unit) * (base.bf16 ? 1.5 : 1.0);
    // the embedding (and its bf16 cast for the head), and the norm scales of the units around (256 B each)
    const double extra = static_cast<double>(kept.embedding) * (base.bf16 ? 1.5 : 1.0) + 1024;
    const double two = 2 * per_unit + extra, one = (base.checkpointing ? 2 : 1.25) * per_unit + extra;
    expect(kept.peak >= kept.whole,
           fmt::format("{}: without resharding the peak {} holds the whole model {}", what, kept.peak, kept.whole));
    expect(freed.peak <= two, fmt::format("{}: resharding, the peak {} B exceeds {} B (units of {} B)", what, freed.peak,
                                          two, kept.largest_unit));
    expect(freed_no_prefetch.peak <= one,
           fmt::format("{}: resharding without prefetch, the peak {} B exceeds {} B (units of {} B)", what,
                       freed_no_prefetch.peak, one, kept.largest_unit));
    if (comm.rank() == 0)
      fmt::print("{}: gathered peak {} B kept, {} B freed, {} B freed without prefetch; largest unit {} B, model {} B\n",
                 what, kept.peak, freed.peak, freed_no_prefetch.peak, freed.largest_unit, freed.whole);
  }
  comm.barrier();
}

}  // namespace

TEST_CASE("fsdp resharding after forward equals keeping the gathered weights, bit for bit", "[dist]") {
  for (int world : {2, 4}) {
    const auto out = ht::test::run_ranks(world, check);
    INFO(world << " ranks, exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
}
