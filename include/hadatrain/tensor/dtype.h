// DType: the runtime element type of a tensor, and the small scalar types (bf16, f16, fp8) with their
// round-to-nearest-even conversions. See Note [Narrow-float conversion] for saturation and NaN rules.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/dtype_enum.h"
#include "hadatrain/tensor/scalar_types.h"

namespace ht {

// enum class DType and kNumDTypes live in dtype_enum.h (light enough for .cu files).

std::string_view dtype_name(DType dt);
// Parses a name as printed by dtype_name ("f32", "bf16", ...); also accepts "float32", "bfloat16",
// "float16", "float64", "bool". Throws ht::Error naming the accepted spellings.
DType dtype_from_name(std::string_view name);

// Bytes per element; packed int4 reports 1 (use storage_bytes for byte counts).
std::size_t itemsize(DType dt);
// Bytes needed to store `numel` elements of `dt` (packed int4 rounds up to whole bytes).
std::size_t storage_bytes(DType dt, int64_t numel);

bool is_floating(DType dt);  // f32 f64 bf16 f16 f8e4m3 f8e5m2
bool is_integral(DType dt);  // i8 u8 i32 i64 (not bool, not packed int4)

// The C++ type of each dtype, for templated kernels and visit_dtype.
template <DType D> struct CppType;
template <> struct CppType<DType::f32> { using type = float; };
template <> struct CppType<DType::f64> { using type = double; };
template <> struct CppType<DType::bf16> { using type = bf16; };
template <> struct CppType<DType::f16> { using type = f16; };
template <> struct CppType<DType::f8e4m3> { using type = f8e4m3; };
template <> struct CppType<DType::f8e5m2> { using type = f8e5m2; };
template <> struct CppType<DType::i8> { using type = int8_t; };
template <> struct CppType<DType::u8> { using type = uint8_t; };
template <> struct CppType<DType::i32> { using type = int32_t; };
template <> struct CppType<DType::i64> { using type = int64_t; };
template <> struct CppType<DType::b8> { using type = bool; };
template <> struct CppType<DType::i4x2> { using type = int4x2; };

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<f8e4m3>() { return DType::f8e4m3; }
template <> constexpr DType dtype_of<f8e5m2>() { return DType::f8e5m2; }
template <> constexpr DType dtype_of<int8_t>() { return DType::i8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<bool>() { return DType::b8; }
template <> constexpr DType dtype_of<int4x2>() { return DType::i4x2; }

// Arithmetic type used to compute on T in CPU reference loops: double for f64, float for the other
// floating types, int64 for integers and bool.
template <class T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <> struct AccType<int8_t> { using type = int64_t; };
template <> struct AccType<uint8_t> { using type = int64_t; };
template <> struct AccType<int32_t> { using type = int64_t; };
template <> struct AccType<int64_t> { using type = int64_t; };
template <> struct AccType<bool> { using type = int64_t; };
template <class T> using acc_t = typename AccType<T>::type;

template <class T> struct TypeTag { using type = T; };

// Calls f(TypeTag<T>{}) with the C++ type of dt. The one place that switches over every dtype.
template <class F>
decltype(auto) visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f(TypeTag<float>{});
    case DType::f64: return f(TypeTag<double>{});
    case DType::bf16: return f(TypeTag<bf16>{});
    case DType::f16: return f(TypeTag<f16>{});
    case DType::f8e4m3: return f(TypeTag<f8e4m3>{});
    case DType::f8e5m2: return f(TypeTag<f8e5m2>{});
    case DType::i8: return f(TypeTag<int8_t>{});
    case DType::u8: return f(TypeTag<uint8_t>{});
    case DType::i32: return f(TypeTag<int32_t>{});
    case DType::i64: return f(TypeTag<int64_t>{});
    case DType::b8: return f(TypeTag<bool>{});
    case DType::i4x2: return f(TypeTag<int4x2>{});
  }
  HT_ASSERT(false, "unknown dtype code {}", static_cast<int>(dt));
}

// Like visit_dtype but only for the floating dtypes; other dtypes throw an error naming `what`.
template <class F>
decltype(auto) visit_floating(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::f32: return f(TypeTag<float>{});
    case DType::f64: return f(TypeTag<double>{});
    case DType::bf16: return f(TypeTag<bf16>{});
    case DType::f16: return f(TypeTag<f16>{});
    case DType::f8e4m3: return f(TypeTag<f8e4m3>{});
    case DType::f8e5m2: return f(TypeTag<f8e5m2>{});
    default: break;
  }
  HT_FAIL("{}: expected a floating dtype (f32, f64, bf16, f16, f8e4m3, f8e5m2), got {}", what, dtype_name(dt));
}

// The dtype two operands are promoted to (PyTorch-like: floating beats integral; wider wins;
// bf16 with f16 gives f32; fp8 with anything wider floating gives the wider one).
DType promote_types(DType a, DType b);

}  // namespace ht
