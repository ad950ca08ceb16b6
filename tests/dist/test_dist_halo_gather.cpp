// HQ-FSDP's 8-bit weight all-gather feeding the halo pipeline directly (grad/pipeline_halo_weight.h, Note
// [Low-precision FSDP gathers] in src/dist/fsdp_lowp.h), on 2 ranks over Gloo: a Linear of 45 rows (one zero
// padding row on rank 1) and 64 columns, sharded by FSDP with dist.gather_dtype int8 / fp8, every rank given the
// same input (so the share-weighted reduce-scatter, 0.5·g + 0.5·g, is exactly one process's gradient):
//   - int8, halo level 2: the output, the input's gradient and each rank's shard gradient are bit for bit those of
//     one process running the dequantise-requantise path (the layer given the dequantised gathered weight, which
//     halo quantises again); the pipeline marked "fwd Q(W·H) from the 8-bit gather" and never "fwd Q(W·H)";
//   - fp8, halo level 1: bit for bit the products of one process that quantises the same rotated rows once
//     (halo_quantize of the whole weight, then halo_product / halo_rotate as the level-1 dataflow);
//   - a layer whose carrier (int8 under an fp8 gather) or level (0) does not match quantises the dequantised weight
//     itself (the gathered codes are not used).
#include <functional>
#include <string>

#include "dist_testing.h"
#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/grad/pipeline_halo_weight.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using ht::test::expect;

namespace {

constexpr int64_t kIn = 64, kOut = 45;

struct Layer {
  std::shared_ptr<nn::Sequential> model;  // the Linear as module "0" (its weight "0.weight", FSDP unit "0.")
  std::shared_ptr<nn::Linear> linear;
};
Layer make_layer(const grad::HaloOptions& o) {
  Generator gen(4321);
  Layer l{std::make_shared<nn::Sequential>(), std::make_shared<nn::Linear>(kIn, kOut, nn::Bias::no, gen)};
  l.model->push_back(l.linear);
  grad::PipelineConfig config;
  config.default_spec.name = "halo";
  config.default_spec.options = o;
  nn::bind_pipelines(*l.model, config, std::make_shared<grad::StepClock>());
  return l;
}

Tensor input() { return test::random_tensor({2, 16, kIn}, 77, DType::f32, -2, 2); }
Tensor upstream() { return test::random_tensor({2, 16, kOut}, 78, DType::f32, -1, 1); }  // g_y

struct Result {
  Tensor y, gx, gw;  // gw: this rank's shard gradient under FSDP, the whole weight's gradient in one process
};

// Forward and backward of loss = Σ y·g_y, so that g_y arrives exactly.
Result step(nn::Module& m) {
  Tensor x = input();
  x.set_requires_grad(true);
  const Tensor y = m.forward(x);
  sum(mul(y, upstream())).backward();
  return {y.detach(), x.grad(), Tensor()};
}

struct PhaseCount {
  int quantised = 0, gathered = 0;
};
PhaseCount count_phases(const std::function<void()>& body) {
  PhaseCount c;
  grad::set_halo_phase_hook([&c](const char* phase) {
    const std::string p = phase;
    if (p == "fwd Q(W·H)") ++c.quantised;
    if (p == "fwd Q(W·H) from the 8-bit gather") ++c.gathered;
  });
  body();
  grad::set_halo_phase_hook({});
  return c;
}

// FSDP of the layer on this rank: its output, input gradient and shard gradient, and the phases marked.
Result fsdp_step(dist::Communicator& comm, dist::GatherDType gather, const grad::HaloOptions& o, PhaseCount& phases) {
  const Layer l = make_layer(o);
  auto store = nn::ParameterStore::attach(*l.model);
  dist::FsdpOptions fo;
  fo.units = {"0."};
  fo.gather_dtype = gather;
  dist::FullyShardedModel fsdp(comm, store, fo);
  expect(fsdp.row_quantized_params() == 1, "the weight travels as 8-bit rows");
  Result r;
  const int64_t uses = grad::gathered_weight_uses();
  phases = count_phases([&] { r = step(*l.model); });
  expect(grad::gathered_weight_uses() - uses == phases.gathered, "the use counter counts the direct forwards");
  r.gw = fsdp.params()[0].shard.grad().clone();
  fsdp.end_step();
  return r;
}

// The weight as the 8-bit gather delivers it: codes of the whole weight with its own absmax (what the ranks'
// shared absmax is), and their dequantised rows.
struct Gathered {
  grad::HaloQuantized q;
  Tensor w_hat;  // (O, C) f32
};
Gathered gather_locally(const Tensor& w, dist::GatherDType gather) {
  const dist::RowCodec c = dist::make_row_codec(gather, kIn, "test weight");
  Gathered g;
  g.q = dist::quantize_rows(c, w, dist::rows_absmax(c, w));
  g.w_hat = dist::dequantize_rows(c, g.q);
  return g;
}

// This rank's chunk of a whole-weight gradient (O, C): rows [r·R, (r+1)·R) flattened, zero rows past O.
Tensor rank_chunk(const Tensor& g, int rank, int world) {
  const int64_t R = (kOut + world - 1) / world;
  Tensor padded = zeros({R * world, kIn}, {DType::f32});
  copy_(padded.narrow(0, 0, kOut), g);
  return padded.narrow(0, rank * R, R).reshape({R * kIn});
}

bool same(const Tensor& a, const Tensor& b) { return test::compare(a, b, 0, 0).empty(); }

dist::ProcessGroup connect(const dist::DistEnv& env) {
  return dist::init_process_group(env, {.engine = "gloo", .timeout = std::chrono::seconds(30)});
}

}  // namespace

