// Device-side element types and conversions. Mirrors src/ops/cpu/convert.h exactly (the CPU reference),
// NaN bits included (Note [NaN through f32 <-> f64]):
// floating -> floating rounds to nearest even (Note [Narrow-float conversion], same HT_HD encoders);
// floating -> integer truncates toward zero, saturates, NaN -> 0; anything -> bool is (value != 0).
// Included by .cu files only.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hadatrain/tensor/dtype_enum.h"
#include "hadatrain/tensor/scalar_types.h"
#include "cuda/kernels/kernel_layout.h"

namespace ht::kernels {

template <class T>
inline constexpr bool is_narrow_float_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                                          std::is_same_v<T, f8e4m3> || std::is_same_v<T, f8e5m2>;
template <class T>
inline constexpr bool is_float_like_v = std::is_floating_point_v<T> || is_narrow_float_v<T>;

// The type arithmetic on T is done in: double for f64, float for other floats, int64 for integers/bool.
template <class T> struct Acc { using type = std::conditional_t<std::is_integral_v<T>, int64_t, float>; };
template <> struct Acc<double> { using type = double; };
template <class T> using acc_t = typename Acc<T>::type;

// Note [NaN through f32 <-> f64]
// The CPU reference (x86-64 SSE cvtss2sd / cvtsd2ss) keeps a NaN's sign and the top payload bits and sets
// the quiet bit; the GPU's cvt may return a canonical NaN instead. These two conversions reproduce the CPU
// so that conversions stay bit-exact for NaN inputs too (the fp8 NaN codes decode to signed NaNs).
HT_DEV double f32_to_f64(float x) {
  if (x == x) return static_cast<double>(x);
  const uint32_t b = __float_as_uint(x);
  return __longlong_as_double(static_cast<long long>((static_cast<uint64_t>(b & 0x80000000u) << 32) |
                                                     0x7FF8000000000000ull |
                                                     (static_cast<uint64_t>(b & 0x003FFFFFu) << 29)));
}
HT_DEV float f64_to_f32(double x) {
  if (x == x) return static_cast<float>(x);
  const uint64_t b = static_cast<uint64_t>(__double_as_longlong(x));
  return __uint_as_float(static_cast<uint32_t>((b >> 32) & 0x80000000u) | 0x7FC00000u |
                         static_cast<uint32_t>((b >> 29) & 0x003FFFFFu));
}

// float -> fp8 with the hardware's cvt.rn.satfinite (sm_89 and newer): round to nearest even, finite
// overflow and +-Inf saturate to +-max, exactly Note [Narrow-float conversion]; only the NaN code differs
// (the hardware gives 0x7F whatever the sign), so NaN is patched to keep the input's sign like the CPU.
// Older architectures use the CPU's software encoder.
template <class To>
HT_DEV To float_to_fp8(float f) {
  To r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short h;
  if constexpr (std::is_same_v<To, f8e4m3>) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(h) : "f"(f), "f"(0.0f));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(h) : "f"(f), "f"(0.0f));
  const uint8_t sign = static_cast<uint8_t>((__float_as_uint(f) >> 24) & 0x80u);
  r.bits = f != f ? static_cast<uint8_t>(sign | 0x7Fu) : static_cast<uint8_t>(h & 0xFFu);
#else
  r = To(f);
#endif
  return r;
}

// float -> bf16 / f16 with the hardware's cvt.rn (sm_80 and newer): round to nearest even like the
// software encoders of Note [Narrow-float conversion] (subnormals and overflow to Inf included); the NaN
// code is patched to the CPU's (a quiet NaN with the input's sign; the hardware gives a canonical NaN).
// About five instructions instead of eleven: used by the compute-heavy kernels (fixed-op unary, row
// kernels) whose outputs the tests compare within tolerance; the bit-exact paths keep the software encoder.
template <class T>
HT_DEV T narrow_from_float(float f) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "bf16 or f16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short h;
  if constexpr (std::is_same_v<T, bf16>) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  if (f != f) {
    const unsigned short sign = static_cast<unsigned short>((__float_as_uint(f) >> 16) & 0x8000u);
    h = static_cast<unsigned short>(sign | (std::is_same_v<T, bf16> ? 0x7FC0u : 0x7E00u));
  }
  T r;
  r.bits = h;
  return r;
