// Step graphs (cuda/graph.h, Note [Step graphs]): an MLP step recorded once and replayed with a changing
// learning rate ends where the same eager steps end (parameters, summed losses); a ResNet step replayed
// from the same state as an eager step gives the same parameters and batch-norm statistics; every kind of step that cannot be replayed is refused with its reason, leaving the device
// usable: a random stream drawn (dropout), a synchronising call (item()), a tensor that outlives the step,
// a tensor from before the step freed inside it. Every gradient pipeline's products record.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "hadatrain/cuda/graph.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/optim/optimizer.h"

using namespace ht;

namespace {

double lr_at(int step) { return 0.2 / (1 + step); }  // changes every step: a frozen lr would show

}  // namespace

// An MLP (Linear, LayerNorm, GELU: deterministic kernels) trained 6 steps with a learning rate that changes
// every step and AdamW (bias corrections change too): 2 eager steps, 1 recorded, 3 replays against 6 eager steps.
TEST_CASE("a recorded MLP step with AdamW replays like eager steps", "[gpu][graph]") {
  auto make = [](Generator& g) {
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(24, 64, nn::Bias::yes, g));
    m->push_back(std::make_shared<nn::LayerNorm>(64));
    m->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::gelu));
    m->push_back(std::make_shared<nn::Linear>(64, 10, nn::Bias::yes, g));
    return m;
  };
  Generator ga(11), gb(11);
  auto a = make(ga), b = make(gb);
  b->load_state_dict(a->state_dict());
  a->to(test::kCuda);
  b->to(test::kCuda);
  const Tensor x = test::random_input({32, 24}, 5, DType::f32).to(test::kCuda);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 32; ++i) labels.push_back((i * 7) % 10);
  const Tensor y = from_vector(labels, {32}, {DType::i64, test::kCuda});
  constexpr int kSteps = 6;
  auto oa = optim::make_adamw(optim::make_param_refs(a->named_parameters()), {.weight_decay = 0.05});
  double eager_loss_sum = 0;
  for (int s = 0; s < kSteps; ++s) {
    const Tensor loss = cross_entropy(a->forward(x), y);
    oa->zero_grad();
    loss.backward();
    oa->step(lr_at(s));
    eager_loss_sum += loss.item();
  }
  cudaDeviceSynchronize();  // work moves to the graph's stream below
  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  auto ob = optim::make_adamw(optim::make_param_refs(b->named_parameters()), {.weight_decay = 0.05});
  const Tensor xb = x.clone(), yb = y.clone();
  const Tensor loss_sum = zeros({}, {DType::f64, test::kCuda});
  const CrossEntropyOptions ce{.target_check = TargetCheck::deferred};
  auto body = [&] {
    const Tensor loss = cross_entropy(b->forward(xb), yb, ce);
    loss.backward();
    ob->apply();
    ob->zero_grad();
    add_(loss_sum, loss.detach().to(DType::f64));
  };
  for (int s = 0; s < kSteps; ++s) {
    ob->begin_step(lr_at(s));
    if (s < 2) {
      body();
    } else if (s == 2) {
      REQUIRE(graph.record(body) == "");
      REQUIRE(graph.ready());
      graph.replay();
    } else {
      graph.replay();
    }
  }
  CHECK(loss_sum.item() == Approx(eager_loss_sum).epsilon(1e-6));
  const auto sa = a->state_dict(), sb = b->state_dict();
  for (const auto& [name, ta] : sa) {
    INFO(name);
    CHECK(test::rel_error(sb.at(name), ta) < 1e-6);  // a frozen lr or bias correction gives ~1e-2
  }
}

