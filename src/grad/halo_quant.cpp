// HALO's tensor-level primitives (grad/pipeline_halo.h): full-size Hadamard rotations of rows (Note [HALO
// rotations]), the per-tensor absmax 8-bit quantiser (Note [HALO quantiser]) and the scaled 8-bit product. CPU
// reference loops here; CUDA through cuda/glue/halo_glue.h (rotation and quantisation fused per row, scale on the
// device), the same codes and scales bit for bit.
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "hadatrain/core/error.h"
#include "hadatrain/grad/halo_paley.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/scalar_types.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/halo_glue.h"
#endif

namespace ht::grad {
namespace {

// A NaN as CUDA's f32 arithmetic returns it for any NaN operand: 0x7FFFFFFF (Note [HALO rotations], NaN).
float canonical_nan(float x) { return x != x ? detail::f32_from_bits(0x7FFFFFFFu) : x; }

// The rotation's stages on one row of n values in place (Note [HALO rotations]); tmp holds K floats. NaNs are
// left as x86 makes them: rotate_row canonicalises.
void rotate_stages(float* v, const HaloRotation& rot, const std::vector<uint64_t>& signs, HaloDirection dir, float* tmp) {
  const int64_t p_len = rot.n / rot.k;
  for (int64_t h = 1; h < p_len; h <<= 1)
    for (int64_t seg = 0; seg < rot.n; seg += p_len)
      for (int64_t i = 0; i < p_len; ++i)
        if ((i / h) % 2 == 0) {
          const float a = v[seg + i], b = v[seg + i + h];
          v[seg + i] = a + b;
          v[seg + i + h] = a - b;
        }
  if (rot.k == 1) return;
  if (paley::pair_form(rot.k)) {  // Note [HALO paired K×K stage] (grad/halo_paley.h)
    const int half = rot.k / 2;
    float ps[kHaloMaxK / 2], ms[kHaloMaxK / 2];
    for (int64_t p = 0; p < p_len; ++p) {
      for (int i = 0; i < half; ++i) {
        const float a = v[(2 * i) * p_len + p], b = v[(2 * i + 1) * p_len + p];
        ps[i] = a + b;
        ms[i] = a - b;
      }
      for (int c = 0; c < rot.k; ++c) {
        float acc = 0.0f;
        for (int i = 0; i < half; ++i) {
          const paley::PairTerm term = paley::pair_term(i, c, signs[static_cast<std::size_t>(2 * i)]);
          const float t = term.sum ? ps[i] : ms[i];
          if (i == 0) acc = term.minus ? -t : t;
          else acc = term.minus ? acc - t : acc + t;
        }
        tmp[c] = acc;
      }
      for (int c = 0; c < rot.k; ++c) v[c * p_len + p] = tmp[c];
    }
    return;
  }
  for (int64_t p = 0; p < p_len; ++p) {
    for (int i = 0; i < rot.k; ++i) {
      float acc = 0.0f;
      for (int k = 0; k < rot.k; ++k) {
        const bool neg = dir == HaloDirection::forward ? (signs[static_cast<std::size_t>(k)] >> i) & 1U
                                                       : (signs[static_cast<std::size_t>(i)] >> k) & 1U;
        const float u = v[k * p_len + p];
        acc = neg ? acc - u : acc + u;
      }
      tmp[i] = acc;
    }
    for (int i = 0; i < rot.k; ++i) v[i * p_len + p] = tmp[i];
  }
}

// One row of n values rotated in place (Note [HALO rotations]), NaNs canonical; tmp holds K floats.
void rotate_row(float* v, const HaloRotation& rot, const std::vector<uint64_t>& signs, HaloDirection dir, float* tmp) {
  rotate_stages(v, rot, signs, dir, tmp);
  for (int64_t i = 0; i < rot.n; ++i) v[i] = canonical_nan(v[i]);
}

// x (R, C) as contiguous f32 on the CPU.
Tensor cpu_f32(const Tensor& x) { return x.detach().to(DType::f32).contiguous(); }

void check_rows(const char* op, const Tensor& x) {
  HT_CHECK(x.defined() && x.dim() == 2 && is_floating(x.dtype()),
           "{}: x must be a 2-D (rows, columns) floating tensor, got {}", op, x.defined() ? x.describe() : "undefined");
}

}  // namespace

HaloRotation halo_rotation_size(int64_t n) {
  HT_CHECK(n >= 1, "halo: a rotation needs a dimension of at least 1, got {}", n);
  HaloRotation best{0, 1};
  for (int k : {1, 12, 20, 28, 36, 44, 60}) {
    int64_t m = k;
    while (m < n) m *= 2;
    if (best.n == 0 || m < best.n) best = {m, k};
  }
  HT_CHECK(best.n <= kHaloMaxRotation,
           "halo: a dimension of {} needs a Hadamard rotation of size {}, above the supported {}", n, best.n,
           kHaloMaxRotation);
  return best;
}

namespace {

// Row i of H_K as sign bits, checked once to be a Hadamard matrix.
template <std::size_t K>
std::vector<uint64_t> checked_rows(const std::array<uint64_t, K>& rows) {
  paley::Matrix h{};
  for (std::size_t i = 0; i < K; ++i)
    for (std::size_t j = 0; j < K; ++j) h[i][j] = (rows[i] >> j) & 1U ? -1 : 1;
  HT_ASSERT(paley::is_hadamard(h, static_cast<int>(K)), "halo: the Paley matrix of order {} is not a Hadamard matrix", K);
  if (paley::pair_form(static_cast<int>(K))) {  // Note [HALO paired K×K stage]: blocks S_ij·B off the diagonal, D on it
    for (std::size_t i = 0; i < K / 2; ++i)
      for (std::size_t j = 0; j < K / 2; ++j) {
        const int e = h[2 * i][2 * j];
        const bool ok = i == j ? h[2 * i][2 * j] == 1 && h[2 * i][2 * j + 1] == -1 && h[2 * i + 1][2 * j] == -1 &&
                                     h[2 * i + 1][2 * j + 1] == -1
                               : h[2 * i][2 * j + 1] == e && h[2 * i + 1][2 * j] == e && h[2 * i + 1][2 * j + 1] == -e &&
                                     h[2 * j][2 * i] == e;
        HT_ASSERT(ok, "halo: the Paley matrix of order {} is not in the paired block form at block ({}, {})", K, i, j);
      }
  }
  return std::vector<uint64_t>(rows.begin(), rows.end());
}

// The tables of every order in kHaloPaleyOrders, indexed by the order (empty elsewhere).
template <std::size_t... I>
std::vector<std::vector<uint64_t>> paley_tables(std::index_sequence<I...>) {
  std::vector<std::vector<uint64_t>> t(kHaloMaxK + 1);
  ((t[kHaloPaleyOrders[I]] = checked_rows(halo_paley_signs<kHaloPaleyOrders[I]>())), ...);
  return t;
}

}  // namespace

std::vector<uint64_t> halo_hadamard_signs(int k) {
  // The compile-time tables of grad/halo_paley.h (the CUDA launchers pass the same to their kernels).
  static const std::vector<std::vector<uint64_t>> tables =
      paley_tables(std::make_index_sequence<kHaloPaleyOrders.size()>());
  if (k == 1) return {0};
  HT_CHECK(k > 1 && k <= kHaloMaxK && !tables[static_cast<std::size_t>(k)].empty(),
           "halo: no Hadamard matrix of order {} (supported: 1, 12, 20, 28, 36, 44, 60)", k);
  return tables[static_cast<std::size_t>(k)];
}

Tensor halo_rotate(const Tensor& x, const HaloRotate& spec) {
  constexpr const char* op = "halo_rotate";
  check_rows(op, x);
  const HaloRotation& rot = spec.rotation;
  HT_CHECK(x.size(1) <= rot.n && spec.cols >= 0 && spec.cols <= rot.n,
           "{}: x {} has more columns than the rotation size {}, or cols {} is out of range", op, x.describe(), rot.n,
           spec.cols);
  HT_CHECK(spec.out_dtype == DType::f32 || spec.out_dtype == DType::bf16,
           "{}: out_dtype must be f32 or bf16, got {}", op, dtype_name(spec.out_dtype));
  const int64_t R = x.size(0), C = x.size(1);
  Tensor out = empty({R, spec.cols}, {spec.out_dtype, x.device()});
  if (out.numel() == 0) return out;
  if (x.device().is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::halo_rotate(out, x, spec);
    return out;
#else
    no_cuda_kernel(op);
#endif
  }
  const Tensor xf = cpu_f32(x);
  const auto signs = halo_hadamard_signs(rot.k);
  Tensor of = empty({R, spec.cols}, {DType::f32, x.device()});
  std::vector<float> row(static_cast<std::size_t>(rot.n)), tmp(static_cast<std::size_t>(rot.k));
  for (int64_t r = 0; r < R; ++r) {
    const float* src = xf.data<float>() + r * C;
    for (int64_t i = 0; i < rot.n; ++i) row[static_cast<std::size_t>(i)] = i < C ? src[i] : 0.0f;
    rotate_row(row.data(), rot, signs, spec.direction, tmp.data());
    for (int64_t i = 0; i < spec.cols; ++i)
      of.data<float>()[r * spec.cols + i] = row[static_cast<std::size_t>(i)] * spec.mult;
  }
  return spec.out_dtype == DType::f32 ? of : of.to(spec.out_dtype);  // one RNE rounding of each f32 value
}

Tensor halo_transpose(const Tensor& x) {
  HT_CHECK(x.defined() && x.dim() == 2, "halo_transpose: x must be 2-D, got {}", x.defined() ? x.describe() : "undefined");
#ifdef HADATRAIN_CUDA
  if (x.device().is_cuda() && (itemsize(x.dtype()) == 1 || itemsize(x.dtype()) == 2)) {
    const Tensor xc = x.contiguous();
    Tensor out = empty({x.size(1), x.size(0)}, {x.dtype(), x.device()});
    cuda_ops::halo_transpose(out, xc);
    return out;
  }
#endif
  return x.transpose(0, 1).contiguous();
}

namespace {

// x (R, C) -> (R, n) f32 values, rotated at rotation.n (zero-padded) or as they are (n = C): the quantiser's v,
// NaNs canonical.
std::vector<float> quantizer_values(const Tensor& x, HaloRotation rotation, int64_t n) {
  const int64_t R = x.size(0), C = x.size(1);
  const Tensor xf = cpu_f32(x);
  std::vector<float> v(static_cast<std::size_t>(R * n));
  if (rotation.n > 1) {
    const auto signs = halo_hadamard_signs(rotation.k);
    std::vector<float> tmp(static_cast<std::size_t>(rotation.k));
    for (int64_t r = 0; r < R; ++r) {
      float* row = v.data() + r * n;
      for (int64_t i = 0; i < n; ++i) row[i] = i < C ? xf.data<float>()[r * C + i] : 0.0f;
      rotate_row(row, rotation, signs, HaloDirection::forward, tmp.data());
    }
  } else {  // CUDA multiplies these by r, which makes a NaN canonical there too
    for (int64_t i = 0; i < R * n; ++i) v[static_cast<std::size_t>(i)] = canonical_nan(xf.data<float>()[i]);
  }
  return v;
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float e : v) m = std::fmax(m, std::fabs(e));
  return m;
}

// The codes and scale of values v for the absmax m (Note [HALO quantiser]).
void write_codes(const std::vector<float>& v, float m, Carrier carrier, HaloQuantized& q) {
  const float qmax = carrier == Carrier::int8 ? 127.0f : 448.0f;
  const float s = m == 0.0f ? 0.0f : m / qmax, r = m == 0.0f ? 0.0f : qmax / m;
  q.scale.data<float>()[0] = s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (m == 0.0f) {  // zeros, +0 codes
      static_cast<uint8_t*>(q.codes.data_ptr())[i] = 0;
      continue;
    }
    const float t = v[i] * r;
    if (carrier == Carrier::int8)
      q.codes.data<int8_t>()[i] = static_cast<int8_t>(std::nearbyint(std::fmin(std::fmax(t, -127.0f), 127.0f)));
    else
      static_cast<uint8_t*>(q.codes.data_ptr())[i] = detail::float_to_e4m3_bits(t);
  }
}