#else
  return T(f);
#endif
}

template <class T>
HT_DEV double to_double(T x) {
  if constexpr (is_narrow_float_v<T>) return f32_to_f64(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, float>) return f32_to_f64(x);
  else return static_cast<double>(x);
}

template <class To, class From>
HT_DEV To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, int64_t> && std::is_integral_v<From>) {
    return static_cast<int64_t>(x);  // exact widening: the same value the double route gives
  } else if constexpr (std::is_same_v<To, bool>) {
    return to_double(x) != 0.0;
  } else if constexpr (is_float_like_v<To>) {
    if constexpr (std::is_same_v<To, double>) return to_double(x);
    else if constexpr (std::is_same_v<To, f8e4m3> || std::is_same_v<To, f8e5m2>) {  // fp8: rounds from float too
      if constexpr (std::is_same_v<From, double>) return float_to_fp8<To>(f64_to_f32(x));
      else if constexpr (std::is_integral_v<From>) return float_to_fp8<To>(static_cast<float>(to_double(x)));
      else return float_to_fp8<To>(static_cast<float>(x));
    }
    else if constexpr (std::is_same_v<From, double>) return To(f64_to_f32(x));  // narrow types round from float
    else if constexpr (std::is_integral_v<From>) return To(static_cast<float>(to_double(x)));
    else return To(static_cast<float>(x));
  } else {  // integer destination
    const double v = to_double(x);
    if (v != v) return To(0);
    const double t = trunc(v);
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::lowest());
    constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
    if (t <= lo) return std::numeric_limits<To>::lowest();
    if (t >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(t);
  }
}

// The store conversion of the compute-heavy kernels: hardware bf16 / f16 rounding from float, convert<T>
// otherwise.
template <class T, class A>
HT_DEV T store_cast(A v) {
  if constexpr ((std::is_same_v<T, bf16> || std::is_same_v<T, f16>) && std::is_same_v<A, float>)
    return narrow_from_float<T>(v);
  else
    return convert<T>(v);
}

// Rounds V floats to bf16 / f16 two at a time (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32: store_cast's rounding,
// without its NaN code), w[j] holding elements 2j (low half) and 2j + 1. Callers deal with NaN results. Device
// code for sm_80 and newer only (the callers' paths for older architectures do not call it).
template <class T, int V>
HT_DEV void cvt_pairs(const float (&y)[V], uint32_t (&w)[V / 2]) {
  static_assert(V % 2 == 0 && (std::is_same_v<T, bf16> || std::is_same_v<T, f16>), "pairs of bf16 / f16");
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int j = 0; j < V / 2; ++j) {
    if constexpr (std::is_same_v<T, bf16>)
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[j]) : "f"(y[2 * j + 1]), "f"(y[2 * j]));
    else
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[j]) : "f"(y[2 * j + 1]), "f"(y[2 * j]));
  }
#endif
}

// Calls f(T{}) with the C++ type of dt for the dtypes elementwise kernels compute in (floating and
// integer types without fp8, bool and packed int4; the op files convert those first). Returns false
// when dt is not one of them.
template <class F>
bool visit_compute_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return true;
    case DType::f64: f(double{}); return true;
    case DType::bf16: f(bf16{}); return true;
    case DType::f16: f(f16{}); return true;
    case DType::i8: f(int8_t{}); return true;
    case DType::u8: f(uint8_t{}); return true;
    case DType::i32: f(int32_t{}); return true;
    case DType::i64: f(int64_t{}); return true;
    default: return false;
  }
}

// Fixed-size group of elements moved with one 16-byte (or narrower) load/store.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

HT_HD inline bool aligned_to(const void* p, unsigned bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Host-side dispatch for kernels that exist for the floating storage types: calls f(T{}) with float, double,
// bf16 or f16 and returns true, or returns false for any other dtype (the caller computes it in a wider
// type or rejects it).
template <class F>
bool visit_kernel_float(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return true;
    case DType::f64: f(double{}); return true;
    case DType::bf16: f(bf16{}); return true;
    case DType::f16: f(f16{}); return true;
    default: return false;
  }
}

}  // namespace ht::kernels
