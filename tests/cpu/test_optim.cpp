// Optimisers and schedules against hand-computed PyTorch-semantics updates.
#include "support/catch.h"
#include "support/testing.h"

#include <cmath>
#include <limits>

#include "hadatrain/optim/optimizer.h"
#include "hadatrain/optim/schedule.h"

using namespace ht;
using namespace ht::optim;

namespace {
Tensor param(std::vector<double> v) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}, {DType::f64});
  t.set_requires_grad(true);
  return t;
}
void set_grad(Tensor& p, std::vector<double> g) { p.set_grad(from_vector(g, {static_cast<int64_t>(g.size())}, {DType::f64})); }
}  // namespace

TEST_CASE("SGD with momentum, Nesterov and weight decay follows torch.optim.SGD", "[optim]") {
  Tensor w = param({1.0, -2.0}).reshape({1, 2}).detach();  // 2-D: decayed
  w.set_requires_grad(true);
  SgdOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.1;
  auto opt = make_sgd({{"w", &w, true}}, o);
  // step 1: d = g + wd p = [0.5 + 0.1, 1 - 0.2] = [0.6, 0.8]; buf = d; p = p - 0.1 d
  w.set_grad(from_vector(std::vector<double>{0.5, 1.0}, {1, 2}, {DType::f64}));
  opt->step(0.1);
  CHECK(test::compare(w, std::vector<double>{1.0 - 0.06, -2.0 - 0.08}, 1e-12, 1e-12) == "");
  // step 2: d = g + wd p; buf = 0.9 buf + d; p -= lr buf
  w.set_grad(from_vector(std::vector<double>{0.5, 1.0}, {1, 2}, {DType::f64}));
  const double p0 = 0.94, p1 = -2.08;
  const double d0 = 0.5 + 0.1 * p0, d1 = 1.0 + 0.1 * p1;
  const double b0 = 0.9 * 0.6 + d0, b1 = 0.9 * 0.8 + d1;
  opt->step(0.1);
  CHECK(test::compare(w, std::vector<double>{p0 - 0.1 * b0, p1 - 0.1 * b1}, 1e-12, 1e-12) == "");
  CHECK(opt->state_tensors().count("w.momentum_buffer") == 1);

  Tensor v = param({1.0});
  SgdOptions n;
  n.momentum = 0.5;
  n.nesterov = true;
  auto nopt = make_sgd({{"v", &v, false}}, n);
  set_grad(v, {2.0});
  nopt->step(0.1);  // buf = 2, d = 2 + 0.5 * 2 = 3
  CHECK(v.item() == Approx(1.0 - 0.3).epsilon(1e-12));
  CHECK_THROWS_WITH(make_sgd({{"v", &v, false}}, SgdOptions{.momentum = 1.5}), HasSubstr("momentum"));
}

TEST_CASE("AdamW follows torch.optim.AdamW for three steps", "[optim]") {
  Tensor w = param({0.5, -1.5});
  AdamWOptions o;
  o.weight_decay = 0.1;
  auto opt = make_adamw({{"w", &w, true}}, o);
  double p[2] = {0.5, -1.5}, m[2] = {0, 0}, v[2] = {0, 0};
  const double grads[3][2] = {{0.1, -0.2}, {0.3, 0.05}, {-0.2, 0.4}};
  const double lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    set_grad(w, {grads[t - 1][0], grads[t - 1][1]});
    opt->step(lr);
    for (int k = 0; k < 2; ++k) {
      const double g = grads[t - 1][k];
      p[k] *= 1 - lr * 0.1;
      m[k] = 0.9 * m[k] + 0.1 * g;
      v[k] = 0.999 * v[k] + 0.001 * g * g;
      p[k] -= lr * (m[k] / (1 - std::pow(0.9, t))) / (std::sqrt(v[k] / (1 - std::pow(0.999, t))) + 1e-8);
    }
    CHECK(test::compare(w, std::vector<double>{p[0], p[1]}, 1e-12, 1e-14) == "");
  }
  // Resume from saved state reproduces the next step exactly.
  Tensor w2 = param({p[0], p[1]});
  auto opt2 = make_adamw({{"w", &w2, true}}, o);
  auto st = opt->state_tensors();
  std::map<std::string, Tensor> renamed{{"w.exp_avg", st["w.exp_avg"]}, {"w.exp_avg_sq", st["w.exp_avg_sq"]}};
  opt2->load_state_tensors(renamed, opt->steps());
  set_grad(w, {0.7, -0.7});
  set_grad(w2, {0.7, -0.7});
  opt->step(lr);
  opt2->step(lr);
  CHECK(w.to_vector<double>() == w2.to_vector<double>());
}

