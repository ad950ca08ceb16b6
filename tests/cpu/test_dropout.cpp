// dropout: mask statistics, exact scaling, Philox determinism per (seed, stream), gradients, errors.
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/nn/layers.h"

using namespace ht;

namespace {
// The mask dropout must draw for element i (Note [Philox stream layout]).
bool reference_keep(uint64_t seed, uint64_t stream, int64_t i, double p) {
  return static_cast<double>(uniform_from_word(philox_word(seed, stream, static_cast<uint64_t>(i)))) >= p;
}
}  // namespace

TEST_CASE("dropout keeps about 1 - p of the elements and scales them exactly", "[dropout]") {
  const double p = 0.3;
  Tensor x = test::random_tensor({100, 1000}, 11, DType::f64, 0.5, 1.5);  // never zero
  Generator gen(1234);
  Tensor y = dropout(x, p, gen);
  CHECK(gen.state() == 1);
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  int64_t kept = 0, agree = 0;
  bool exact = true;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const bool k = yv[i] != 0.0;
    kept += k;
    agree += k == reference_keep(1234, 0, static_cast<int64_t>(i), p);
    if (k && yv[i] != xv[i] * (1.0 / (1.0 - p))) exact = false;
  }
  // 100k Bernoulli(0.7) draws: standard deviation ~145, so 1000 is ~7 sigma.
  CHECK(std::abs(static_cast<double>(kept) - 70000.0) < 1000.0);
  CHECK(agree == 100000);
  CHECK(exact);
  // The mean is preserved in expectation.
  CHECK(mean(y).item() == Approx(mean(x).item()).epsilon(0.01));
}

TEST_CASE("dropout is deterministic per generator state and differs per stream", "[dropout]") {
  Tensor x = ones({64, 33}, {DType::f32});
  Generator g1(7), g2(7);
  Tensor a = dropout(x, 0.5, g1);
  Tensor b = dropout(x, 0.5, g2);
  CHECK(test::compare(a, b, 0, 0) == "");
  Tensor c = dropout(x, 0.5, g1);  // next stream: a different mask
  CHECK(test::compare(a, c, 0, 0) != "");
  Generator g3(8);  // another seed: another mask
  CHECK(test::compare(a, dropout(x, 0.5, g3), 0, 0) != "");
  g2.set_state(1);  // restoring the state repeats the second mask
  CHECK(test::compare(c, dropout(x, 0.5, g2), 0, 0) == "");
  // Kept values are exactly 2 in f32.
  for (float v : a.to_vector<float>()) CHECK((v == 0.0f || v == 2.0f));
}

TEST_CASE("dropout indexes the mask by row-major position, also for non-contiguous input", "[dropout]") {
  Tensor base = test::random_tensor({6, 5}, 3, DType::f64, 1.0, 2.0);
  Tensor xt = base.transpose(0, 1);  // (5, 6) view
  Generator ga(99), gb(99);
  Tensor a = dropout(xt, 0.4, ga);
  Tensor b = dropout(xt.contiguous(), 0.4, gb);
  CHECK(test::compare(a, b, 0, 0) == "");
  const auto xv = xt.contiguous().to_vector<double>(), av = a.to_vector<double>();
  std::vector<double> expect(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i)
    expect[i] = reference_keep(99, 0, static_cast<int64_t>(i), 0.4) ? xv[i] / 0.6 : 0.0;
  CHECK(test::compare(a, expect, 1e-15, 0) == "");
}

TEST_CASE("dropout with p = 0 returns x but still advances the generator", "[dropout]") {
  Tensor x = test::random_tensor({4, 4}, 1);
  Generator gen(5);
  Tensor y = dropout(x, 0.0, gen);
  CHECK(y.is_same(x));
  CHECK(gen.state() == 1);
}

TEST_CASE("dropout in bf16 uses the same mask and scales within bf16 rounding", "[dropout]") {
  Tensor x = test::random_tensor({17, 31}, 21, DType::f64, -2.0, 2.0);
  Generator g64(42), g16(42);
  Tensor y64 = dropout(x, 0.25, g64);
  Tensor y16 = dropout(x.to(DType::bf16), 0.25, g16);
  CHECK(y16.dtype() == DType::bf16);
  const auto a = y64.to_vector<double>(), b = y16.to_vector<double>();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(((a[i] == 0.0) == (b[i] == 0.0)));
  CHECK(test::compare(y16, y64, 1e-2, 1e-2) == "");
}

