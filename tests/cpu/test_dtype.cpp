// DType conversions: exhaustive fp8 round trips and rounding, bf16/f16 edge cases, promotion, int4 packing.
#include <cmath>
#include <cstring>
#include <limits>

#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

namespace {
float bits_value_fp8(uint8_t code, int E, int M, int B) {  // independent decode: sum of powers of two
  const int e = (code >> M) & ((1 << E) - 1);
  const int m = code & ((1 << M) - 1);
  double v = 0;
  for (int i = 0; i < M; ++i)
    if (m & (1 << i)) v += std::pow(2.0, (e == 0 ? 1 - B : e - B) - (M - i));
  if (e != 0) v += std::pow(2.0, e - B);
  return static_cast<float>((code & 0x80) ? -v : v);
}
}  // namespace

TEST_CASE("fp8 e4m3: all 256 codes decode, re-encode, and round to nearest even", "[dtype]") {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float v = f8e4m3::from_bits(code);
    if ((c & 0x7F) == 0x7F) {
      CHECK(std::isnan(v));
      ++nan_codes;
      CHECK((f8e4m3(v).bits & 0x7F) == 0x7F);
      continue;
    }
    CHECK(v == bits_value_fp8(code, 4, 3, 7));
    CHECK(f8e4m3(v).bits == code);
  }
  CHECK(nan_codes == 2);
  CHECK(static_cast<float>(f8e4m3::from_bits(0x7E)) == 448.0f);
  CHECK(static_cast<float>(f8e4m3::from_bits(0x01)) == std::ldexp(1.0f, -9));
  CHECK(static_cast<float>(f8e4m3::from_bits(0x38)) == 1.0f);
  // Midpoints between neighbouring positive codes round to the even code; nudged midpoints round to nearest.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = f8e4m3::from_bits(static_cast<uint8_t>(c)), hi = f8e4m3::from_bits(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;
    const int even = (c % 2 == 0) ? c : c + 1;
    CHECK(f8e4m3(mid).bits == even);
    CHECK(f8e4m3(std::nextafter(mid, 0.0f)).bits == c);
    CHECK(f8e4m3(std::nextafter(mid, 1e9f)).bits == c + 1);
    CHECK(f8e4m3(-mid).bits == (even | 0x80));
  }
  // Saturation (Note [Narrow-float conversion]).
  CHECK(f8e4m3(1000.0f).bits == 0x7E);
  CHECK(f8e4m3(-1e30f).bits == 0xFE);
  CHECK(f8e4m3(INFINITY).bits == 0x7E);
  CHECK(f8e4m3(-INFINITY).bits == 0xFE);
  CHECK(f8e4m3(std::ldexp(1.0f, -11)).bits == 0x00);  // below half the smallest subnormal
  CHECK(f8e4m3(-0.0f).bits == 0x80);
}

TEST_CASE("fp8 e5m2: all 256 codes decode, re-encode, and round to nearest even", "[dtype]") {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float v = f8e5m2::from_bits(code);
    if ((c & 0x7C) == 0x7C) {
      if ((c & 3) == 0) {
        CHECK(std::isinf(v));
        CHECK(f8e5m2(v).bits == ((c & 0x80) | 0x7B));  // satfinite: Inf -> max
      } else {
        CHECK(std::isnan(v));
      }
      continue;
    }
    CHECK(v == bits_value_fp8(code, 5, 2, 15));
    CHECK(f8e5m2(v).bits == code);
  }
  CHECK(static_cast<float>(f8e5m2::from_bits(0x7B)) == 57344.0f);
  CHECK(static_cast<float>(f8e5m2::from_bits(0x3C)) == 1.0f);
  CHECK(static_cast<float>(f8e5m2::from_bits(0x01)) == std::ldexp(1.0f, -16));
  for (int c = 0; c < 0x7B; ++c) {
    const float lo = f8e5m2::from_bits(static_cast<uint8_t>(c)), hi = f8e5m2::from_bits(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;
    CHECK(f8e5m2(mid).bits == ((c % 2 == 0) ? c : c + 1));
    CHECK(f8e5m2(std::nextafter(mid, 0.0f)).bits == c);
    CHECK(f8e5m2(std::nextafter(mid, 1e9f)).bits == c + 1);
  }
  CHECK(f8e5m2(1e6f).bits == 0x7B);
  CHECK(std::isnan(static_cast<float>(f8e5m2(NAN))));
}

