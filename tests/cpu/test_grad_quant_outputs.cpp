// Quantiser outputs beyond the int8 levels (include/hadatrain/grad/quant.h), CPU reference: dequantised values
// (values_dtype bf16 / f16 / f32: the int8 run's levels times its scales, rounded once; +0 for zero levels; the
// invalid combinations), LUQ levels and unbiasedness (max |x|, not the signed max: hlq.md §7 #10), pack /
// unpack int4 and the errors of quantize and friends. The levels themselves: test_grad_quant.cpp.
#include "support/catch.h"
#include "support/quant_testing.h"
#include "support/testing.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/shape_ops.h"

using namespace ht;
using namespace ht::grad;
using test::spec_of;
using test::values_of;

namespace {

// The raw bytes of a tensor (contiguous copy on the CPU).
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> b(static_cast<std::size_t>(c.nbytes()));
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}

// What values_dtype dt must hold, from the int8 run qi: convert(float(level) · scale of its group) (one f32
// product, one rounding to dt), a NaN product as the quiet NaN 0x7FC00000.
Tensor expected_dequantised(const Quantized& qi, DType dt) {
  const std::vector<float> level = qi.values.to_vector<float>(), scale = qi.scale.to_vector<float>();
  const std::size_t len = scale.empty() ? 0 : level.size() / scale.size();
  std::vector<float> d(level.size());
  for (std::size_t i = 0; i < d.size(); ++i) {
    d[i] = level[i] * scale[i / len];
    if (std::isnan(d[i])) d[i] = std::bit_cast<float>(0x7FC00000u);
  }
  return to_dtype(from_vector(d, qi.values.shape(), {DType::f32}), dt);
}

}  // namespace

TEST_CASE("quantize writes dequantised bf16 / f16 / f32 values: the int8 run's levels times its scales",
          "[grad_quant]") {
  uint64_t seed = 40;
  for (DType in : {DType::bf16, DType::f32}) {
    const Tensor x = test::random_tensor({3, 5, 48}, ++seed, in, -3.0, 3.0);
    for (Granularity g : {Granularity::tensor, Granularity::sample, Granularity::row})
      for (int64_t block : {1, 4, 16})
        for (int bits : {2, 4, 8})
          for (ScaleRule rule : {ScaleRule::absmax, ScaleRule::sawb})
            for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
              QuantSpec s = spec_of(bits, g, rule, r, block, {seed, 0x77});
              s.report_input_absmax = true;
              const Quantized qi = quantize(x, s);
              for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
                CAPTURE(dtype_name(in), static_cast<int>(g), block, bits, rule == ScaleRule::sawb,
                        r == Rounding::stochastic, dtype_name(dt));
                s.values_dtype = dt;
                const Quantized qd = quantize(x, s);
                CHECK(qd.values.dtype() == dt);
                CHECK(qd.values.shape() == x.shape());
                CHECK(qd.values.is_contiguous());
                CHECK(bytes_of(qd.values) == bytes_of(expected_dequantised(qi, dt)));
                CHECK(bytes_of(qd.scale) == bytes_of(qi.scale));
                CHECK(bytes_of(qd.input_absmax) == bytes_of(qi.input_absmax));
              }
            }
  }
  // A known absmax (tensor granularity) and 1-D inputs take the same route.
  const Tensor x = test::random_tensor({96}, 49, DType::f32);
  QuantSpec t = spec_of(4, Granularity::tensor, ScaleRule::absmax, Rounding::stochastic, 16, {1, 2});
  t.known_absmax = from_vector(std::vector<float>{0.75f}, {1});  // clips the larger values
  const Quantized ti = quantize(x, t);
  t.values_dtype = DType::bf16;
  CHECK(bytes_of(quantize(x, t).values) == bytes_of(expected_dequantised(ti, DType::bf16)));
}