// A ResNet-18 step (cuDNN convolutions, fused batch norm, running statistics) replayed from the same state
// as an eager step: one step each, so the order of cuDNN's atomics cannot grow into a visible difference.
TEST_CASE("a recorded ResNet step replays like an eager step from the same state", "[gpu][graph]") {
  models::ResNetConfig rc{models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false};
  rc.layout = ConvLayout::nhwc;
  Generator ga(5), gb(5);
  auto a = std::make_shared<models::ResNet>(rc, ga);
  auto b = std::make_shared<models::ResNet>(rc, gb);
  a->to(test::kCuda);
  b->to(test::kCuda);
  const Tensor x = test::random_input({8, 3, 32, 32}, 41, DType::f32, -2, 2).to(test::kCuda);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 8; ++i) labels.push_back((i * 3) % 10);
  const Tensor y = from_vector(labels, {8}, {DType::i64, test::kCuda});
  cudaDeviceSynchronize();
  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  auto ob = optim::make_sgd(optim::make_param_refs(b->named_parameters()), {.momentum = 0.9, .weight_decay = 5e-4});
  const CrossEntropyOptions ce{.target_check = TargetCheck::deferred};
  auto body = [&] {
    const Tensor loss = cross_entropy(b->forward(x), y, ce);
    loss.backward();
    ob->apply();
    ob->zero_grad();
  };
  for (int s = 0; s < 2; ++s) {
    ob->begin_step(lr_at(s));
    body();
  }
  REQUIRE(graph.record(body) == "");
  for (int s = 2; s < 4; ++s) {  // two replays, each against an eager step from b's state
    INFO("step " << s);
    a->load_state_dict(b->state_dict());
    auto oa = optim::make_sgd(optim::make_param_refs(a->named_parameters()), {.momentum = 0.9, .weight_decay = 5e-4});
    oa->load_state_tensors(ob->state_tensors(), ob->steps());
    const Tensor loss = cross_entropy(a->forward(x), y, ce);
    oa->zero_grad();
    loss.backward();
    oa->step(lr_at(s));
    ob->begin_step(lr_at(s));
    graph.replay();
    const auto sa = a->state_dict(), sb = b->state_dict();
    int compared = 0;
    for (const auto& [name, ta] : sa) {
      INFO(name);
      const Tensor tb = sb.at(name);
      if (!is_floating(ta.dtype())) {
        CHECK(ta.to(DType::i64).to_vector<int64_t>() == tb.to(DType::i64).to_vector<int64_t>());
        continue;
      }
      CHECK(test::rel_error(tb, ta) < 1e-4);
      ++compared;
    }
    CHECK(compared > 60);
  }
  // a's gradients were allocated on the graph's stream and outlive it (a is destroyed after `graph`): the
  // allocator frees them in the legacy stream's order (note_stream_destroyed); a free on the destroyed
  // handle crashed in cuMemFreeAsync before.
}

TEST_CASE("a step graph counts the nodes one replay launches", "[gpu][graph]") {
  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  const Tensor x = test::random_input({64, 33}, 8, DType::f32).to(test::kCuda);
  const Tensor out = zeros({64, 33}, {DType::f32, test::kCuda});
  CHECK(graph.nodes() == 0);
  REQUIRE(graph.record([&] { copy_(out, x); }) == "");  // one copy into memory from before: one node
  CHECK(graph.nodes() == 1);
  REQUIRE(graph.record([&] { copy_(out, mul(add(x, 1.0), 2.0)); }) == "");  // three kernels, two temporaries
  CHECK(graph.nodes() >= 3);
  graph.replay();
  CHECK(test::rel_error(out.to(Device::cpu()), mul(add(x, 1.0), 2.0).to(Device::cpu())) == 0.0);
}

TEST_CASE("steps that cannot be replayed are refused with the reason", "[gpu][graph]") {
  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  const Tensor x = test::random_input({64, 33}, 7, DType::f32).to(test::kCuda);
  const Tensor expected = mul(x, 3.0).to(Device::cpu());

  SECTION("dropout draws a random stream per call") {
    nn::Dropout drop(0.5, std::make_shared<Generator>(1));
    const std::string why = graph.record([&] { (void)sum(drop.forward(x)); });
    CHECK_THAT(why, HasSubstr("random stream"));
  }
  SECTION("a synchronising read") {
    const std::string why = graph.record([&] { (void)sum(x).item(); });
    CHECK_THAT(why, HasSubstr("failed while being recorded"));
  }
  SECTION("a tensor created in the step outlives it") {
    Tensor kept;
    const std::string why = graph.record([&] { kept = mul(x, 2.0); });
    CHECK_THAT(why, HasSubstr("outlive"));
    kept = Tensor();
  }
  SECTION("a tensor from before the step is freed inside it") {
    Tensor old = mul(x, 2.0);
    const std::string why = graph.record([&] {
      old = Tensor();
      (void)sum(x);
    });
    CHECK_THAT(why, HasSubstr("freed during"));
  }
  CHECK_FALSE(graph.ready());
  CHECK(graph.nodes() == 0);
  // The device keeps working after a refusal.
  CHECK(test::rel_error(mul(x, 3.0).to(Device::cpu()), expected) == 0.0);
}

