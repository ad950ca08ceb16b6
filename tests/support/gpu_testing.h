// Helpers shared by the GPU tests (tests/gpu): the one tolerance table by dtype, random inputs of every
// dtype (never all zeros), output poisoning, and CUDA-vs-CPU comparison that also checks device, dtype
// and shape. Every CUDA result is compared with the CPU reference computed from the same inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/ops/ops.h"

namespace ht::test {

inline const Device kCuda = Device::cuda(0);

// CUDA-vs-CPU tolerance for results of dtype dt: |cuda - cpu| <= atol + rtol * |cpu|. Narrow dtypes allow
// one unit in the last place of the result (the two sides may round a float intermediate differently
// after a transcendental function); f32 allows a few float ulps; integers and bool are exact.
struct Tolerance {
  double rtol = 0, atol = 0;
};
Tolerance tolerance(DType dt);

inline const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::bf16, DType::f16};
inline const std::vector<DType> kFp8DTypes = {DType::f8e4m3, DType::f8e5m2};
inline const std::vector<DType> kIntDTypes = {DType::i8, DType::u8, DType::i32, DType::i64};
// Every dtype with element-addressable storage (all but packed int4).
std::vector<DType> all_dtypes();

// Random values of `dtype` on the CPU: uniform in [lo, hi) for floating dtypes; integers drawn uniformly
// from [lo, hi] (clamped to the dtype's range); bool from {0, 1}. Never all zeros (for numel > 1).
Tensor random_input(const Shape& shape, uint64_t seed, DType dtype, double lo = -2.0, double hi = 2.0);

// While alive, every CUDA allocation is filled with 0xFF bytes (NaN in every floating dtype, -1 / 255 in
// integers, an invalid bool), so an output element a kernel forgot to write fails the comparison.
class PoisonGuard {
 public:
  PoisonGuard() { cuda::set_poison_byte(0xFF); }
  ~PoisonGuard() { cuda::set_poison_byte(-1); }
  PoisonGuard(const PoisonGuard&) = delete;
  PoisonGuard& operator=(const PoisonGuard&) = delete;
};

// The raw bytes of t's elements in row-major order (t copied to a dense host tensor of its dtype).
std::vector<uint8_t> raw_bytes(const Tensor& t);

// Empty when `actual` is on CUDA, `expected` on the CPU, both of one dtype and shape, and the values
// agree within `tol` (NaN must match NaN; bool and integer outputs compare their raw bytes, so a poisoned
// bool is caught). Otherwise a description of the first mismatches.
std::string compare_to_cpu(const Tensor& actual, const Tensor& expected, Tolerance tol);
inline std::string compare_to_cpu(const Tensor& actual, const Tensor& expected) {
  return compare_to_cpu(actual, expected, tolerance(expected.dtype()));
}

// Empty when the raw bytes of `actual` (CUDA) and `expected` (CPU) are identical.
std::string compare_bits(const Tensor& actual, const Tensor& expected);

// x copied to `dev` as a new autograd leaf that requires grad (one per device for a CUDA-vs-CPU gradient check).
Tensor leaf(const Tensor& x, Device dev);

}  // namespace ht::test