// The output tensors of a quantisation of x (R, C); n: the codes' columns.
HaloQuantized quantize_outputs(const char* op, const Tensor& x, Carrier carrier, HaloRotation rotation, int64_t* n) {
  check_rows(op, x);
  const int64_t C = x.size(1);
  const bool rotate = rotation.n > 1;
  HT_CHECK(!rotate || C <= rotation.n, "{}: x {} has more columns than the rotation size {}", op, x.describe(),
           rotation.n);
  *n = rotate ? rotation.n : C;
  HaloQuantized q;
  q.codes = empty({x.size(0), *n}, {carrier == Carrier::int8 ? DType::i8 : DType::f8e4m3, x.device()});
  q.scale = empty({1}, {DType::f32, x.device()});
  return q;
}

}  // namespace

HaloQuantized halo_quantize(const Tensor& x, Carrier carrier, HaloRotation rotation) {
  constexpr const char* op = "halo_quantize";
  int64_t n = 0;
  HaloQuantized q = quantize_outputs(op, x, carrier, rotation, &n);
  const bool rotate = rotation.n > 1;
  if (x.device().is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::halo_quantize(q.codes, q.scale, x, carrier, rotate ? rotation : HaloRotation{});
    return q;
#else
    no_cuda_kernel(op);
#endif
  }
  const std::vector<float> v = quantizer_values(x, rotation, n);
  write_codes(v, max_abs(v), carrier, q);
  return q;
}

