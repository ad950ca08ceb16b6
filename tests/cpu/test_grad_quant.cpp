// Quantisation primitives of the gradient pipelines (include/hadatrain/grad/quant.h), CPU reference:
// block Hadamard against the closed form (−1)^popcount(i&j), quantize (granularities, absmax / SAWB, nearest /
// stochastic) against naive loops and hand-computed cases, SR unbiasedness over noise streams, e4m3 codes,
// transposed values, the reported and the given max |x|, zero groups and dequantize. Dequantised outputs
// (values_dtype), LUQ, int4 packing and the errors: test_grad_quant_outputs.cpp.
#include "support/catch.h"
#include "support/quant_testing.h"
#include "support/testing.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/grad/quant.h"
#include "hadatrain/grad/sr_noise.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/philox.h"

using namespace ht;
using namespace ht::grad;
using test::spec_of;
using test::values_of;

namespace {

// x·H_T per run of T values along the last dim, by the closed form, in double.
std::vector<double> hadamard_naive(const std::vector<double>& x, int64_t block) {
  std::vector<double> y(x.size(), 0.0);
  for (std::size_t base = 0; base < x.size(); base += static_cast<std::size_t>(block))
    for (int64_t j = 0; j < block; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < block; ++i) {
        const double sign = (std::popcount(static_cast<uint64_t>(i & j)) % 2) ? -1.0 : 1.0;
        acc += sign * x[base + static_cast<std::size_t>(i)];
      }
      y[base + static_cast<std::size_t>(j)] = acc;
    }
  return y;
}

// Integer-valued inputs in [-20, 20]: every butterfly result is exact in f32.
Tensor integer_input(const Shape& shape, uint64_t seed) {
  std::vector<double> v = values_of(test::random_tensor(shape, seed, DType::f64, -20.0, 20.0));
  for (double& e : v) e = std::round(e);
  return from_vector(v, shape, {DType::f32});
}

bool same_quantized(const Quantized& a, const Quantized& b) {
  return a.values.shape() == b.values.shape() && values_of(a.values) == values_of(b.values) &&
         a.scale.shape() == b.scale.shape() && values_of(a.scale) == values_of(b.scale);
}

// Naive absmax + nearest quantisation of one group, in the fp32 steps of the Note (the reciprocal
// r = qmax / m once per group, then one multiply per element).
std::vector<double> naive_nearest(const std::vector<float>& g, int qmax, float* scale_out) {
  float m = 0;
  for (float v : g) m = std::max(m, std::fabs(v));
  *scale_out = m == 0 ? 0.0f : m / static_cast<float>(qmax);
  const float r = m == 0 ? 0.0f : static_cast<float>(qmax) / m;
  std::vector<double> q;
  for (float v : g) q.push_back(m == 0 ? 0.0 : std::nearbyint(v * r));
  return q;
}

// The 16 noise bits of element i, written out from Note [SR noise layout] with the generic Philox call:
// block i / 8 of the stream, word (i % 8) / 2, low half for even i, high half for odd i.
uint32_t naive_noise16(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t blk = i / 8;
  const PhiloxCounter ctr = {static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32),
                             static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t word = philox4x32_10(ctr, key)[(i % 8) / 2];
  return i % 2 == 0 ? (word & 0xFFFFu) : (word >> 16);
}

}  // namespace

TEST_CASE("hadamard_blocks equals the closed-form Sylvester product", "[grad_quant]") {
  for (int64_t block : {1, 2, 4, 16, 32}) {
    CAPTURE(block);
    const Shape shape{3, 5, 64};
    // Integer inputs: exact.
    const Tensor xi = integer_input(shape, 11 + static_cast<uint64_t>(block));
    CHECK(values_of(hadamard_blocks(xi, block)) == hadamard_naive(values_of(xi), block));
    // Random f32: within f32 rounding of the exact sums (log2(T) roundings of values up to T·max|x|).
    const Tensor xf = test::random_tensor(shape, 21, DType::f32);
    const Tensor y = hadamard_blocks(xf, block);
    CHECK(y.dtype() == DType::f32);
    CHECK(y.shape() == shape);
    CHECK(test::compare(y, hadamard_naive(values_of(xf), block), 0.0, 1e-6 * static_cast<double>(block)) == "");
  }
  // H_T·H_T = T·I: rotating twice gives T·x exactly for integer inputs.
  const Tensor xi = integer_input({7, 16}, 3);
  const auto twice = values_of(hadamard_blocks(hadamard_blocks(xi, 16), 16));
  const auto x = values_of(xi);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(twice[i] == 16.0 * x[i]);
}

