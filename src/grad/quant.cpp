// Quantisation primitives of the gradient pipelines (include/hadatrain/grad/quant.h): block Hadamard
// rotation, symmetric b-bit quantisation (absmax / SAWB scale, nearest / stochastic rounding), dequantisation
// and packed int4 storage. The CPU loops here are the reference and follow Note [Bit-identical quantisation]
// step by step; the CUDA branch (cuda/glue/grad_quant_glue.cpp, cuda/kernels/grad_quant*.cu) computes the same bits.
// LUQ is in luq.cpp.
#include "hadatrain/grad/quant.h"
#include "hadatrain/grad/sr_noise.h"

#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "grad/quant_groups.h"
#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/philox.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/grad_quant_glue.h"
#endif

namespace ht::grad {

namespace detail {

void check_quant_input(const char* op, const Tensor& x) {
  HT_CHECK(x.defined(), "{}: the input is an undefined tensor", op);
  HT_CHECK(is_floating(x.dtype()), "{}: expected a floating input, got {}", op, x.describe());
  HT_CHECK(x.dim() >= 1, "{}: expected at least one dim, got {}", op, x.describe());
}

Tensor column_sums_by_op(const Tensor& x) {
  Dims dims;
  for (int d = 0; d + 1 < x.dim(); ++d) dims.push_back(d);
  return sum(x, dims);
}

void check_hadamard_block(const char* op, const Tensor& x, int64_t block) {
  HT_CHECK(is_power_of_two(block), "{}: hadamard_block must be a power of two >= 1, got {}", op, block);
  const int64_t last = x.size(x.dim() - 1);
  HT_CHECK(last % block == 0, "{}: hadamard_block {} does not divide the last dim {} of {}", op, block, last,
           x.describe());
}

}  // namespace detail

namespace {

using detail::Groups;

// Step 1: x as f32 in row-major order.
std::vector<float> f32_values(const Tensor& x) { return x.to_vector<float>(); }

// Step 2: every run of `block` consecutive values (blocks never straddle rows: block divides the last dim)
// times H_block by the butterfly, stages h = 1, 2, ..., block/2 in this order.
void rotate_blocks(std::vector<float>& v, int64_t block) {
  const int64_t n = static_cast<int64_t>(v.size());
  for (int64_t base = 0; base < n; base += block)
    for (int64_t h = 1; h < block; h *= 2)
      for (int64_t j = 0; j < block; ++j)
        if ((j / h) % 2 == 0) {
          const float a = v[base + j], b = v[base + j + h];
          v[base + j] = a + b;
          v[base + j + h] = a - b;
        }
}

// Step 3: the scale value m of one group (n values from p). NaN never wins the maximum (fmax).
float absmax_of(const float* p, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(p[i]));
  return m;
}

float group_m(const float* p, int64_t n, ScaleRule rule) {
  const float amax = absmax_of(p, n);
  if (rule == ScaleRule::absmax || n == 0) return amax;
  double s1 = 0.0, s2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = p[i];
    s1 += std::fabs(d);
    s2 += d * d;
  }
  const double dn = static_cast<double>(n);
  const double alpha = 12.1 * std::sqrt(s2 / dn) - 12.2 * (s1 / dn);
  const float m = static_cast<float>(alpha);
  return (std::isfinite(m) && m > 0.0f) ? m : amax;  // SAWB guard (hlq.md §3.5, §7 #11)
}

// Step 4 for one element (m > 0, r = qmax / m): the signed level. `h` is the element's 16 noise bits
// (Note [SR noise layout]); unused for nearest rounding.
int8_t level_of(float x, float m, float r, int qmax, Rounding rounding, uint32_t h) {
  const float v = std::fmin(std::fmax(x, -m), m) * r;
  const float a = std::fabs(v);
  float q;
  if (rounding == Rounding::nearest) {
    q = std::nearbyint(a);  // ties to even (default rounding mode)
  } else {
    const float f = std::floor(a);
    const float frac = a - f;
    q = f + (sr_uniform(h) < frac ? 1.0f : 0.0f);
  }
  q = std::fmin(q, static_cast<float>(qmax));
  if (!(q >= 0.0f)) q = 0.0f;
  const int iq = static_cast<int>(q);
  return static_cast<int8_t>(v < 0.0f ? -iq : iq);
}