TEST_CASE("dequantised values: hand-computed cases, +0 for zero levels, the product rounded once", "[grad_quant]") {
  // bits 3 (qmax 3), tensor absmax 3: s = 1, levels 0, −2, 2, −3 (ties to even), −0.01 -> level 0 stored +0.
  const Tensor x = from_vector(std::vector<float>{0.5f, -1.5f, 2.5f, -3.0f, -0.01f, 0.0f}, {6});
  QuantSpec s = spec_of(3, Granularity::tensor, ScaleRule::absmax, Rounding::nearest);
  s.values_dtype = DType::bf16;
  const Quantized q = quantize(x, s);
  CHECK(values_of(q.values) == std::vector<double>{0, -2, 2, -3, 0, 0});
  const std::vector<uint8_t> b = bytes_of(q.values);
  CHECK(b[8] == 0x00);  // element 4 (level 0 of a negative input): +0, not −0 (0x8000)
  CHECK(b[9] == 0x00);
  CHECK(values_of(q.scale) == std::vector<double>{1.0});
  // Row scale s = 2.6f / 7 (4 bits): the stored values are the f32 products level · s (f32 output), and those
  // products rounded to nearest even (bf16 output).
  const Tensor y = from_vector(std::vector<float>{2.6f, -1.0f, 0.3f, 1.9f}, {1, 4});
  QuantSpec r = spec_of(4, Granularity::row, ScaleRule::absmax, Rounding::nearest);
  r.values_dtype = DType::f32;
  const Quantized qf = quantize(y, r);
  const float sc = 2.6f / 7.0f;
  const std::vector<float> want = {7.0f * sc, -3.0f * sc, 1.0f * sc, 5.0f * sc};  // levels 7, −3, 1, 5
  CHECK(qf.values.to_vector<float>() == want);
  r.values_dtype = DType::bf16;
  CHECK(bytes_of(quantize(y, r).values) == bytes_of(to_dtype(from_vector(want, {1, 4}), DType::bf16)));
  // An infinite input: m = inf, s = inf; the inf element gets level qmax (inf) and the others level 0, whose
  // product 0 · inf is stored as the quiet NaN 0x7FC00000 (bf16 0x7FC0).
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor z = from_vector(std::vector<float>{1.0f, inf, -2.0f, 0.0f}, {1, 4});
  r.values_dtype = DType::f32;
  const std::vector<float> zf = quantize(z, r).values.to_vector<float>();
  CHECK(std::bit_cast<uint32_t>(zf[0]) == 0x7FC00000u);
  CHECK(zf[1] == inf);
  CHECK(std::bit_cast<uint32_t>(zf[2]) == 0x7FC00000u);
  r.values_dtype = DType::bf16;
  const std::vector<uint8_t> zb = bytes_of(quantize(z, r).values);
  CHECK((zb[0] == 0xC0 && zb[1] == 0x7F));
  // Zero groups: zeros and scale 0.
  const Quantized q0 = quantize(zeros({2, 16}), r);
  CHECK(bytes_of(q0.values) == std::vector<uint8_t>(64, 0));
  CHECK(values_of(q0.scale) == std::vector<double>{0.0, 0.0});
}

TEST_CASE("dequantised values: invalid combinations are rejected by name", "[grad_quant]") {
  const Tensor x = test::random_tensor({4, 32}, 50, DType::f32);
  QuantSpec s = spec_of(4, Granularity::tensor, ScaleRule::absmax, Rounding::stochastic, 1, {1, 2});
  s.values_dtype = DType::bf16;
  s.layout = ValuesLayout::transposed;
  CHECK_THROWS_WITH(quantize(x, s), HasSubstr("dequantised values (values_dtype bf16) need the natural layout"));
  s.layout = ValuesLayout::natural;
  for (DType bad : {DType::f64, DType::f8e5m2, DType::i32, DType::u8}) {
    s.values_dtype = bad;
    CAPTURE(dtype_name(bad));
    CHECK_THROWS_WITH(quantize(x, s), HasSubstr(fmt::format("values_dtype must be i8, f8e4m3 with bits <= 5 (levels "
                                                            "exact in e4m3), or bf16 / f16 / f32 (dequantised values), "
                                                            "got {}",
                                                            dtype_name(bad))));
  }
  // dequantize() of values that are already dequantised says so.
  s.values_dtype = DType::f32;
  CHECK_THROWS_WITH(dequantize(quantize(x, s), Granularity::tensor), HasSubstr("already dequantised"));
}