TEST_CASE("hadamard_blocks takes non-contiguous, bf16 and f64 inputs", "[grad_quant]") {
  const Tensor x = integer_input({16, 6}, 5);
  const Tensor xt = x.transpose(0, 1);  // (6, 16), non-contiguous
  CHECK(values_of(hadamard_blocks(xt, 8)) == values_of(hadamard_blocks(xt.contiguous(), 8)));
  CHECK(values_of(hadamard_blocks(xt, 8)) == hadamard_naive(values_of(xt.contiguous()), 8));
  CHECK(values_of(hadamard_blocks(x.to(DType::bf16), 2)) == hadamard_naive(values_of(x), 2));
  CHECK(values_of(hadamard_blocks(x.to(DType::f64), 2)) == hadamard_naive(values_of(x), 2));
}

TEST_CASE("quantize with nearest rounding: a hand-computed case", "[grad_quant]") {
  // bits 3: qmax 3; max |x| = 3 so s = 1 and v = x exactly; ties go to even.
  const Tensor x = from_vector(std::vector<float>{0.5f, -1.5f, 2.5f, -3.0f, 0.49f, 1.2f, 0.0f, -2.6f}, {2, 4});
  const Quantized q = quantize(x, spec_of(3, Granularity::tensor, ScaleRule::absmax, Rounding::nearest));
  CHECK(q.values.dtype() == DType::i8);
  CHECK(q.values.shape() == Shape{2, 4});
  CHECK(values_of(q.values) == std::vector<double>{0, -2, 2, -3, 0, 1, 0, -3});
  CHECK(q.scale.shape() == Shape{1});
  CHECK(values_of(q.scale) == std::vector<double>{1.0});
  // Row granularity: row 0 has m = 3 (s = 1), row 1 m = 2.6 (s = 2.6f / 3).
  const Quantized r = quantize(x, spec_of(3, Granularity::row, ScaleRule::absmax, Rounding::nearest));
  const float s1 = 2.6f / 3.0f;
  CHECK(values_of(r.scale) == std::vector<double>{1.0, s1});
  CHECK(values_of(r.values) == std::vector<double>{0, -2, 2, -3, std::nearbyint(0.49f / s1), std::nearbyint(1.2f / s1),
                                                   0, -3});
}

TEST_CASE("quantize: granularities give the right scale shapes and values", "[grad_quant]") {
  const Shape shape{3, 4, 8};
  const Tensor x = test::random_tensor(shape, 7, DType::f32, -3.0, 3.0);
  const auto xv = x.to_vector<float>();
  struct Case {
    Granularity g;
    int64_t groups;
  };
  for (const Case c : {Case{Granularity::tensor, 1}, Case{Granularity::sample, 3}, Case{Granularity::row, 12}}) {
    for (int bits : {2, 4, 8}) {
      CAPTURE(static_cast<int>(c.g), bits);
      const Quantized q = quantize(x, spec_of(bits, c.g, ScaleRule::absmax, Rounding::nearest));
      REQUIRE(q.scale.shape() == Shape{c.groups});
      const int64_t len = 96 / c.groups;
      const auto qv = values_of(q.values);
      const auto sv = values_of(q.scale);
      for (int64_t g = 0; g < c.groups; ++g) {
        std::vector<float> grp(xv.begin() + g * len, xv.begin() + (g + 1) * len);
        float s = 0;
        const auto expect = naive_nearest(grp, qmax_of(bits), &s);
        CHECK(sv[static_cast<std::size_t>(g)] == static_cast<double>(s));
        for (int64_t i = 0; i < len; ++i) CHECK(qv[static_cast<std::size_t>(g * len + i)] == expect[static_cast<std::size_t>(i)]);
      }
      // The group maximum maps to ±qmax.
      double biggest = 0;
      for (double v : qv) biggest = std::max(biggest, std::fabs(v));
      CHECK(biggest == qmax_of(bits));
    }
  }
}