// values_dtype asks for level · scale instead of the level (Note [Bit-identical quantisation] step 4).
bool is_dequantised(DType dt) { return dt == DType::bf16 || dt == DType::f16 || dt == DType::f32; }

void check_spec(const char* op, const Tensor& x, const QuantSpec& spec) {
  detail::check_quant_input(op, x);
  HT_CHECK(spec.bits >= 2 && spec.bits <= 8, "{}: bits must be in 2..8, got {} (input {})", op, spec.bits,
           x.describe());
  if (spec.known_absmax.defined()) {
    HT_CHECK(spec.granularity == Granularity::tensor && spec.scale_rule == ScaleRule::absmax,
             "{}: known_absmax needs tensor granularity and the absmax scale rule (input {})", op, x.describe());
    HT_CHECK(spec.known_absmax.numel() == 1 && spec.known_absmax.dtype() == DType::f32 &&
                 spec.known_absmax.device() == x.device(),
             "{}: known_absmax must be one f32 element on the input's device, got {} for input {}", op,
             spec.known_absmax.describe(), x.describe());
  }
  HT_CHECK(spec.layout == ValuesLayout::natural ||
               (spec.granularity == Granularity::tensor && spec.hadamard_block == 1),
           "{}: transposed values need tensor granularity and hadamard_block 1 (input {})", op, x.describe());
  const DType vdt = spec.values_dtype;
  HT_CHECK(vdt == DType::i8 || (vdt == DType::f8e4m3 && spec.bits <= 5) || is_dequantised(vdt),
           "{}: values_dtype must be i8, f8e4m3 with bits <= 5 (levels exact in e4m3), or bf16 / f16 / f32 "
           "(dequantised values), got {} with bits {} (input {})",
           op, dtype_name(vdt), spec.bits, x.describe());
  HT_CHECK(!is_dequantised(vdt) || spec.layout == ValuesLayout::natural,
           "{}: dequantised values (values_dtype {}) need the natural layout, got the transposed layout (input {}); "
           "quantise to i8 / f8e4m3 for transposed values",
           op, dtype_name(vdt), x.describe());
  detail::check_hadamard_block(op, x, spec.hadamard_block);
  HT_CHECK(spec.noise.step_word == nullptr || x.is_cuda(),
           "{}: a device step word for the noise needs a CUDA input, got {}", op, x.describe());
  HT_CHECK(!spec.report_column_sums || x.dim() >= 2,
           "{}: report_column_sums needs at least two dims (rows and the summed-over columns), got {}", op,
           x.describe());
}

}  // namespace

Tensor hadamard_blocks(const Tensor& x, int64_t block) {
  detail::check_quant_input("hadamard_blocks", x);
  detail::check_hadamard_block("hadamard_blocks", x, block);
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    Tensor out = empty(x.shape(), {DType::f32, x.device()});
    cuda_ops::grad_hadamard(out, x, block);
    return out;
#else
    no_cuda_kernel("hadamard_blocks");
#endif
  }
  std::vector<float> v = f32_values(x);
  rotate_blocks(v, block);
  return from_vector(v, x.shape(), {DType::f32, Device::cpu()});
}

