// Helpers shared by the GPU tests (see gpu_testing.h).
#include "gpu_testing.h"

#include <cmath>
#include <cstring>

#include "testing.h"

namespace ht::test {

Tolerance tolerance(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-12, 1e-12};
    case DType::f32: return {2e-6, 1e-6};
    case DType::bf16: return {8e-3, 1e-3};     // 2^-7: one bf16 ulp
    case DType::f16: return {1e-3, 1e-4};      // 2^-10: one f16 ulp
    case DType::f8e4m3: return {0.125, 2e-3};  // one e4m3 ulp (3 mantissa bits)
    case DType::f8e5m2: return {0.25, 2e-5};   // one e5m2 ulp (2 mantissa bits)
    default: return {0, 0};                    // integers and bool: exact
  }
}

std::vector<DType> all_dtypes() {
  return {DType::f32, DType::f64, DType::bf16, DType::f16, DType::f8e4m3, DType::f8e5m2,
          DType::i8,  DType::u8,  DType::i32,  DType::i64, DType::b8};
}

Tensor random_input(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  if (is_floating(dtype)) return random_tensor(shape, seed, DType::f64, lo, hi).to(dtype);
  if (dtype == DType::b8) return gt(random_tensor(shape, seed, DType::f64, -1.0, 1.0), 0.0);
  double ilo = std::ceil(lo), ihi = std::floor(hi);
  if (dtype == DType::u8) ilo = std::max(ilo, 0.0);
  // floor of uniform [ilo, ihi + 1) gives integers in [ilo, ihi]
  std::vector<double> v = random_tensor(shape, seed, DType::f64, ilo, ihi + 1.0).to_vector<double>();
  for (double& x : v) x = std::min(std::floor(x), ihi);
  return from_vector(v, shape, {dtype});
}

std::vector<uint8_t> raw_bytes(const Tensor& t) {
  Tensor host = empty(t.shape(), {t.dtype(), Device::cpu()});
  copy_(host, t);
  std::vector<uint8_t> bytes(host.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.data_ptr(), bytes.size());
  return bytes;
}

namespace {
std::string header_mismatch(const Tensor& actual, const Tensor& expected) {
  if (!actual.is_cuda() || !expected.is_cpu())
    return fmt::format("expected a CUDA result and a CPU reference, got {} and {}", actual.describe(),
                       expected.describe());
  if (actual.dtype() != expected.dtype() || !(actual.shape() == expected.shape()))
    return fmt::format("CUDA result {} does not match the CPU reference {}", actual.describe(), expected.describe());
  return {};
}
}  // namespace

std::string compare_bits(const Tensor& actual, const Tensor& expected) {
  if (auto h = header_mismatch(actual, expected); !h.empty()) return h;
  const auto a = raw_bytes(actual), e = raw_bytes(expected);
  const std::size_t item = itemsize(actual.dtype());
  std::string msg;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); i += item) {
    if (std::memcmp(&a[i], &e[i], item) == 0) continue;
    if (bad++ < 5) {
      uint64_t x = 0, y = 0;
      std::memcpy(&x, &a[i], item);
      std::memcpy(&y, &e[i], item);
      msg += fmt::format("  [{}] cuda bits 0x{:x}, cpu bits 0x{:x}\n", i / item, x, y);
    }
  }
  if (bad == 0) return {};
  return fmt::format("{} of {} elements differ in their bits ({}):\n{}", bad, a.size() / item, actual.describe(), msg);
}

std::string compare_to_cpu(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  if (auto h = header_mismatch(actual, expected); !h.empty()) return h;
  if (!is_floating(actual.dtype()) && tol.rtol == 0 && tol.atol == 0) return compare_bits(actual, expected);
  return compare(actual, expected, tol.rtol, tol.atol);
}

Tensor leaf(const Tensor& x, Device dev) {
  Tensor t = x.to(dev).detach();
  t.set_requires_grad(true);
  return t;
}

}  // namespace ht::test