TEST_CASE("cross_entropy with deferred target checks reports a bad target at the check", "[gpu][graph]") {
  const Tensor logits = test::random_input({6, 10}, 3, DType::f32).to(test::kCuda);
  const Tensor good = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, -100}, {6}, {DType::i64, test::kCuda});
  const Tensor bad = from_vector(std::vector<int64_t>{1, 2, 13, 4, 5, 6}, {6}, {DType::i64, test::kCuda});
  const CrossEntropyOptions deferred{.target_check = TargetCheck::deferred};
  // Same loss and gradient as the synchronous check (mean over the 5 counted rows, divided on the device).
  Tensor la = logits.clone().set_requires_grad(true), lb = logits.clone().set_requires_grad(true);
  const Tensor sync_loss = cross_entropy(la, good), def_loss = cross_entropy(lb, good, deferred);
  CHECK(def_loss.item() == Approx(sync_loss.item()).epsilon(1e-6));
  sync_loss.backward();
  def_loss.backward();
  CHECK(test::rel_error(lb.grad(), la.grad()) < 1e-6);
  const Tensor expected = cross_entropy(logits.to(Device::cpu()), good.to(Device::cpu()));
  CHECK(def_loss.item() == Approx(expected.item()).epsilon(1e-5));
  CHECK_NOTHROW(check_deferred_targets(test::kCuda));
  // A bad target: the call returns, the check throws naming the class count, then the record is clear.
  CHECK_THROWS_WITH(cross_entropy(logits, bad), HasSubstr("target[2] = 13 is out of range"));
  CHECK_NOTHROW(cross_entropy(logits, bad, deferred));
  CHECK_THROWS_WITH(check_deferred_targets(test::kCuda), HasSubstr("out of range for 10 classes"));
  CHECK_NOTHROW(check_deferred_targets(test::kCuda));
}

// Each pipeline's forward and backward (HLQ and LUQ with the step's noise read on the device, LBP-WHT with its
// basis, exact) can be recorded once the eager steps before it built what they keep (LBP-WHT's basis is copied
// to the device once per layer, in the first eager step, and kept).
TEST_CASE("a step through every gradient pipeline records into a step graph", "[gpu][graph][grad]") {
  for (const char* name : {"exact", "hlq", "lbp_wht", "luq"}) {
    INFO(name);
    Generator gen(7);
    nn::Sequential mlp;
    mlp.push_back(std::make_shared<nn::Linear>(32, 64, nn::Bias::yes, gen));
    mlp.push_back(std::make_shared<nn::Linear>(64, 16, nn::Bias::yes, gen));
    mlp.to(test::kCuda);
    grad::PipelineConfig pc;
    pc.default_spec.name = name;
    auto clock = std::make_shared<grad::StepClock>();
    if (nn::any_draws_noise(nn::bind_pipelines(mlp, pc, clock))) clock->keep_on_device(test::kCuda);
    const Tensor x = test::random_input({4, 64, 32}, 8, DType::f32).to(test::kCuda);  // 64 tokens: an 8×8 grid
    cudaDeviceSynchronize();
    cuda::StepGraph graph(0);
    cuda::StreamGuard on(graph.stream(), 0);
    auto opt = optim::make_sgd(optim::make_param_refs(mlp.named_parameters()), {.momentum = 0.9});
    auto body = [&] {
      sum(mlp.forward(x)).backward();
      opt->apply();
      opt->zero_grad();
    };
    for (int s = 0; s < 2; ++s) {
      clock->set(s);
      opt->begin_step(lr_at(s));
      body();
    }
    clock->set(2);
    opt->begin_step(lr_at(2));
    CHECK(graph.record(body) == "");
  }
}

// Note [Step-keyed streams]: dropout on a generator keyed by a step clock kept on the device draws the CPU's masks
// for the same (step, draw), records into a step graph (nothing host-side changes from step to step), and each
// replay draws the masks of the step the clock holds, not the recorded step's.
TEST_CASE("dropout keyed by a device step records into a step graph and draws each step's masks", "[gpu][graph]") {
  grad::StepClock clock;
  clock.keep_on_device(test::kCuda);
  REQUIRE(clock.device_word != nullptr);
  Generator g(5);
  g.key_by_step(&clock);
  StepSource host;  // the CPU reference keyed by the host step
  Generator h(5);
  h.key_by_step(&host);
  const Tensor xc = test::random_input({64, 33}, 9, DType::f32), x = xc.to(test::kCuda);
  const double p = 0.3;
  cudaDeviceSynchronize();
  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  clock.set(3);
  host.step = 3;
  CHECK(test::compare(dropout(x, p, g).to(Device::cpu()), dropout(xc, p, h), 0.0, 0.0) == "");
  const Tensor out = empty({64, 33}, {DType::f32, test::kCuda});
  clock.set(4);
  REQUIRE(graph.record([&] { copy_(out, dropout(x, p, g)); }) == "");
  Tensor previous;
  for (int64_t s : {5, 6}) {
    INFO("step " << s);
    clock.set(s);
    graph.replay();
    host.step = s;
    const Tensor got = out.to(Device::cpu());
    CHECK(test::compare(got, dropout(xc, p, h), 0.0, 0.0) == "");
    if (previous.defined()) CHECK(test::compare(got, previous, 0.0, 0.0) != "");  // a new mask each step
    previous = got;
  }
}