TEST_CASE("LUQ: levels are 0 or ±2^k (k <= 7) and match the definition on crafted inputs", "[grad_quant]") {
  // One group with max |x| = 1: α = 1/128, a = |x| · 128.
  const std::vector<float> xs{1.0f, 0.25f / 128, -3.0f / 128, 0.0f, -1.0f / 128, 5.5f / 128};
  const Tensor x = from_vector(xs, {6});
  LuqSpec spec;
  spec.granularity = Granularity::tensor;
  int ones = 0, fours = 0, fours_b = 0;
  const int draws = 2000;
  for (int d = 0; d < draws; ++d) {
    spec.noise = {3, static_cast<uint64_t>(d)};
    const Quantized q = luq_quantize(x, spec);
    REQUIRE(q.values.dtype() == DType::f8e4m3);
    REQUIRE(values_of(q.scale) == std::vector<double>{1.0 / 128});
    const auto v = values_of(q.values);
    REQUIRE(v[0] == 128);                       // the maximum stays exactly 2^7
    REQUIRE((v[1] == 0 || v[1] == 1));          // a = 0.25: stochastic underflow
    REQUIRE((v[2] == -2 || v[2] == -4));        // a = 3: between 2 and 4, sign kept
    REQUIRE(v[3] == 0);
    REQUIRE(v[4] == -1);                        // a = 1 exactly: 2^0
    REQUIRE((v[5] == 4 || v[5] == 8));          // a = 5.5: p = 5.5/4 − 1 = 0.375
    ones += v[1] == 1;
    fours += v[2] == -4;
    fours_b += v[5] == 8;
  }
  // P(1) = 0.25, P(4 | a = 3) = 0.5, P(8 | a = 5.5) = 0.375; σ <= 0.5/sqrt(draws), allow 6 σ.
  const double tol = 6 * 0.5 / std::sqrt(static_cast<double>(draws));
  CHECK(std::fabs(ones / double(draws) - 0.25) < tol);
  CHECK(std::fabs(fours / double(draws) - 0.5) < tol);
  CHECK(std::fabs(fours_b / double(draws) - 0.375) < tol);
  // Random inputs: every value is 0 or ±2^k with k <= 7; bits 2 and 3 cap at 2^1 and 2^3.
  const Tensor r = test::random_tensor({4, 50}, 15, DType::f32, -5.0, 5.0);
  for (int bits : {2, 3, 4}) {
    LuqSpec s;
    s.bits = bits;
    s.noise = {9, 1};
    const Quantized q = luq_quantize(r, s);
    CHECK(q.scale.shape() == Shape{4});
    const int top = (1 << (bits - 1)) - 1;
    for (double v : values_of(q.values)) {
      const double a = std::fabs(v);
      bool ok = a == 0;
      for (int k = 0; k <= top; ++k) ok = ok || a == std::ldexp(1.0, k);
      CHECK(ok);
    }
  }
}

TEST_CASE("LUQ is unbiased over seeds and uses max |x| (all-negative input)", "[grad_quant]") {
  // All negative: the signed max (-0.05) would give α < 0 (hlq.md §7 #10); max |x| = 2 gives α = 2/128.
  const Tensor x = test::random_tensor({2, 40}, 16, DType::f32, -2.0, -0.05);
  Tensor xx = x.clone();
  fill_(xx.narrow(1, 0, 1), -2.0);
  const auto xv = values_of(xx);
  LuqSpec spec;
  spec.granularity = Granularity::sample;
  const int draws = 3000;
  std::vector<double> mean(xv.size(), 0.0);
  for (int d = 0; d < draws; ++d) {
    spec.noise = {static_cast<uint64_t>(d) * 7919 + 1, 77};  // a different seed per draw
    const Quantized q = luq_quantize(xx, spec);
    const auto sv = values_of(q.scale);
    REQUIRE(sv == std::vector<double>{2.0 / 128, 2.0 / 128});
    const auto v = values_of(q.values);
    REQUIRE(v[0] == -128);
    for (std::size_t i = 0; i < v.size(); ++i) {
      REQUIRE(v[i] <= 0);
      mean[i] += v[i] * sv[i / 40] / draws;
    }
  }
  // Per element the two levels are 2^k and 2^(k+1) (or 0 and 1) apart: σ <= 2^k·α/2/sqrt(draws) <= |x|/2/sqrt(draws).
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const double bound = 6.0 * std::max(std::fabs(xv[i]), 2.0 / 128) * 0.5 / std::sqrt(double(draws)) + 1e-7;
    CHECK(std::fabs(mean[i] - xv[i]) < bound);
  }
  // Zero groups: zeros and α = 0.
  const Quantized z = luq_quantize(zeros({2, 3}), spec);
  CHECK(values_of(z.values) == std::vector<double>(6, 0.0));
  CHECK(values_of(z.scale) == std::vector<double>{0.0, 0.0});
  // dequantize takes the e4m3 values.
  const Quantized q = luq_quantize(xx, spec);
  CHECK(values_of(dequantize(q, Granularity::sample))[0] == -2.0);
}

