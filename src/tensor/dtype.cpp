// DType names, sizes and promotion.
#include "hadatrain/tensor/dtype.h"

#include <array>

namespace ht {
namespace {
struct DTypeInfo {
  DType dt;
  std::string_view name;
  std::size_t size;
  bool floating;
  bool integral;
  int rank;  // promotion rank within its category
};
constexpr std::array<DTypeInfo, kNumDTypes> kInfo{{
    {DType::f32, "f32", 4, true, false, 4},
    {DType::f64, "f64", 8, true, false, 5},
    {DType::bf16, "bf16", 2, true, false, 2},
    {DType::f16, "f16", 2, true, false, 2},
    {DType::f8e4m3, "f8e4m3", 1, true, false, 1},
    {DType::f8e5m2, "f8e5m2", 1, true, false, 1},
    {DType::i8, "i8", 1, false, true, 1},
    {DType::u8, "u8", 1, false, true, 1},
    {DType::i32, "i32", 4, false, true, 3},
    {DType::i64, "i64", 8, false, true, 4},
    {DType::b8, "bool", 1, false, false, 0},
    {DType::i4x2, "i4x2", 1, false, false, 0},
}};
const DTypeInfo& info(DType dt) { return kInfo[static_cast<std::size_t>(dt)]; }
}  // namespace

std::string_view dtype_name(DType dt) { return info(dt).name; }

DType dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.dt;
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "float64" || name == "double") return DType::f64;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16" || name == "half") return DType::f16;
  if (name == "b8") return DType::b8;
  HT_FAIL("unknown dtype '{}': expected one of f32, f64, bf16, f16, f8e4m3, f8e5m2, i8, u8, i32, i64, bool, i4x2",
          name);
}

std::size_t itemsize(DType dt) { return info(dt).size; }

std::size_t storage_bytes(DType dt, int64_t numel) {
  if (dt == DType::i4x2) return static_cast<std::size_t>((numel + 1) / 2);
  return static_cast<std::size_t>(numel) * itemsize(dt);
}

bool is_floating(DType dt) { return info(dt).floating; }
bool is_integral(DType dt) { return info(dt).integral; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  HT_CHECK(a != DType::i4x2 && b != DType::i4x2, "packed int4 (i4x2) takes part in no arithmetic; unpack it first");
  const auto &ia = info(a), &ib = info(b);
  if (ia.floating != ib.floating) return ia.floating ? a : b;
  if (ia.floating) {
    if (ia.rank != ib.rank) return ia.rank > ib.rank ? a : b;
    return ia.rank == 1 ? DType::f16 : DType::f32;  // e4m3+e5m2 -> f16; bf16+f16 -> f32
  }
  if (a == DType::b8) return b;
  if (b == DType::b8) return a;
  if ((a == DType::i8 && b == DType::u8) || (a == DType::u8 && b == DType::i8)) return DType::i32;
  return ia.rank >= ib.rank ? a : b;
}

}  // namespace ht
