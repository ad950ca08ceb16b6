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

TEST_CASE("rand and randn of a large tensor (filled on several threads) equal their per-element formula",
          "[philox]") {
  // 2^21 + 3 elements: several chunks, an odd last element (randn's unpaired cosine), and the words of
  // stream 0 of seed 17 at the chunk edges and elsewhere.
  const int64_t n = (int64_t{1} << 21) + 3;
  Generator gen(17);
  const Tensor u = rand({n}, gen, {DType::f64});
  const Tensor z = randn({n}, gen, {DType::f64});
  const double* pu = u.data<double>();
  const double* pz = z.data<double>();
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{1} << 18, (int64_t{1} << 18) + 1, (n + 15) / 16, n / 2 + 1,
                    n - 3, n - 2, n - 1}) {
    INFO("element " << i);
    CHECK(pu[i] == static_cast<double>(uniform_from_word(philox_word(17, 0, static_cast<uint64_t>(i)))));
    const uint64_t j = static_cast<uint64_t>(i - i % 2);
    const double u1 = (static_cast<double>(philox_word(17, 1, j) >> 8) + 0.5) / 16777216.0;
    const double u2 = static_cast<double>(uniform_from_word(philox_word(17, 1, j + 1)));
    const double r = std::sqrt(-2.0 * std::log(u1));
    CHECK(pz[i] == (i % 2 == 0 ? r * std::cos(2.0 * M_PI * u2) : r * std::sin(2.0 * M_PI * u2)));
  }
}