TEST_CASE("quantize rotates before scaling (T > 1) and keys noise by row-major index", "[grad_quant]") {
  const Tensor x = test::random_tensor({5, 32}, 9, DType::f32);
  const QuantSpec plain = spec_of(4, Granularity::row, ScaleRule::absmax, Rounding::stochastic, 1, {42, 7});
  QuantSpec rot = plain;
  rot.hadamard_block = 16;
  CHECK(same_quantized(quantize(x, rot), quantize(hadamard_blocks(x, 16), plain)));
  // Non-contiguous input: same result as its dense copy (noise index = logical row-major index).
  const Tensor big = test::random_tensor({32, 5}, 10, DType::f32);
  const Tensor xt = big.transpose(0, 1);
  CHECK(same_quantized(quantize(xt, rot), quantize(xt.contiguous(), rot)));
  // Same noise, same result; another stream or seed, a different one.
  CHECK(same_quantized(quantize(x, rot), quantize(x, rot)));
  QuantSpec other = rot;
  other.noise.stream = 8;
  CHECK(!same_quantized(quantize(x, rot), quantize(x, other)));
  other = rot;
  other.noise.seed = 43;
  CHECK(!same_quantized(quantize(x, rot), quantize(x, other)));
}

TEST_CASE("quantize takes bf16, f16 and f64 inputs as their f32 values", "[grad_quant]") {
  const Tensor x = test::random_tensor({4, 16}, 12, DType::bf16);
  const QuantSpec s = spec_of(4, Granularity::sample, ScaleRule::sawb, Rounding::stochastic, 4, {1, 2});
  CHECK(same_quantized(quantize(x, s), quantize(x.to(DType::f32), s)));
  CHECK(same_quantized(quantize(x.to(DType::f16), s), quantize(x.to(DType::f32), s)));
  const Tensor x64 = test::random_tensor({4, 16}, 13, DType::f64);
  CHECK(same_quantized(quantize(x64, s), quantize(x64.to(DType::f32), s)));
}

TEST_CASE("stochastic rounding is unbiased over noise streams", "[grad_quant]") {
  const int64_t n = 64;
  const Tensor x = test::random_tensor({n}, 14, DType::f32, -1.0, 1.0);
  const auto xv = values_of(x);
  const int draws = 4000;
  std::vector<double> mean(static_cast<std::size_t>(n), 0.0);
  float scale = 0;
  for (int d = 0; d < draws; ++d) {
    const Quantized q =
        quantize(x, spec_of(4, Granularity::tensor, ScaleRule::absmax, Rounding::stochastic, 1, {5, static_cast<uint64_t>(d)}));
    scale = static_cast<float>(q.scale.item());
    const auto qv = values_of(q.values);
    for (int64_t i = 0; i < n; ++i) {
      const double v = xv[static_cast<std::size_t>(i)] / scale;
      const double f = std::floor(v);
      REQUIRE((qv[static_cast<std::size_t>(i)] == f || qv[static_cast<std::size_t>(i)] == f + 1));  // neighbours only
      mean[static_cast<std::size_t>(i)] += qv[static_cast<std::size_t>(i)] * scale / draws;
    }
  }
  // A Bernoulli mean of `draws` samples has σ <= 0.5 / sqrt(draws) levels: allow 6 σ, plus the bias of the
  // 16-bit uniform (at most 2^−17 of a level, Note [SR noise layout]) and fp32 slack.
  const double bound = (6.0 * 0.5 / std::sqrt(static_cast<double>(draws)) + std::ldexp(1.0, -17)) * scale + 1e-6;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(mean[static_cast<std::size_t>(i)] - xv[static_cast<std::size_t>(i)]));
  CHECK(worst < bound);
  // Not trivially unbiased: single draws differ from x.
  const Quantized one = quantize(x, spec_of(4, Granularity::tensor, ScaleRule::absmax, Rounding::stochastic));
  CHECK(test::compare(dequantize(one, Granularity::tensor), x, 0.0, 1e-3) != "");
}