TEST_CASE("an optimiser's host half raises the storage version of the parameters it updates, not a frozen one",
          "[optim]") {
  // Note [Storage versions] (tensor/allocator.h): begin_step also runs before a replayed step graph's apply()
  Tensor w = param({0.5, -1.5});
  Tensor frozen = ones({2});  // requires no grad
  auto opt = make_adamw({{"w", &w, true}, {"frozen", &frozen, true}}, AdamWOptions{});
  const uint64_t w0 = storage_version(w), f0 = storage_version(frozen);
  opt->begin_step(0.01);
  CHECK(storage_version(w) == w0 + 1);
  CHECK(storage_version(frozen) == f0);
  set_grad(w, {0.1, -0.2});
  opt->apply();
  CHECK(storage_version(w) == w0 + 1);  // apply() is the device half: no host bookkeeping
}

TEST_CASE("weight decay groups skip 1-dim parameters and listed names", "[optim]") {
  Tensor w = zeros({2, 2}), b = zeros({2}), pos = zeros({1, 4, 2});
  auto refs = make_param_refs({{"fc.weight", &w}, {"fc.bias", &b}, {"pos_embed", &pos}}, {"pos_embed"});
  CHECK(refs[0].decay);
  CHECK_FALSE(refs[1].decay);
  CHECK_FALSE(refs[2].decay);
}

TEST_CASE("global-norm clipping scales gradients to max_norm", "[optim]") {
  Tensor a = param({0, 0}), b = param({0});
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});
  std::vector<ParamRef> refs{{"a", &a, true}, {"b", &b, true}};
  CHECK(clip_grad_norm(refs, 1.0) == Approx(5.0));
  CHECK(a.grad().to_vector<double>()[0] == Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().item() == Approx(0.8).epsilon(1e-5));
  CHECK(clip_grad_norm(refs, 10.0) == Approx(1.0).epsilon(1e-5));  // below the limit: unchanged
  CHECK(b.grad().item() == Approx(0.8).epsilon(1e-5));
}

TEST_CASE("global-norm clipping on the device matches the host version", "[optim]") {
  Tensor a = param({0, 0}), b = param({0});
  std::vector<ParamRef> refs{{"a", &a, true}, {"b", &b, true}};
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});
  CHECK(clip_grad_norm_on_device(refs, 1.0).item() == Approx(5.0));
  CHECK(a.grad().to_vector<double>()[0] == Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().item() == Approx(0.8).epsilon(1e-5));
  CHECK(clip_grad_norm_on_device(refs, 10.0).item() == Approx(1.0).epsilon(1e-5));  // below: unchanged
  CHECK(b.grad().item() == Approx(0.8).epsilon(1e-5));
  set_grad(b, {std::numeric_limits<double>::infinity()});  // a non-finite norm leaves the gradients alone
  CHECK(std::isinf(clip_grad_norm_on_device(refs, 1.0).item()));
  CHECK(a.grad().to_vector<double>()[0] == Approx(0.6).epsilon(1e-5));
  Tensor c = param({0});
  std::vector<ParamRef> none{{"c", &c, true}};
  CHECK_FALSE(clip_grad_norm_on_device(none, 1.0).defined());
  CHECK_THROWS_WITH(clip_grad_norm_on_device(refs, 0.0), HasSubstr("max_norm must be positive"));
}

