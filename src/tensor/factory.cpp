// Tensor factories. Values are produced on the host and copied to the target device, so every device
// sees the same values (random ones included) for the same generator state.
#include "hadatrain/tensor/factory.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "hadatrain/ops/copy.h"

namespace ht {
namespace {

// A host f64 tensor converted to opts.dtype and moved to opts.device.
Tensor finish_host(const Tensor& host, TensorOptions opts) {
  Tensor out = opts.dtype == DType::f64 ? host : to_dtype(host, opts.dtype);
  if (!opts.device.is_cpu()) out = to_device(out, opts.device);
  if (opts.requires_grad) out.set_requires_grad(true);
  return out;
}

// fn(begin, end) over [0, n) in contiguous chunks of a multiple of `align` elements, on up to 16 threads (one
// below 2^18 elements). The random factories are counter-based (element i's value depends only on the seed,
// the stream and i), so their results do not depend on the split: building a billion-parameter model's
// initial weights is a matter of seconds instead of a minute.
template <class F>
void for_chunks(int64_t n, int64_t align, F fn) {
  const int64_t cores = std::min<int64_t>(16, std::max(1u, std::thread::hardware_concurrency()));
  const int64_t threads = std::clamp<int64_t>(n >> 18, 1, cores);
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t per = ((n + threads - 1) / threads + align - 1) / align * align;
  std::vector<std::thread> pool;
  for (int64_t b = 0; b < n; b += per) pool.emplace_back(fn, b, std::min(n, b + per));
  for (std::thread& t : pool) t.join();
}

// Builds a host tensor from doubles (converted to opts.dtype) and moves it to opts.device.
Tensor from_doubles(const std::vector<double>& v, const Shape& shape, TensorOptions opts) {
  HT_CHECK(static_cast<int64_t>(v.size()) == numel_of(shape), "from_vector: {} values for shape {} ({} elements)",
           v.size(), to_string(shape), numel_of(shape));
  Tensor host = empty(shape, {DType::f64, Device::cpu()});
  std::copy(v.begin(), v.end(), host.data<double>());
  return finish_host(host, opts);
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
  const uint64_t stream = gen.next_stream(), seed = gen.seed();
  Tensor host = empty(shape, {DType::f64, Device::cpu()});
  double* v = host.data<double>();
  for_chunks(host.numel(), 1, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      v[i] = low + (high - low) * static_cast<double>(uniform_from_word(philox_word(seed, stream, static_cast<uint64_t>(i))));
  });
  return finish_host(host, opts);
}

Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts) { return uniform(shape, 0.0, 1.0, gen, opts); }

// Box-Muller on pairs: element 2j and 2j+1 use words 2j (u1) and 2j+1 (u2) of the stream.
Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts) {
  const uint64_t stream = gen.next_stream(), seed = gen.seed();
  Tensor host = empty(shape, {DType::f64, Device::cpu()});
  double* v = host.data<double>();
  const int64_t n = host.numel();
  for_chunks(n, 2, [=](int64_t begin, int64_t end) {  // chunks start at even elements: pairs stay whole
    for (int64_t j = begin; j < end; j += 2) {
      const uint64_t i = static_cast<uint64_t>(j);
      const double u1 = (static_cast<double>(philox_word(seed, stream, i) >> 8) + 0.5) / 16777216.0;
      const double u2 = static_cast<double>(uniform_from_word(philox_word(seed, stream, i + 1)));
      const double r = std::sqrt(-2.0 * std::log(u1));
      v[j] = r * std::cos(2.0 * M_PI * u2);
      if (j + 1 < n) v[j + 1] = r * std::sin(2.0 * M_PI * u2);
    }
  });
  return finish_host(host, opts);
}

}  // namespace ht