TEST_CASE("stochastic rounding follows Note [SR noise layout] and the reciprocal definition exactly",
          "[grad_quant]") {
  // The shared helpers equal the layout written out by hand (eight elements per Philox block).
  for (uint64_t i : {0ull, 1ull, 6ull, 7ull, 8ull, 13ull, 1000001ull, (1ull << 35) + 3})
    CHECK(sr_noise(0x1234567890ull, 0xfeedull, i) == naive_noise16(0x1234567890ull, 0xfeedull, i));
  CHECK(sr_uniform(0) == std::ldexp(1.0f, -17));
  CHECK(sr_uniform(0xFFFF) == 1.0f - std::ldexp(1.0f, -17));
  CHECK(sr_uniform(12345) == static_cast<float>(2 * 12345 + 1) * std::ldexp(1.0f, -17));
  // quantize() against a naive implementation of step 4 on odd-sized groups (row starts not multiples of 8).
  const Tensor x = test::random_tensor({7, 21}, 31, DType::f32, -2.0, 2.0);
  const auto xv = x.to_vector<float>();
  const Noise noise{99, 0xabcdef};
  for (int bits : {2, 4, 8}) {
    const int qmax = qmax_of(bits);
    const Quantized q = quantize(x, spec_of(bits, Granularity::row, ScaleRule::absmax, Rounding::stochastic, 1, noise));
    const auto qv = values_of(q.values);
    for (int64_t row = 0; row < 7; ++row) {
      float m = 0;
      for (int64_t j = 0; j < 21; ++j) m = std::max(m, std::fabs(xv[static_cast<std::size_t>(row * 21 + j)]));
      const float r = static_cast<float>(qmax) / m;
      CHECK(values_of(q.scale)[static_cast<std::size_t>(row)] == static_cast<double>(m / static_cast<float>(qmax)));
      for (int64_t j = 0; j < 21; ++j) {
        const int64_t i = row * 21 + j;
        const float v = xv[static_cast<std::size_t>(i)] * r;
        const float a = std::fabs(v), f = std::floor(a);
        const float u = static_cast<float>(2 * naive_noise16(noise.seed, noise.stream, static_cast<uint64_t>(i)) + 1) *
                        std::ldexp(1.0f, -17);
        const float lvl = std::min(f + (u < a - f ? 1.0f : 0.0f), static_cast<float>(qmax));
        CAPTURE(bits, i);
        CHECK(qv[static_cast<std::size_t>(i)] == (v < 0 ? -lvl : lvl));
      }
    }
  }
}

TEST_CASE("quantize writes e4m3 codes of the levels when asked (fp8 carrier)", "[grad_quant]") {
  const Tensor x = test::random_tensor({6, 48}, 33, DType::bf16, -3.0, 3.0);
  for (int bits : {2, 4, 5}) {
    QuantSpec s = spec_of(bits, Granularity::row, ScaleRule::absmax, Rounding::stochastic, 16, {3, 4});
    const Quantized qi = quantize(x, s);
    s.values_dtype = DType::f8e4m3;
    const Quantized qf = quantize(x, s);
    CAPTURE(bits);
    CHECK(qf.values.dtype() == DType::f8e4m3);
    CHECK(values_of(qf.values) == values_of(qi.values));  // exact: every level −15..15 is an e4m3 value
    CHECK(values_of(qf.scale) == values_of(qi.scale));
    CHECK(test::compare(dequantize(qf, Granularity::row), dequantize(qi, Granularity::row), 0.0, 0.0) == "");
  }
  // Zero levels are +0 (the code an int8 0 converts to).
  QuantSpec z = spec_of(4, Granularity::tensor, ScaleRule::absmax, Rounding::nearest);
  z.values_dtype = DType::f8e4m3;
  const Quantized qz = quantize(from_vector(std::vector<float>{-0.01f, 0.0f, -7.0f, 7.0f}, {4}), z);
  const Tensor codes = qz.values.contiguous();
  const auto* c = static_cast<const uint8_t*>(codes.data_ptr());
  CHECK(c[0] == 0x00);
  CHECK(c[1] == 0x00);
  CHECK(c[2] == 0xCE);  // −7 = −1.75·2^2
  CHECK(c[3] == 0x4E);
  // More than 5 bits cannot be carried exactly.
  z.bits = 6;
  CHECK_THROWS_WITH(quantize(x, z), HasSubstr("f8e4m3 with bits <= 5"));
}

