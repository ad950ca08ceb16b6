// Scalar conversion between any two element types, as the CPU reference defines it:
// floating -> floating rounds to nearest even (Note [Narrow-float conversion]);
// floating -> integer truncates toward zero, saturates to the integer range, NaN -> 0;
// anything -> bool is (value != 0); integer -> floating rounds to nearest.
#pragma once
#include <cmath>
#include <limits>
#include <type_traits>

#include "hadatrain/tensor/dtype.h"

namespace ht::cpu {

template <class T>
inline constexpr bool is_narrow_float_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                                          std::is_same_v<T, f8e4m3> || std::is_same_v<T, f8e5m2>;
template <class T>
inline constexpr bool is_float_like_v = std::is_floating_point_v<T> || is_narrow_float_v<T>;

// Value of x as a double (exact for every dtype but i64 beyond 2^53).
template <class T>
inline double to_double(T x) {
  if constexpr (is_narrow_float_v<T>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}

template <class To, class From>
inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, bool>) {
    return to_double(x) != 0.0;
  } else if constexpr (is_float_like_v<To>) {
    if constexpr (std::is_same_v<From, double> || std::is_same_v<To, double>) return To(to_double(x));
    else if constexpr (std::is_integral_v<From>) return To(static_cast<float>(to_double(x)));
    else return To(static_cast<float>(x));
  } else {  // integer destination
    const double v = to_double(x);
    if (std::isnan(v)) return To(0);
    const double t = std::trunc(v);
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::lowest());
    constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
    if (t <= lo) return std::numeric_limits<To>::lowest();
    if (t >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(t);
  }
}

}  // namespace ht::cpu
