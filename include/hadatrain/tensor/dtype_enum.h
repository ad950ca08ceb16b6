// The DType enumeration alone, with no dependencies, so that CUDA kernels (compiled by nvcc, which
// cannot compile fmt) can name dtypes. Everything else about dtypes is in dtype.h.
#pragma once
#include <cstdint>

namespace ht {

enum class DType : uint8_t {
  f32,
  f64,
  bf16,
  f16,
  f8e4m3,  // OCP FP8 E4M3 ("fn": no infinities, max 448)
  f8e5m2,  // OCP FP8 E5M2 (IEEE-like, max 57344)
  i8,
  u8,
  i32,
  i64,
  b8,    // bool, one byte holding 0 or 1
  i4x2,  // packed int4 storage: two signed 4-bit values per byte, element 2k in the low nibble
};

inline constexpr int kNumDTypes = 12;

}  // namespace ht