std::pair<HaloQuantized, HaloQuantized> halo_quantize_pair(const Tensor& x, Carrier carrier, HaloRotation rotation) {
  constexpr const char* op = "halo_quantize_pair";
  if (!x.device().is_cuda() || rotation.n <= 1) return {halo_quantize(x, carrier, rotation), halo_quantize(x, carrier)};
  int64_t n = 0, c = 0;
  HaloQuantized rotated = quantize_outputs(op, x, carrier, rotation, &n);
  HaloQuantized plain = quantize_outputs(op, x, carrier, {}, &c);
#ifdef HADATRAIN_CUDA
  cuda_ops::halo_quantize_pair(rotated.codes, rotated.scale, plain.codes, plain.scale, x, rotation);
  return {rotated, plain};
#else
  no_cuda_kernel(op);
#endif
}

std::pair<HaloQuantized, Tensor> halo_quantize_transposed(const Tensor& x, Carrier carrier) {
  constexpr const char* op = "halo_quantize_transposed";
  if (!x.device().is_cuda()) {
    HaloQuantized q = halo_quantize(x, carrier);
    Tensor t = halo_transpose(q.codes);
    return {q, t};
  }
  int64_t n = 0;
  HaloQuantized q = quantize_outputs(op, x, carrier, {}, &n);
  Tensor t = empty({x.size(1), x.size(0)}, {q.codes.dtype(), x.device()});
#ifdef HADATRAIN_CUDA
  cuda_ops::halo_quantize_transposed(q.codes, t, q.scale, x);
  return {q, t};
#else
  no_cuda_kernel(op);
#endif
}

