// Philox4x32-10 known-answer vectors (Random123 kat_vectors) and the stream layout used by random ops.
#include <cmath>

#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

TEST_CASE("Philox4x32-10 matches the published known-answer vectors", "[philox]") {
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("philox_word addresses element i as word i%4 of block i/4", "[philox]") {
  const uint64_t seed = 0x1234'5678'9abc'def0ull, stream = 77;
  const auto block = philox4x32_10({5, 0, 77, 0}, {0x9abcdef0u, 0x12345678u});
  for (int w = 0; w < 4; ++w) CHECK(philox_word(seed, stream, 20 + w) == block[static_cast<std::size_t>(w)]);
  CHECK(philox_word(seed, stream, 20) != philox_word(seed, stream + 1, 20));
}

TEST_CASE("uniform floats are in [0, 1) with mean 1/2", "[philox]") {
  Generator gen(3);
  Tensor u = rand({100000}, gen);
  const auto v = u.to_vector<double>();
  double s = 0;
  for (double x : v) {
    REQUIRE(x >= 0.0);
    REQUIRE(x < 1.0);
    s += x;
  }
  CHECK(std::abs(s / v.size() - 0.5) < 0.005);
  Tensor n = randn({100000}, gen, {DType::f64});
  CHECK(std::abs(mean(n).item()) < 0.02);
  CHECK(std::abs(var(n, {0}).item() - 1.0) < 0.02);
  // Same generator state, same numbers; the generator hands out a fresh stream per call.
  Generator g1(9), g2(9);
  CHECK(rand({8}, g1).to_vector<double>() == rand({8}, g2).to_vector<double>());
  CHECK(rand({8}, g1).to_vector<double>() != rand({8}, g1).to_vector<double>());
}

TEST_CASE("rand, randn and normal of a large tensor (filled on several threads) equal their per-element formula",
          "[philox]") {
  // 2^21 + 3 elements: several chunks, an odd last element (randn's unpaired cosine), stream 0 (rand), 1 (randn),
  // 2 (normal) of seed 17; every element against philox_word, so a chunk that drew the wrong Philox block at its
  // start, or a pair split between blocks, fails. The f32 tensor is the f64 values rounded once.
  const int64_t n = (int64_t{1} << 21) + 3;
  Generator gen(17);
  const Tensor u = rand({n}, gen, {DType::f64});
  const Tensor z = randn({n}, gen, {DType::f64});
  const Tensor y = normal({n}, 0.5, 0.02, gen, {DType::f64});
  Generator again(17);
  again.next_stream();
  again.next_stream();
  const Tensor y32 = normal({n}, 0.5, 0.02, again, {DType::f32});
  const double* pu = u.data<double>();
  const double* pz = z.data<double>();
  const double* py = y.data<double>();
  const float* py32 = y32.data<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool u_ok = pu[i] == static_cast<double>(uniform_from_word(philox_word(17, 0, static_cast<uint64_t>(i))));
    double zz[2];
    for (uint64_t stream : {uint64_t{1}, uint64_t{2}}) {
      const uint64_t j = static_cast<uint64_t>(i - i % 2);
      const double u1 = (static_cast<double>(philox_word(17, stream, j) >> 8) + 0.5) / 16777216.0;
      const double u2 = static_cast<double>(uniform_from_word(philox_word(17, stream, j + 1)));
      const double r = std::sqrt(-2.0 * std::log(u1));
      zz[stream - 1] = i % 2 == 0 ? r * std::cos(2.0 * M_PI * u2) : r * std::sin(2.0 * M_PI * u2);
    }
    const double want_y = 0.5 + 0.02 * zz[1];
    if (!u_ok || pz[i] != zz[0] || py[i] != want_y || py32[i] != static_cast<float>(want_y)) {
      if (++bad <= 5) FAIL_CHECK("element " << i << ": rand " << pu[i] << ", randn " << pz[i] << " (want " << zz[0]
                                             << "), normal " << py[i] << " (want " << want_y << ")");
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("philox_block gives the four words philox_word gives one at a time", "[philox]") {
  for (uint64_t block : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, uint64_t{1} << 40}) {
    uint32_t w[4];
    philox_block(3, 77, block, w);
    for (uint64_t j = 0; j < 4; ++j) CHECK(w[j] == philox_word(3, 77, 4 * block + j));
  }
}

TEST_CASE("a step-keyed generator draws philox_stream(k, step, kDrawPurpose), k restarting at every step",
          "[philox]") {
  StepSource clock;
  Generator g(21);
  const RandomDraw unkeyed = g.draw();  // the counter, as next_stream()
  CHECK(unkeyed.stream == 0);
  CHECK(g.state() == 1);
  g.key_by_step(&clock);
  CHECK(g.keyed());
  clock.step = 7;
  for (uint32_t k = 0; k < 3; ++k) {
    const RandomDraw d = g.draw();
    CHECK(d.seed == 21);
    CHECK(d.stream == philox_stream(k, 7, Generator::kDrawPurpose));
    CHECK(d.step_word == nullptr);
  }
  CHECK(g.state() == 3);  // the draw index in the step
  g.set_state(1);         // an activation checkpoint's rewind: the recompute draws the forward's streams again
  CHECK(g.draw().stream == philox_stream(1, 7, Generator::kDrawPurpose));
  clock.step = 8;
  CHECK(g.draw().stream == philox_stream(0, 8, Generator::kDrawPurpose));
  // With a device word the stream carries step 0 and the word is passed on, for the kernel to add.
  const int64_t word = static_cast<int64_t>(uint64_t{9} << 8);
  clock.device_word = &word;
  clock.step = 9;
  const RandomDraw d = g.draw();
  CHECK(d.stream == philox_stream(0, 0, Generator::kDrawPurpose));
  CHECK(d.step_word == &word);
  CHECK(d.stream + static_cast<uint64_t>(word) == philox_stream(0, 9, Generator::kDrawPurpose));
  CHECK_THROWS_WITH(g.next_stream(), HasSubstr("step-keyed generator"));
  g.key_by_step(nullptr);
  CHECK(g.next_stream() == 1);  // the counter where it was
}