TEST_CASE("bf16 rounding edges", "[dtype]") {
  CHECK(static_cast<float>(bf16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);  // tie -> even
  CHECK(static_cast<float>(bf16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(static_cast<float>(bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::max()))));
  CHECK(std::isinf(static_cast<float>(bf16(INFINITY))));
  CHECK(std::isnan(static_cast<float>(bf16(NAN))));
  CHECK(bf16(-0.0f).bits == 0x8000);
  CHECK(bf16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(bf16(-NAN).bits == 0xFFC0);
  CHECK(static_cast<float>(bf16(3.0f)) == 3.0f);
}

TEST_CASE("f16 rounding edges, subnormals and overflow", "[dtype]") {
  CHECK(static_cast<float>(f16(65504.0f)) == 65504.0f);
  CHECK(static_cast<float>(f16(65519.0f)) == 65504.0f);
  CHECK(std::isinf(static_cast<float>(f16(65520.0f))));
  CHECK(static_cast<float>(f16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16(std::ldexp(1.0f, -25)).bits == 0x0000);                                 // tie -> even (0)
  CHECK(f16(std::ldexp(1.5f, -25)).bits == 0x0001);
  CHECK(f16(std::ldexp(3.0f, -25)).bits == 0x0002);  // 1.5 ulp ties to even 2
  CHECK(f16(std::ldexp(1.0f, -14)).bits == 0x0400);  // smallest normal
  CHECK(f16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3C00);
  CHECK(f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3C02);
  CHECK(f16(-0.0f).bits == 0x8000);
  CHECK(std::isnan(static_cast<float>(f16(NAN))));
  CHECK(f16(-INFINITY).bits == 0xFC00);
  // Every f16 code round-trips through float.
  for (int c = 0; c < 65536; ++c) {
    const f16 h = f16::from_bits(static_cast<uint16_t>(c));
    const float v = h;
    if (std::isnan(v)) continue;
    REQUIRE(f16(v).bits == c);
  }
}

TEST_CASE("tensor conversions go through the same rules", "[dtype]") {
  Tensor x = from_vector(std::vector<double>{1.0 + std::ldexp(1.0, -8), 500.0, -3.7, 2.5, 1e10}, {5});
  CHECK(x.to(DType::bf16).to_vector<double>()[0] == 1.0);
  CHECK(x.to(DType::f8e4m3).to_vector<double>()[1] == 448.0);
  const auto ints = x.to(DType::i8).to_vector<int64_t>();
  CHECK(ints[2] == -3);   // truncation toward zero
  CHECK(ints[4] == 127);  // saturation
  CHECK(x.to(DType::b8).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1, 1});
}

TEST_CASE("a large contiguous conversion (split over host threads) equals the element-wise rule", "[dtype]") {
  // 2^23 + 5 elements: at least two chunks of copy's threaded path and a ragged end; values spread over bf16's
  // rounding cases (ties, carries into the exponent, subnormals) by stepping the f32 bit pattern.
  const int64_t n = (int64_t{1} << 23) + 5;
  Tensor f = empty({n}, {DType::f32});
  float* pf = f.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(i) * 2654435761u;
    std::memcpy(&pf[i], &bits, 4);
    if (!std::isfinite(pf[i])) pf[i] = static_cast<float>(i);
  }
  const Tensor b = f.to(DType::bf16);
  const Tensor d = f.to(DType::f64);
  const Tensor c = clone(f);  // a same-dtype copy: memcpy per chunk
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool ok = b.data<bf16>()[i].bits == bf16(pf[i]).bits && d.data<double>()[i] == static_cast<double>(pf[i]);
    if (!ok && ++bad <= 3) FAIL_CHECK("element " << i);
  }
  CHECK(bad == 0);
  CHECK(std::memcmp(c.data<float>(), pf, static_cast<size_t>(n) * 4) == 0);
}

TEST_CASE("packed int4 stores two values per byte, low nibble first", "[dtype]") {
  Tensor x = from_vector(std::vector<double>{-8, 7, 3, -1, 9, -20, 2.6}, {7});
  Tensor p = x.to(DType::i4x2);
  CHECK(p.nbytes() == 4);
  const auto* bytes = static_cast<const uint8_t*>(p.data_ptr());
  CHECK(bytes[0] == 0x78);  // lo -8 (0x8), hi 7
  CHECK(bytes[1] == 0xF3);  // lo 3, hi -1 (0xF)
  CHECK(p.to(DType::i32).to_vector<int64_t>() == std::vector<int64_t>{-8, 7, 3, -1, 7, -8, 3});
}

TEST_CASE("dtype promotion and names", "[dtype]") {
  CHECK(promote_types(DType::bf16, DType::f32) == DType::f32);
  CHECK(promote_types(DType::bf16, DType::f16) == DType::f32);
  CHECK(promote_types(DType::i64, DType::bf16) == DType::bf16);
  CHECK(promote_types(DType::i8, DType::u8) == DType::i32);
  CHECK(promote_types(DType::b8, DType::i32) == DType::i32);
  CHECK(dtype_from_name("bfloat16") == DType::bf16);
  CHECK_THROWS_WITH(dtype_from_name("f12"), HasSubstr("unknown dtype 'f12'"));
}