Tensor halo_absmax(const Tensor& x, HaloRotation rotation) {
  constexpr const char* op = "halo_absmax";
  check_rows(op, x);
  HT_CHECK(rotation.n <= 1 || x.size(1) <= rotation.n, "{}: x {} has more columns than the rotation size {}", op,
           x.describe(), rotation.n);
  Tensor m = empty({1}, {DType::f32, x.device()});
  if (x.device().is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::halo_absmax(m, x, rotation.n > 1 ? rotation : HaloRotation{});
    return m;
#else
    no_cuda_kernel(op);
#endif
  }
  m.data<float>()[0] = max_abs(quantizer_values(x, rotation, rotation.n > 1 ? rotation.n : x.size(1)));
  return m;
}

HaloQuantized halo_quantize_with_absmax(const Tensor& x, Carrier carrier, HaloRotation rotation, const Tensor& absmax) {
  constexpr const char* op = "halo_quantize_with_absmax";
  HT_CHECK(absmax.defined() && absmax.numel() == 1 && absmax.dtype() == DType::f32 && absmax.device() == x.device(),
           "{}: absmax must be one f32 on x's device ({}), got {}", op, to_string(x.device()),
           absmax.defined() ? absmax.describe() : "undefined");
  int64_t n = 0;
  HaloQuantized q = quantize_outputs(op, x, carrier, rotation, &n);
  if (x.device().is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::halo_quantize_given(q.codes, q.scale, x, rotation.n > 1 ? rotation : HaloRotation{}, absmax);
    return q;
#else
    no_cuda_kernel(op);
#endif
  }
  write_codes(quantizer_values(x, rotation, n), static_cast<float>(absmax.item()), carrier, q);
  return q;
}