Quantized quantize(const Tensor& x, const QuantSpec& spec) {
  check_spec("quantize", x, spec);
  const Groups groups = detail::groups_of(x, spec.granularity);
  // CUDA writes the requested dtype and layout directly; the CPU computes int8 levels in the input's layout
  // and converts / transposes at the end.
  const DType vdt = x.is_cuda() ? spec.values_dtype : DType::i8;
  const int64_t cols = x.size(x.dim() - 1), rows = cols == 0 ? 0 : x.numel() / cols;
  const bool transposed = spec.layout == ValuesLayout::transposed;
  const Shape vshape = x.is_cuda() && transposed ? Shape{cols, rows} : x.shape();
  Quantized q{empty(vshape, {vdt, x.device()}), empty(groups.scale_shape, {DType::f32, x.device()}), Tensor(),
              Tensor()};
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    if (spec.report_input_absmax) q.input_absmax = zeros({1}, {DType::f32, x.device()});  // atomic maxima start at 0
    cuda_ops::grad_quantize(q, x, spec);
    return q;
#else
    no_cuda_kernel("quantize");
#endif
  }
  if (spec.report_column_sums) q.column_sums = detail::column_sums_by_op(x);
  std::vector<float> v = f32_values(x);  // (numel) row-major
  if (spec.report_input_absmax)
    q.input_absmax = from_vector(std::vector<float>{absmax_of(v.data(), static_cast<int64_t>(v.size()))}, {1});
  if (spec.hadamard_block > 1) rotate_blocks(v, spec.hadamard_block);
  const int qmax = qmax_of(spec.bits);
  int8_t* values = q.values.data<int8_t>();
  float* scale = q.scale.data<float>();
  for (int64_t g = 0; g < groups.count; ++g) {
    const int64_t begin = g * groups.len;
    const float m = spec.known_absmax.defined() && groups.len > 0 ? spec.known_absmax.to_vector<float>()[0]
                                                : group_m(v.data() + begin, groups.len, spec.scale_rule);
    if (m == 0.0f) {  // all-zero (or empty) group: zeros and scale 0, no division
      scale[g] = 0.0f;
      for (int64_t i = begin; i < begin + groups.len; ++i) values[i] = 0;
      continue;
    }
    scale[g] = m / static_cast<float>(qmax);
    const float r = static_cast<float>(qmax) / m;  // the only division: once per group
    uint32_t w[4] = {0, 0, 0, 0};  // the Philox block of elements 8·(i / 8) ..., refreshed when i / 8 changes
    for (int64_t i = begin; i < begin + groups.len; ++i) {
      const bool sr = spec.rounding == Rounding::stochastic;
      if (sr && (i == begin || i % 8 == 0)) sr_block(spec.noise.seed, spec.noise.stream, static_cast<uint64_t>(i) >> 3, w);
      const uint32_t h = sr ? sr_bits(w, static_cast<int>(i & 7)) : 0u;  // = sr_noise(seed, stream, i)
      values[i] = level_of(v[static_cast<std::size_t>(i)], m, r, qmax, spec.rounding, h);
    }
  }
  if (spec.values_dtype == DType::f8e4m3) q.values = to_dtype(q.values, DType::f8e4m3);  // exact: |q| <= 15
  if (is_dequantised(spec.values_dtype)) {  // d = convert(float(level) · s): one f32 product, one rounding
    std::vector<float> d(static_cast<std::size_t>(q.values.numel()));  // (numel) row-major
    for (int64_t g = 0; g < groups.count; ++g)
      for (int64_t i = g * groups.len; i < (g + 1) * groups.len; ++i) {
        const float p = static_cast<float>(values[i]) * scale[g];  // +0 for level 0 (s > 0)
        // NaN (s NaN, or inf times level 0) as the quiet NaN 0x7FC00000, as the CUDA kernels store it.
        d[static_cast<std::size_t>(i)] = std::isnan(p) ? std::numeric_limits<float>::quiet_NaN() : p;
      }
    q.values = to_dtype(from_vector(d, x.shape(), {DType::f32, Device::cpu()}), spec.values_dtype);
  }
  if (transposed) q.values = reshape(q.values, {rows, cols}).transpose(0, 1).contiguous();  // (C, N)
  return q;
}

