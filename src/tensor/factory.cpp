// Tensor factories. Values are produced on the host and copied to the target device, so every device
// sees the same values (random ones included) for the same generator state.
#include "hadatrain/tensor/factory.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/host_chunks.h"
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

// The random factories are counter-based (element i's value depends only on the seed, the stream and i), so their
// results do not depend on how host::for_chunks splits them.
using host::for_chunks;

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
  const int64_t n = host.numel();
  for_chunks(n, 4, [=](int64_t begin, int64_t end) {  // chunks start at Philox blocks: one block per 4 elements
    uint32_t w[4];
    for (int64_t i = begin; i < end; ++i) {
      if ((i & 3) == 0) philox_block(seed, stream, static_cast<uint64_t>(i) >> 2, w);
      v[i] = low + (high - low) * static_cast<double>(uniform_from_word(w[i & 3]));
    }
  });
  return finish_host(host, opts);
}

Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts) { return uniform(shape, 0.0, 1.0, gen, opts); }

// Box-Muller on pairs: element 2j and 2j+1 use words 2j (u1) and 2j+1 (u2) of the stream, i.e. words 0, 1 or 2, 3
// of Philox block j / 2; the result is mean + std·z in f64 (rounded once to opts.dtype by finish_host).
Tensor normal(const Shape& shape, double mean, double std, Generator& gen, TensorOptions opts) {
  const uint64_t stream = gen.next_stream(), seed = gen.seed();
  Tensor host = empty(shape, {DType::f64, Device::cpu()});
  double* v = host.data<double>();
  const int64_t n = host.numel();
  const bool affine = mean != 0.0 || std != 1.0;
  for_chunks(n, 4, [=](int64_t begin, int64_t end) {  // chunks start at Philox blocks: pairs stay whole
    uint32_t w[4];
    for (int64_t j = begin; j < end; j += 2) {
      if ((j & 3) == 0) philox_block(seed, stream, static_cast<uint64_t>(j) >> 2, w);
      const uint32_t w1 = w[j & 3], w2 = w[(j & 3) + 1];
      const double u1 = (static_cast<double>(w1 >> 8) + 0.5) / 16777216.0;
      const double u2 = static_cast<double>(uniform_from_word(w2));
      const double r = std::sqrt(-2.0 * std::log(u1));
      double z0 = r * std::cos(2.0 * M_PI * u2), z1 = r * std::sin(2.0 * M_PI * u2);
      if (affine) {
        z0 = mean + std * z0;
        z1 = mean + std * z1;
      }
      v[j] = z0;
      if (j + 1 < n) v[j + 1] = z1;
    }
  });
  return finish_host(host, opts);
}

Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts) { return normal(shape, 0.0, 1.0, gen, opts); }

}  // namespace ht
