// Scalar storage types: bf16, f16, fp8 e4m3 / e5m2 and packed int4, with bit-exact conversions.
//
// Note [Narrow-float conversion]
// float -> bf16 / f16 / fp8 rounds to nearest, ties to even, including into the subnormal range.
// NaN stays NaN (a quiet NaN with the input's sign). Overflow:
//   * bf16, f16: IEEE behaviour, values beyond the largest finite number round to +-Inf; Inf stays Inf.
//   * fp8 (both formats): saturating, like CUDA's cvt.rn.satfinite: finite values beyond the largest
//     finite number AND +-Inf become +-max (448 for e4m3, 57344 for e5m2). NaN becomes the NaN code
//     0x7F (with the sign bit of the input).
// Decoding is exact. e4m3 has no Inf: codes S.1111.111 are NaN. e5m2 decodes S.11111.00 as Inf.
// The CUDA conversions must produce the same bits; tests check all 256 fp8 codes and bf16/f16 edges.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HT_HD __host__ __device__
#else
#define HT_HD
#endif

namespace ht {
namespace detail {

HT_HD inline uint32_t f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
HT_HD inline float f32_from_bits(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

HT_HD inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
HT_HD inline float bf16_bits_to_float(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

HT_HD inline uint16_t float_to_f16_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return static_cast<uint16_t>(sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (a < 0x38800000u) {                                                // below 2^-14: f16 subnormal
    const uint32_t e = a >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // below 2^-25 rounds to zero
    const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value = mant * 2^(e-150); f16 subnormal unit = 2^-24
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent from 127 to 15
  r += 0xFFFu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}
HT_HD inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return f32_from_bits(f32_bits(v) | sign);
  }
  if (e == 31) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// Generic saturating RNE encoder for fp8 with E exponent bits, M mantissa bits, bias B.
template <int E, int M, int B>
HT_HD inline uint8_t float_to_fp8_bits(float f, uint8_t max_code, float max_value) {
  const uint32_t x = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);
  const float a = f32_from_bits(x & 0x7FFFFFFFu);
  if (a >= max_value) return static_cast<uint8_t>(sign | max_code);
  const float min_normal = std::ldexp(1.0f, 1 - B);
  if (a < min_normal) {
    const float q = std::nearbyint(std::ldexp(a, B - 1 + M));  // units of the smallest subnormal
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  int ex;
  const float fr = std::frexp(a, &ex);  // a = fr * 2^ex, fr in [0.5, 1)
  int e = ex - 1;
  float q = std::nearbyint((fr * 2.0f - 1.0f) * static_cast<float>(1 << M));
  if (q >= static_cast<float>(1 << M)) {
    q = 0.0f;
    ++e;
  }
  const uint32_t code = (static_cast<uint32_t>(e + B) << M) | static_cast<uint32_t>(q);
  return static_cast<uint8_t>(sign | (code > max_code ? max_code : code));
}

template <int E, int M, int B>
HT_HD inline float fp8_bits_to_float_finite(uint8_t v) {
  const uint32_t e = (v >> M) & ((1u << E) - 1u), m = v & ((1u << M) - 1u);
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), 1 - B - M)
                           : std::ldexp(1.0f + static_cast<float>(m) / static_cast<float>(1 << M),
                                        static_cast<int>(e) - B);
  return (v & 0x80u) ? -mag : mag;
}

HT_HD inline uint8_t float_to_e4m3_bits(float f) { return float_to_fp8_bits<4, 3, 7>(f, 0x7E, 448.0f); }
HT_HD inline float e4m3_bits_to_float(uint8_t v) {
  if ((v & 0x7Fu) == 0x7Fu) return (v & 0x80u) ? -NAN : NAN;
  return fp8_bits_to_float_finite<4, 3, 7>(v);
}
HT_HD inline uint8_t float_to_e5m2_bits(float f) { return float_to_fp8_bits<5, 2, 15>(f, 0x7B, 57344.0f); }
HT_HD inline float e5m2_bits_to_float(uint8_t v) {
  if ((v & 0x7Cu) == 0x7Cu) {
    if ((v & 0x03u) == 0) return (v & 0x80u) ? -INFINITY : INFINITY;
    return (v & 0x80u) ? -NAN : NAN;
  }
  return fp8_bits_to_float_finite<5, 2, 15>(v);
}

}  // namespace detail

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  HT_HD bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}  // NOLINT: implicit by design
  HT_HD bf16(double d) : bf16(static_cast<float>(d)) {}          // NOLINT
  HT_HD operator float() const { return detail::bf16_bits_to_float(bits); }
  static bf16 from_bits(uint16_t b) { bf16 v; v.bits = b; return v; }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  HT_HD f16(float f) : bits(detail::float_to_f16_bits(f)) {}  // NOLINT
  HT_HD f16(double d) : f16(static_cast<float>(d)) {}         // NOLINT
  HT_HD operator float() const { return detail::f16_bits_to_float(bits); }
  static f16 from_bits(uint16_t b) { f16 v; v.bits = b; return v; }
};

struct f8e4m3 {
  uint8_t bits = 0;
  f8e4m3() = default;
  HT_HD f8e4m3(float f) : bits(detail::float_to_e4m3_bits(f)) {}  // NOLINT
  HT_HD f8e4m3(double d) : f8e4m3(static_cast<float>(d)) {}       // NOLINT
  HT_HD operator float() const { return detail::e4m3_bits_to_float(bits); }
  static f8e4m3 from_bits(uint8_t b) { f8e4m3 v; v.bits = b; return v; }
};

struct f8e5m2 {
  uint8_t bits = 0;
  f8e5m2() = default;
  HT_HD f8e5m2(float f) : bits(detail::float_to_e5m2_bits(f)) {}  // NOLINT
  HT_HD f8e5m2(double d) : f8e5m2(static_cast<float>(d)) {}       // NOLINT
  HT_HD operator float() const { return detail::e5m2_bits_to_float(bits); }
  static f8e5m2 from_bits(uint8_t b) { f8e5m2 v; v.bits = b; return v; }
};

// Packed int4 storage unit: two signed 4-bit values (-8..7); element 2k is the low nibble.
struct int4x2 {
  uint8_t bits = 0;
  HT_HD int lo() const { return static_cast<int>(static_cast<int8_t>(static_cast<uint8_t>(bits << 4)) >> 4); }
  HT_HD int hi() const { return static_cast<int>(static_cast<int8_t>(bits) >> 4); }
  HT_HD static int4x2 pack(int lo, int hi) {
    int4x2 v;
    v.bits = static_cast<uint8_t>((static_cast<unsigned>(lo) & 0xFu) | ((static_cast<unsigned>(hi) & 0xFu) << 4));
    return v;
  }
};

}  // namespace ht