Tensor dequantize(const Quantized& q, Granularity granularity) {
  HT_CHECK(q.values.defined() && q.scale.defined(), "dequantize: values and scale must be defined");
  HT_CHECK(q.values.dtype() == DType::i8 || q.values.dtype() == DType::f8e4m3,
           "dequantize: values must be i8 (quantize) or f8e4m3 (luq_quantize), got {}{}", q.values.describe(),
           is_dequantised(q.values.dtype()) ? " (already dequantised by quantize: use the values as they are)" : "");
  HT_CHECK(q.values.dim() >= 1, "dequantize: values need at least one dim, got {}", q.values.describe());
  HT_CHECK(q.scale.dtype() == DType::f32, "dequantize: scale must be f32, got {}", q.scale.describe());
  const Groups groups = detail::groups_of(q.values, granularity);
  HT_CHECK(q.scale.numel() == groups.count,
           "dequantize: {} values need {} scales for this granularity, got scale {}", q.values.describe(),
           groups.count, q.scale.describe());
  common_device("dequantize", {&q.values, &q.scale});
  Shape bshape;  // the scale broadcast against the values
  const Shape& s = q.values.shape();
  for (int i = 0; i < s.size(); ++i) {
    const bool keep = (granularity == Granularity::sample && i == 0) ||
                      (granularity == Granularity::row && i + 1 < s.size());
    bshape.push_back(keep ? s[i] : 1);
  }
  return mul(to_dtype(q.values, DType::f32), q.scale.reshape(bshape));
}

Tensor pack_int4(const Tensor& values) {
  HT_CHECK(values.defined() && values.dtype() == DType::i8, "pack_int4: expected i8 values, got {}",
           values.describe());
  HT_CHECK(values.dim() >= 1 && values.size(values.dim() - 1) % 2 == 0,
           "pack_int4: the last dim must be even (two values per byte), got {}", values.describe());
  const Tensor v = values.contiguous();
  Tensor out = empty(values.shape(), {DType::i4x2, values.device()});
  if (values.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::grad_pack_int4(out, v);
    return out;
#else
    no_cuda_kernel("pack_int4");
#endif
  }
  const int64_t n = v.numel();
  const int8_t* p = v.data<int8_t>();
  for (int64_t i = 0; i < n; ++i)
    HT_CHECK(p[i] >= -8 && p[i] <= 7, "pack_int4: value {} at flat index {} of {} is outside -8..7", int{p[i]}, i,
             values.describe());
  auto* o = static_cast<int4x2*>(out.data_ptr());
  for (int64_t k = 0; k < n / 2; ++k) o[k] = int4x2::pack(p[2 * k], p[2 * k + 1]);
  return out;
}

Tensor unpack_int4(const Tensor& packed) {
  HT_CHECK(packed.defined() && packed.dtype() == DType::i4x2, "unpack_int4: expected i4x2 values, got {}",
           packed.describe());
  HT_CHECK(packed.dim() >= 1 && packed.size(packed.dim() - 1) % 2 == 0,
           "unpack_int4: the last dim must be even, got {}", packed.describe());
  HT_CHECK(packed.is_contiguous(), "unpack_int4: packed int4 tensors must be contiguous, got strides {} for {}",
           to_string(packed.strides()), packed.describe());
  Tensor out = empty(packed.shape(), {DType::i8, packed.device()});
  if (packed.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::grad_unpack_int4(out, packed);
    return out;
#else
    no_cuda_kernel("unpack_int4");
#endif
  }
  const int64_t n = packed.numel();
  const auto* p = static_cast<const int4x2*>(packed.data_ptr());
  int8_t* o = out.data<int8_t>();
  for (int64_t k = 0; k < n / 2; ++k) {
    o[2 * k] = static_cast<int8_t>(p[k].lo());
    o[2 * k + 1] = static_cast<int8_t>(p[k].hi());
  }
  return out;
}

}  // namespace ht::grad