TEST_CASE("quantize with transposed values stores the (N, C) levels as (C, N)", "[grad_quant]") {
  const Tensor x = test::random_tensor({3, 5, 24}, 34, DType::f32);
  for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
    QuantSpec s = spec_of(8, Granularity::tensor, ScaleRule::sawb, r, 1, {8, 9});
    const Quantized nat = quantize(x, s);
    s.layout = ValuesLayout::transposed;
    const Quantized tr = quantize(x, s);
    CHECK(tr.values.shape() == Shape{24, 15});
    CHECK(tr.values.is_contiguous());
    CHECK(values_of(tr.values) == values_of(reshape(nat.values, {15, 24}).transpose(0, 1).contiguous()));
    CHECK(values_of(tr.scale) == values_of(nat.scale));
  }
  QuantSpec bad = spec_of(8, Granularity::row, ScaleRule::absmax, Rounding::nearest);
  bad.layout = ValuesLayout::transposed;
  CHECK_THROWS_WITH(quantize(x, bad), HasSubstr("transposed values need tensor granularity"));
  bad.granularity = Granularity::tensor;
  bad.hadamard_block = 8;
  CHECK_THROWS_WITH(quantize(x, bad), HasSubstr("hadamard_block 1"));
}

TEST_CASE("quantize reports max |x| before rotation and accepts a known absmax", "[grad_quant]") {
  Tensor x = test::random_tensor({4, 32}, 35, DType::f32);
  fill_(x.narrow(0, 2, 1).narrow(1, 5, 1), -9.5);  // the largest magnitude, negative
  QuantSpec rows = spec_of(4, Granularity::row, ScaleRule::absmax, Rounding::stochastic, 16, {1, 1});
  CHECK(!quantize(x, rows).input_absmax.defined());
  rows.report_input_absmax = true;
  const Quantized qr = quantize(x, rows);
  REQUIRE(qr.input_absmax.defined());
  CHECK(values_of(qr.input_absmax) == std::vector<double>{9.5});  // unrotated (the rotated maximum is larger)
  CHECK(same_quantized(qr, quantize(x, spec_of(4, Granularity::row, ScaleRule::absmax, Rounding::stochastic, 16, {1, 1}))));
  // The same x quantised again with that m: identical to computing it.
  QuantSpec t = spec_of(8, Granularity::tensor, ScaleRule::absmax, Rounding::stochastic, 1, {2, 3});
  const Quantized plain = quantize(x, t);
  t.known_absmax = qr.input_absmax;
  CHECK(same_quantized(quantize(x, t), plain));
  t.layout = ValuesLayout::transposed;
  QuantSpec tt = spec_of(8, Granularity::tensor, ScaleRule::absmax, Rounding::stochastic, 1, {2, 3});
  tt.layout = ValuesLayout::transposed;
  CHECK(same_quantized(quantize(x, t), quantize(x, tt)));
  // A different m is used as given.
  t.layout = ValuesLayout::natural;
  t.known_absmax = from_vector(std::vector<float>{19.0f}, {1});
  const Quantized half = quantize(x, t);
  CHECK(values_of(half.scale) == std::vector<double>{static_cast<double>(19.0f / 127.0f)});
  // Errors: only tensor granularity with absmax, one f32 element.
  t.granularity = Granularity::row;
  CHECK_THROWS_WITH(quantize(x, t), HasSubstr("known_absmax needs tensor granularity and the absmax scale rule"));
  t.granularity = Granularity::tensor;
  t.scale_rule = ScaleRule::sawb;
  CHECK_THROWS_WITH(quantize(x, t), HasSubstr("known_absmax needs tensor granularity"));
  t.scale_rule = ScaleRule::absmax;
  t.known_absmax = from_vector(std::vector<float>{1.0f, 2.0f}, {2});
  CHECK_THROWS_WITH(quantize(x, t), HasSubstr("one f32 element"));
}

