// Tensor factories. Values are produced on the host and copied to the target device, so every device
// sees the same values (random ones included) for the same generator state.
#include "hadatrain/tensor/factory.h"

#include <cmath>

#include "hadatrain/ops/copy.h"

namespace ht {
namespace {

// Builds a host tensor from doubles (converted to opts.dtype) and moves it to opts.device.
Tensor from_doubles(const std::vector<double>& v, const Shape& shape, TensorOptions opts) {
  HT_CHECK(static_cast<int64_t>(v.size()) == numel_of(shape), "from_vector: {} values for shape {} ({} elements)",
           v.size(), to_string(shape), numel_of(shape));
  Tensor host = empty(shape, {DType::f64, Device::cpu()});
  std::copy(v.begin(), v.end(), host.data<double>());
  Tensor out = opts.dtype == DType::f64 ? host : to_dtype(host, opts.dtype);
  if (!opts.device.is_cpu()) out = to_device(out, opts.device);
  if (opts.requires_grad) out.set_requires_grad(true);
  return out;
}

}  // namespace

// A CUDA destination is filled on the device: copy_ converts the host scalar once and launches a fill.
void fill_(const Tensor& t, double value) {
  Tensor src = empty({}, {DType::f64, Device::cpu()});
  *src.data<double>() = value;
  copy_(t, src);
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  fill_(t, value);
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {t.dtype(), t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), {t.dtype(), t.device()}); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, {t.dtype(), t.device()}); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  return from_doubles(values, shape, opts);
}
Tensor from_vector(const std::vector<float>& values, const Shape& shape, TensorOptions opts) {
  return from_doubles(std::vector<double>(values.begin(), values.end()), shape, opts);
}
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, TensorOptions opts) {
  HT_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape), "from_vector: {} values for shape {}",
           values.size(), to_string(shape));
  Tensor host = empty(shape, {DType::i64, Device::cpu()});
  std::copy(values.begin(), values.end(), host.data<int64_t>());
  Tensor out = opts.dtype == DType::i64 ? host : to_dtype(host, opts.dtype);
  if (!opts.device.is_cpu()) out = to_device(out, opts.device);
  if (opts.requires_grad) out.set_requires_grad(true);
  return out;
}

Tensor scalar_tensor(double value, TensorOptions opts) { return from_doubles({value}, {}, opts); }

Tensor arange(int64_t n, TensorOptions opts) {
  HT_CHECK(n >= 0, "arange: negative length {}", n);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>(i);
  return from_doubles(v, {n}, opts);
}

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, TensorOptions opts) {
  const uint64_t stream = gen.next_stream();
  const int64_t n = numel_of(shape);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        low + (high - low) * static_cast<double>(uniform_from_word(philox_word(gen.seed(), stream, static_cast<uint64_t>(i))));
  return from_doubles(v, shape, opts);
}

Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts) { return uniform(shape, 0.0, 1.0, gen, opts); }

// Box-Muller on pairs: element 2j and 2j+1 use words 2j (u1) and 2j+1 (u2) of the stream.
Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts) {
  const uint64_t stream = gen.next_stream();
  const int64_t n = numel_of(shape);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t j = 0; 2 * j < n; ++j) {
    const uint64_t i = static_cast<uint64_t>(2 * j);
    const double u1 = (static_cast<double>(philox_word(gen.seed(), stream, i) >> 8) + 0.5) / 16777216.0;
    const double u2 = static_cast<double>(uniform_from_word(philox_word(gen.seed(), stream, i + 1)));
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[static_cast<std::size_t>(2 * j)] = r * std::cos(2.0 * M_PI * u2);
    if (2 * j + 1 < n) v[static_cast<std::size_t>(2 * j + 1)] = r * std::sin(2.0 * M_PI * u2);
  }
  return from_doubles(v, shape, opts);
}

}  // namespace ht