TEST_CASE("pack_int4 / unpack_int4 round trip, nibble order and range check", "[grad_quant]") {
  std::vector<int64_t> all;
  for (int i = 0; i < 3; ++i)
    for (int v = -8; v <= 7; ++v) all.push_back(v);  // 48 values
  const Tensor values = from_vector(all, {3, 16}, {DType::i8});
  const Tensor packed = pack_int4(values);
  CHECK(packed.dtype() == DType::i4x2);
  CHECK(packed.shape() == Shape{3, 16});
  CHECK(packed.nbytes() == 24);
  const Tensor back = unpack_int4(packed);
  CHECK(back.dtype() == DType::i8);
  CHECK(values_of(back) == values_of(values));
  // Element 0 in the low nibble, element 1 in the high nibble, two's complement.
  const Tensor two = pack_int4(from_vector(std::vector<int64_t>{1, -2, -8, 7}, {4}, {DType::i8}));
  const auto* bytes = static_cast<const uint8_t*>(two.data_ptr());
  CHECK(bytes[0] == 0xE1);
  CHECK(bytes[1] == 0x78);
  // Non-contiguous values are packed in row-major order.
  const Tensor t = values.reshape({6, 8}).transpose(0, 1);  // (8, 6)
  CHECK(values_of(unpack_int4(pack_int4(t))) == values_of(t.contiguous()));
  // Quantised 4-bit values fit.
  const Quantized q = quantize(test::random_tensor({4, 8}, 3, DType::f32), QuantSpec{});
  CHECK(values_of(unpack_int4(pack_int4(q.values))) == values_of(q.values));
  // Errors.
  CHECK_THROWS_WITH(pack_int4(from_vector(std::vector<int64_t>{1, 8}, {2}, {DType::i8})),
                    HasSubstr("value 8 at flat index 1"));
  CHECK_THROWS_WITH(pack_int4(from_vector(std::vector<int64_t>{1, 2, 3}, {3}, {DType::i8})), HasSubstr("even"));
  CHECK_THROWS_WITH(pack_int4(zeros({2, 4})), HasSubstr("expected i8"));
  CHECK_THROWS_WITH(unpack_int4(values), HasSubstr("expected i4x2"));
}

TEST_CASE("quantize and friends reject bad bits, blocks and dtypes", "[grad_quant]") {
  const Tensor x = test::random_tensor({2, 48}, 1, DType::f32);
  QuantSpec s;
  s.bits = 1;
  CHECK_THROWS_WITH(quantize(x, s), HasSubstr("bits must be in 2..8, got 1"));
  s.bits = 9;
  CHECK_THROWS_WITH(quantize(x, s), HasSubstr("bits must be in 2..8, got 9"));
  s.bits = 4;
  s.hadamard_block = 3;
  CHECK_THROWS_WITH(quantize(x, s), HasSubstr("power of two"));
  s.hadamard_block = 32;
  CHECK_THROWS_WITH(quantize(x, s), HasSubstr("hadamard_block 32 does not divide the last dim 48 of f32 (2, 48)"));
  CHECK_THROWS_WITH(hadamard_blocks(x, 0), HasSubstr("power of two"));
  CHECK_THROWS_WITH(hadamard_blocks(x, 64), HasSubstr("does not divide"));
  CHECK_THROWS_WITH(quantize(x.to(DType::i32), QuantSpec{}), HasSubstr("floating"));
  CHECK_THROWS_WITH(quantize(scalar_tensor(1.0), QuantSpec{}), HasSubstr("at least one dim"));
  LuqSpec l;
  l.bits = 5;
  CHECK_THROWS_WITH(luq_quantize(x, l), HasSubstr("bits must be in 2..4"));
}
