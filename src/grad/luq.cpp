// LUQ, logarithmic unbiased quantisation (include/hadatrain/grad/quant.h, hlq.md §10): per group
// α = max|x| / 2^K with K = 2^(bits−1) − 1, stochastic underflow below α and logarithmic stochastic rounding
// between powers of two above it. The scale uses the largest MAGNITUDE (the reference's signed max is bug #10
// of hlq.md §7). CPU reference; the CUDA branch (cuda/kernels/grad_quant_units.cu) computes the same codes.
#include <cmath>
#include <vector>

#include "grad/quant_groups.h"
#include "hadatrain/core/error.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/philox.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/grad_quant_glue.h"
#endif

namespace ht::grad {
namespace {

// 2^e for a small integer e >= 0, exact.
float pow2(int e) { return ht::detail::f32_from_bits(static_cast<uint32_t>(e + 127) << 23); }

// The LUQ level q (0 or 2^k, 0 <= k <= top) of a = |x| / α >= 0 with the uniform u.
float luq_level(float a, int top, float u) {
  if (a < 1.0f) return u < a ? 1.0f : 0.0f;  // stochastic underflow: E = a
  const uint32_t bits = ht::detail::f32_bits(a);
  const int e = static_cast<int>((bits >> 23) & 0xFFu) - 127;  // 2^e <= a < 2^(e+1) (frexp semantics)
  if (e >= top) return pow2(top);                              // the maximum (and Inf / NaN): 2^top
  const float p = ht::detail::f32_from_bits((bits & 0x7FFFFFu) | 0x3F800000u) - 1.0f;  // a / 2^e − 1, exact
  return u < p ? pow2(e + 1) : pow2(e);  // E = 2^e (1 + p) = a
}

}  // namespace

Quantized luq_quantize(const Tensor& x, const LuqSpec& spec) {
  detail::check_quant_input("luq_quantize", x);
  HT_CHECK(spec.bits >= 2 && spec.bits <= 4,
           "luq_quantize: bits must be in 2..4 (levels up to 2^(2^(bits-1)-1) must be exact in e4m3), got {} "
           "(input {})",
           spec.bits, x.describe());
  HT_CHECK(spec.noise.step_word == nullptr || x.is_cuda(),
           "luq_quantize: a device step word for the noise needs a CUDA input, got {}", x.describe());
  const detail::Groups groups = detail::groups_of(x, spec.granularity);
  Quantized q;
  q.values = empty(x.shape(), {DType::f8e4m3, x.device()});
  q.scale = empty(groups.scale_shape, {DType::f32, x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::grad_luq(q, x, spec);
    return q;
#else
    no_cuda_kernel("luq_quantize");
#endif
  }
  const int top = (1 << (spec.bits - 1)) - 1;  // K: levels 2^0 .. 2^K (bits 4: up to 128)
  const std::vector<float> v = x.to_vector<float>();
  auto* values = static_cast<f8e4m3*>(q.values.data_ptr());
  float* scale = q.scale.data<float>();
  for (int64_t g = 0; g < groups.count; ++g) {
    const int64_t begin = g * groups.len;
    float m = 0.0f;  // max |x|, never the signed max (hlq.md §7 #10)
    for (int64_t i = begin; i < begin + groups.len; ++i) m = std::fmax(m, std::fabs(v[static_cast<std::size_t>(i)]));
    const float alpha = m / pow2(top);
    scale[g] = alpha;
    for (int64_t i = begin; i < begin + groups.len; ++i) {
      const float xi = v[static_cast<std::size_t>(i)];
      float level = 0.0f;
      if (alpha != 0.0f) {  // m == 0 (or m / 2^K underflowing to 0) gives zeros and α = 0
        const float u = uniform_from_word(philox_word(spec.noise.seed, spec.noise.stream, static_cast<uint64_t>(i)));
        level = luq_level(std::fabs(xi) / alpha, top, u);
      }
      values[i] = f8e4m3(level == 0.0f ? 0.0f : (xi < 0.0f ? -level : level));  // +0 for zero levels
    }
  }
  return q;
}

}  // namespace ht::grad