Tensor halo_dequantize(const HaloQuantized& q) {
  return mul(q.codes.to(DType::f32), q.scale);
}

Tensor halo_product(const Tensor& a, const Tensor& b, const Tensor& s_a, const Tensor& s_b, const HaloProduct& p) {
  constexpr const char* op = "halo_product";
  HT_CHECK(a.defined() && b.defined() && a.dtype() == b.dtype() && (a.dtype() == DType::i8 || a.dtype() == DType::f8e4m3),
           "{}: a and b must be codes of one dtype, i8 or f8e4m3, got {} and {}", op,
           a.defined() ? a.describe() : "undefined", b.defined() ? b.describe() : "undefined");
  HT_CHECK(p.out_dtype == DType::f32 || p.out_dtype == DType::bf16, "{}: out_dtype must be f32 or bf16, got {}", op,
           dtype_name(p.out_dtype));
  if (a.dtype() == DType::f8e4m3) {
    // scale_a·scale_b of fp8_matmul_nt with the mult folded into b's scale (one f32 multiply on the device)
    return fp8_matmul_nt(a, b, s_a, mul(s_b, static_cast<double>(p.mult)), p.out_dtype, p.accumulation);
  }
  const Tensor acc = int8_matmul_nt(a, b);  // (M, N) i32, exact
  halo_phase("int8 epilogue (i32 -> scaled output)");
  Tensor out = empty(acc.shape(), {p.out_dtype, acc.device()});
  if (out.numel() == 0) return out;
  if (acc.device().is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::halo_scale_i32(out, acc, s_a, s_b, p.mult);
    return out;
#else
    no_cuda_kernel(op);
#endif
  }
  const float alpha = (static_cast<float>(s_a.item()) * static_cast<float>(s_b.item())) * p.mult;
  const int32_t* pa = acc.data<int32_t>();
  for (int64_t i = 0; i < acc.numel(); ++i) {
    const float v = static_cast<float>(pa[i]) * alpha;
    if (p.out_dtype == DType::bf16) static_cast<bf16*>(out.data_ptr())[i] = bf16(v);
    else out.data<float>()[i] = v;
  }
  return out;
}

}  // namespace ht::grad