TEST_CASE("dropout gradient applies the same mask and scale", "[dropout][gradcheck]") {
  Tensor x = test::random_tensor({3, 4, 5}, 8).set_requires_grad(true);
  // A fresh generator in f makes every evaluation draw the same mask.
  CHECK(test::gradcheck(
            [](const std::vector<Tensor>& in) {
              Generator gen(77);
              return dropout(in[0], 0.35, gen);
            },
            {x}) == "");
  CHECK(test::gradcheck(
            [](const std::vector<Tensor>& in) {
              Generator gen(77);
              gen.set_state(5);
              return dropout(in[0].permute({2, 0, 1}), 0.6, gen);
            },
            {x}) == "");
  // The gradient of sum(dropout(x)) is the mask times the scale.
  Generator gen(13);
  Tensor y = dropout(x, 0.5, gen);
  sum(y).backward();
  const auto g = x.grad().to_vector<double>(), yv = y.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == (yv[i] != 0.0 ? 2.0 : 0.0));
}

TEST_CASE("dropout rejects bad p and integer tensors", "[dropout]") {
  Generator gen(1);
  Tensor x = ones({3});
  CHECK_THROWS_WITH(dropout(x, 1.0, gen), HasSubstr("p must be in [0, 1)"));
  CHECK_THROWS_WITH(dropout(x, -0.1, gen), HasSubstr("p must be in [0, 1)"));
  CHECK_THROWS_WITH(dropout(x, std::nan(""), gen), HasSubstr("p must be in [0, 1)"));
  CHECK_THROWS_WITH(dropout(arange(3, {DType::i64}), 0.5, gen), HasSubstr("floating"));
}

TEST_CASE("drop path drops whole samples with probability p and scales the others as dropout does", "[dropout]") {
  const double p = 0.25;
  auto gen = std::make_shared<Generator>(77);
  nn::DropPath dp(p, gen);
  const int64_t B = 4000;
  const Tensor x = test::random_tensor({B, 3, 5}, 21, DType::f32, 0.5, 1.5);  // never zero
  const Tensor y = dp.forward(x);
  CHECK(gen->state() == 1);  // one stream per call: the (B, 1, 1) mask's
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  const float scale = static_cast<float>(1.0 / (1.0 - p));  // dropout's scale, in f32 as the mask holds it
  int64_t kept = 0;
  bool whole = true, exact = true, as_drawn = true;
  for (int64_t b = 0; b < B; ++b) {
    const bool k = yv[static_cast<std::size_t>(b * 15)] != 0.0;
    kept += k;
    as_drawn = as_drawn && k == reference_keep(77, 0, b, p);  // sample b is element b of the mask
    for (int64_t i = 0; i < 15; ++i) {
      const auto j = static_cast<std::size_t>(b * 15 + i);
      whole = whole && (yv[j] != 0.0) == k;
      exact = exact && (!k || yv[j] == static_cast<double>(static_cast<float>(xv[j]) * scale));
    }
  }
  CHECK(whole);
  CHECK(exact);
  CHECK(as_drawn);
  CHECK(std::abs(static_cast<double>(kept) - 3000.0) < 200.0);  // Bernoulli(0.75) x 4000: sd ~27

  // The gradient passes through the same per-sample mask.
  const Tensor xg = x.detach().set_requires_grad(true);
  nn::DropPath again(p, std::make_shared<Generator>(77));
  sum(again.forward(xg)).backward();
  CHECK(test::compare(xg.grad(), div(y, x), 1e-6, 0.0) == "");

  // Eval mode and p = 0: the input itself, nothing drawn.
  dp.eval();
  CHECK(test::compare(dp.forward(x), x, 0.0, 0.0) == "");
  nn::DropPath none(0.0, gen);
  CHECK(test::compare(none.forward(x), x, 0.0, 0.0) == "");
  CHECK(gen->state() == 1);
  CHECK_THROWS_WITH(nn::DropPath(1.0, gen), HasSubstr("DropPath: p must be in [0, 1), got 1"));
}

TEST_CASE("dropout on a step-keyed generator draws each step's masks, the same again for the same step", "[dropout]") {
  StepSource clock;
  Generator gen(31);
  gen.key_by_step(&clock);
  const Tensor x = test::random_tensor({40, 50}, 3, DType::f64, 0.5, 1.5);
  clock.step = 4;
  const Tensor a = dropout(x, 0.4, gen), b = dropout(x, 0.4, gen);
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  bool a_ok = true, b_ok = true;
  for (std::size_t i = 0; i < av.size(); ++i) {
    a_ok = a_ok && (av[i] != 0.0) == reference_keep(31, philox_stream(0, 4, Generator::kDrawPurpose), i, 0.4);
    b_ok = b_ok && (bv[i] != 0.0) == reference_keep(31, philox_stream(1, 4, Generator::kDrawPurpose), i, 0.4);
  }
  CHECK(a_ok);
  CHECK(b_ok);
  clock.step = 5;
  const Tensor c = dropout(x, 0.4, gen);
  CHECK(test::compare(c, a, 0.0, 0.0) != "");  // another step, another mask
  clock.step = 4;  // the same step again (a resumed run): the same first mask
  CHECK(test::compare(dropout(x, 0.4, gen), a, 0.0, 0.0) == "");
}