TEST_CASE("SAWB scale follows its formula and falls back to absmax when α <= 0", "[grad_quant]") {
  // Gaussian-like data: α = 12.1 sqrt(E x²) − 12.2 E|x| in double, m = float(α), s = m / qmax.
  Generator gen(17);
  const Tensor x = randn({2, 300}, gen);
  const auto xv = x.to_vector<float>();
  const Quantized q = quantize(x, spec_of(4, Granularity::sample, ScaleRule::sawb, Rounding::nearest));
  for (int g = 0; g < 2; ++g) {
    double s1 = 0, s2 = 0;
    float amax = 0;
    for (int i = 0; i < 300; ++i) {
      const double d = xv[static_cast<std::size_t>(g * 300 + i)];
      s1 += std::fabs(d);
      s2 += d * d;
      amax = std::max(amax, static_cast<float>(std::fabs(d)));
    }
    const float m = static_cast<float>(12.1 * std::sqrt(s2 / 300) - 12.2 * (s1 / 300));
    REQUIRE(m > 0);
    CHECK(m < amax);  // SAWB clips Gaussian data below its maximum
    CHECK(values_of(q.scale)[static_cast<std::size_t>(g)] == static_cast<double>(m / 7.0f));
    // Clipped elements map to ±qmax.
    const auto qv = values_of(q.values);
    for (int i = 0; i < 300; ++i)
      if (std::fabs(xv[static_cast<std::size_t>(g * 300 + i)]) >= m) CHECK(std::fabs(qv[static_cast<std::size_t>(g * 300 + i)]) == 7);
  }
  // All |x| equal: α = 12.1 − 12.2 < 0, so the scale is the absmax one (1 / 7) and values are ±7.
  const Tensor flat = from_vector(std::vector<float>{1, -1, 1, -1, -1, 1}, {6});
  const Quantized f = quantize(flat, spec_of(4, Granularity::tensor, ScaleRule::sawb, Rounding::nearest));
  CHECK(values_of(f.scale) == std::vector<double>{1.0f / 7.0f});
  CHECK(values_of(f.values) == std::vector<double>{7, -7, 7, -7, -7, 7});
}

TEST_CASE("quantize: zero groups give zeros and scale 0; empty tensors work", "[grad_quant]") {
  for (Rounding r : {Rounding::nearest, Rounding::stochastic})
    for (ScaleRule rule : {ScaleRule::absmax, ScaleRule::sawb}) {
      const Quantized z = quantize(zeros({3, 8}), spec_of(4, Granularity::tensor, rule, r, 8));
      CHECK(values_of(z.values) == std::vector<double>(24, 0.0));
      CHECK(values_of(z.scale) == std::vector<double>{0.0});
    }
  // One zero row among non-zero rows.
  Tensor x = test::random_tensor({3, 8}, 2, DType::f32);
  fill_(x.narrow(0, 1, 1), 0.0);
  const Quantized r = quantize(x, spec_of(4, Granularity::row, ScaleRule::absmax, Rounding::stochastic));
  const auto sv = values_of(r.scale);
  CHECK(sv[0] > 0);
  CHECK(sv[1] == 0);
  CHECK(sv[2] > 0);
  const auto qv = values_of(r.values);
  for (int i = 8; i < 16; ++i) CHECK(qv[static_cast<std::size_t>(i)] == 0);
  // Empty: tensor granularity has one (zero) scale, sample none.
  const Quantized e = quantize(zeros({0, 4}), spec_of(4, Granularity::tensor, ScaleRule::absmax, Rounding::nearest));
  CHECK(e.values.numel() == 0);
  CHECK(values_of(e.scale) == std::vector<double>{0.0});
  CHECK(quantize(zeros({0, 4}), spec_of(4, Granularity::sample, ScaleRule::absmax, Rounding::nearest)).scale.numel() == 0);
}

TEST_CASE("dequantize multiplies each value by its group's scale", "[grad_quant]") {
  const Tensor x = test::random_tensor({3, 4, 8}, 8, DType::f32);
  for (Granularity g : {Granularity::tensor, Granularity::sample, Granularity::row}) {
    const Quantized q = quantize(x, spec_of(8, g, ScaleRule::absmax, Rounding::nearest));
    const Tensor d = dequantize(q, g);
    CHECK(d.dtype() == DType::f32);
    CHECK(d.shape() == x.shape());
    const auto qv = values_of(q.values), sv = values_of(q.scale), dv = values_of(d);
    const std::size_t len = 96 / sv.size();
    for (std::size_t i = 0; i < 96; ++i) CHECK(dv[i] == static_cast<double>(static_cast<float>(qv[i]) * static_cast<float>(sv[i / len])));
    // 8 bits, nearest: within half a level of x.
    CHECK(test::compare(d, x, 0.0, 0.5 * *std::max_element(sv.begin(), sv.end()) + 1e-7) == "");
  }
  const Quantized q = quantize(x, spec_of(4, Granularity::row, ScaleRule::absmax, Rounding::nearest));
  CHECK_THROWS_WITH(dequantize(q, Granularity::sample), HasSubstr("scales"));
}