TEST_CASE("an int8 weight all-gather feeds halo level 2 directly, bit for bit the dequantise-requantise path",
          "[dist][halo]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env);
    const grad::HaloOptions o{.level = 2, .carrier = grad::Carrier::int8};
    PhaseCount phases;
    const Result got = fsdp_step(*pg.comm, dist::GatherDType::int8, o, phases);
    expect(phases.quantised == 0 && phases.gathered == 1,
           fmt::format("phases: {} own Q(W·H), {} from the gather", phases.quantised, phases.gathered));
    // One process, the layer given the dequantised gathered weight, which halo quantises again.
    const Layer ref = make_layer(o);
    nn::Linear& l = *ref.linear;
    {
      NoGradGuard no_grad;
      copy_(l.weight, gather_locally(l.weight.detach(), dist::GatherDType::int8).w_hat);
    }
    Result want;
    const PhaseCount ref_phases = count_phases([&] { want = step(*ref.model); });
    expect(ref_phases.quantised == 1 && ref_phases.gathered == 0, "the reference quantises W itself");
    want.gw = rank_chunk(l.weight.grad(), env.rank, 2);
    expect(same(got.y, want.y), "y: " + test::compare(got.y, want.y, 0, 0));
    expect(same(got.gx, want.gx), "g_x: " + test::compare(got.gx, want.gx, 0, 0));
    expect(same(got.gw, want.gw), "the shard's g_w: " + test::compare(got.gw, want.gw, 0, 0));
    pg.comm->barrier();
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("an fp8 weight all-gather feeds halo level 1 directly, bit for bit one quantisation of the rotated rows",
          "[dist][halo]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env);
    const grad::HaloOptions o{.level = 1, .carrier = grad::Carrier::fp8};
    PhaseCount phases;
    const Result got = fsdp_step(*pg.comm, dist::GatherDType::fp8, o, phases);
    expect(phases.quantised == 0 && phases.gathered == 1,
           fmt::format("phases: {} own Q(W·H), {} from the gather", phases.quantised, phases.gathered));
    // One process: the whole weight's rotated rows quantised once, the level-1 products by hand.
    const Tensor w = make_layer(o).linear->weight.detach();
    const grad::HaloRotation rot = grad::halo_rotation_size(kIn);
    const float inv_n = 1.0f / static_cast<float>(rot.n);
    const grad::HaloQuantized qw = gather_locally(w, dist::GatherDType::fp8).q;
    const grad::HaloQuantized qx = grad::halo_quantize(input().reshape({32, kIn}), grad::Carrier::fp8, rot);
    const grad::HaloQuantized qe = grad::halo_quantize(upstream().reshape({32, kOut}), grad::Carrier::fp8);
    const Tensor y = grad::halo_product(qx.codes, qw.codes, qx.scale, qw.scale, {inv_n, DType::f32});
    const Tensor px = grad::halo_product(qe.codes, grad::halo_transpose(qw.codes), qe.scale, qw.scale, {inv_n, DType::f32});
    const Tensor pw = grad::halo_product(grad::halo_transpose(qe.codes), grad::halo_transpose(qx.codes), qe.scale,
                                         qx.scale, {inv_n, DType::f32});
    const grad::HaloRotate back{rot, grad::HaloDirection::inverse, kIn, 1.0f, DType::f32};
    const Tensor gx = grad::halo_rotate(px, back), gw = grad::halo_rotate(pw, back);
    expect(same(got.y, y.reshape({2, 16, kOut})), "y: " + test::compare(got.y, y.reshape({2, 16, kOut}), 0, 0));
    expect(same(got.gx, gx.reshape({2, 16, kIn})), "g_x: " + test::compare(got.gx, gx.reshape({2, 16, kIn}), 0, 0));
    const Tensor gw_chunk = rank_chunk(gw, env.rank, 2);
    expect(same(got.gw, gw_chunk), "the shard's g_w: " + test::compare(got.gw, gw_chunk, 0, 0));
    // Not the dequantise-requantise path: the layer given the dequantised weight quantises it to other codes here.
    pg.comm->barrier();
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("a halo layer of another carrier or of level 0 quantises the dequantised gathered weight itself",
          "[dist][halo]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env);
    struct Case {
      dist::GatherDType gather;
      grad::HaloOptions o;
    };
    for (const Case& c : {Case{dist::GatherDType::fp8, {.level = 2, .carrier = grad::Carrier::int8}},
                          Case{dist::GatherDType::int8, {.level = 0, .carrier = grad::Carrier::int8}}}) {
      PhaseCount phases;
      const Result got = fsdp_step(*pg.comm, c.gather, c.o, phases);
      expect(phases.quantised == 1 && phases.gathered == 0,
             fmt::format("{} gather, halo level {}: {} own Q(W·H), {} from the gather",
                         dist::gather_dtype_name(c.gather), c.o.level, phases.quantised, phases.gathered));
      const Layer ref = make_layer(c.o);
      nn::Linear& l = *ref.linear;
      {
        NoGradGuard no_grad;
        copy_(l.weight, gather_locally(l.weight.detach(), c.gather).w_hat);
      }
      const Result want = step(*ref.model);
      expect(same(got.y, want.y), "y: " + test::compare(got.y, want.y, 0, 0));
      expect(same(got.gx, want.gx), "g_x: " + test::compare(got.gx, want.gx, 0, 0));
    }
    (void)env;
    pg.comm->barrier();
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}