TEST_CASE("learning-rate schedules", "[optim]") {
  ScheduleConfig ms;
  ms.kind = ScheduleKind::multistep;
  ms.base_lr = 0.1;
  ms.milestones = {60, 120, 160};
  ms.gamma = 0.2;
  CHECK(learning_rate(ms, 59) == Approx(0.1));
  CHECK(learning_rate(ms, 60) == Approx(0.02));
  CHECK(learning_rate(ms, 160) == Approx(0.1 * 0.008));
  ScheduleConfig cos;
  cos.kind = ScheduleKind::cosine;
  cos.base_lr = 1.0;
  cos.warmup_steps = 10;
  cos.total_steps = 110;
  CHECK(learning_rate(cos, 0) == Approx(0.0));
  CHECK(learning_rate(cos, 5) == Approx(0.5));
  CHECK(learning_rate(cos, 10) == Approx(1.0));
  CHECK(learning_rate(cos, 60) == Approx(0.5));
  CHECK(learning_rate(cos, 110) == Approx(0.0).margin(1e-12));
  ScheduleConfig st;
  st.kind = ScheduleKind::step;
  st.step_size = 30;
  st.gamma = 0.1;
  st.base_lr = 1.0;
  CHECK(learning_rate(st, 65) == Approx(0.01));
}

TEST_CASE("cosine_restarts follows PyTorch's CosineAnnealingWarmRestarts after the warm-up", "[optim]") {
  // PyTorch's closed form for epoch e (T_mult > 1): n = floor(log_{T_mult}(e / T_0 * (T_mult - 1) + 1)),
  // T_cur = e - T_0 * (T_mult^n - 1) / (T_mult - 1), T_i = T_0 * T_mult^n; e counted here in steps.
  auto torch_lr = [](double e, double t0, double mult, double base, double eta_min) {
    double t_cur = e, t_i = t0;
    if (e >= t0) {
      if (mult == 1.0) {
        t_cur = std::fmod(e, t0);
      } else {
        const double n = std::floor(std::log(e / t0 * (mult - 1.0) + 1.0) / std::log(mult));
        t_cur = e - t0 * (std::pow(mult, n) - 1.0) / (mult - 1.0);
        t_i = t0 * std::pow(mult, n);
      }
    }
    return eta_min + (base - eta_min) * (1.0 + std::cos(M_PI * t_cur / t_i)) / 2.0;
  };
  for (const int64_t mult : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    ScheduleConfig r;
    r.kind = ScheduleKind::cosine_restarts;
    r.base_lr = 2.5e-5;
    r.min_lr = 1e-6;
    r.warmup_steps = 7;
    r.restart_steps = 20;
    r.restart_mult = mult;
    for (int64_t step = 7; step < 7 + 400; ++step) {
      INFO("T_mult " << mult << ", step " << step);
      CHECK(learning_rate(r, step) == Approx(torch_lr(static_cast<double>(step - 7), 20, mult, 2.5e-5, 1e-6)));
    }
    CHECK(learning_rate(r, 7) == Approx(2.5e-5));       // each cycle starts at base_lr
    CHECK(learning_rate(r, 7 + 20) == Approx(2.5e-5));  // and restarts there after 20 steps
  }
  ScheduleConfig two;
  two.kind = ScheduleKind::cosine_restarts;
  two.base_lr = 1.0;
  two.restart_steps = 20;
  two.restart_mult = 2;
  CHECK(learning_rate(two, 10) == Approx(0.5));   // the middle of the first cycle (20 steps)
  CHECK(learning_rate(two, 40) == Approx(0.5));   // the middle of the second (40 steps, from step 20)
  CHECK(learning_rate(two, 60) == Approx(1.0));   // the third starts
}
