// int8_matmul_nt and fp8_matmul_nt (ops/lowp_matmul.h): low-precision "NT" products out = a · bᵀ with K
// the last dim of both operands. CPU reference: plain loops, int8 accumulating in 32-bit two's complement
// (as the GPU's int32 accumulator does), fp8 multiplying the decoded values (exact in double) and summing
// in double, scaled by scale_a · scale_b and rounded once. CUDA: cuBLASLt through cuda::gemm_lowp_nt (the
// scales stay in device memory). Not differentiable.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/loops.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/ops.h"  // mul, reshape (the outer-scale fallback)
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/scalar_types.h"
#ifdef HADATRAIN_CUDA
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/cublaslt_gemm.h"
#endif

namespace ht {
namespace {

bool is_fp8(DType dt) { return dt == DType::f8e4m3 || dt == DType::f8e5m2; }

// Sizes of an NT product: a (..., M, K), b (..., N, K) or (N, K) shared; out (..., M, N).
struct NtDims {
  Shape out;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool b_shared = false;  // b is 2-D and used for every batch of a
};

NtDims nt_dims(const char* op, const Tensor& a, const Tensor& b) {
  HT_CHECK(a.defined() && b.defined(), "{}: undefined operand", op);
  HT_CHECK(a.dim() >= 2 && b.dim() >= 2, "{}: a (..., M, K) and b (..., N, K) need at least 2 dims, got a {} and b {}",
           op, a.describe(), b.describe());
  NtDims d;
  d.m = a.shape()[a.dim() - 2];
  d.k = a.shape().back();
  d.n = b.shape()[b.dim() - 2];
  HT_CHECK(b.shape().back() == d.k, "{}: a (..., M, K) and b (..., N, K) must share K (the last dim), got a {} and b {}",
           op, a.describe(), b.describe());
  d.b_shared = b.dim() == 2;
  bool same_batch = a.dim() == b.dim();
  for (int i = 0; same_batch && i + 2 < a.dim(); ++i) same_batch = a.shape()[i] == b.shape()[i];
  HT_CHECK(d.b_shared || same_batch,
           "{}: the batch dims of a and b must be equal, or b must be 2-D (shared), got a {} and b {}", op,
           a.describe(), b.describe());
  d.out = a.shape();
  d.out[d.out.size() - 1] = d.n;
  for (int i = 0; i + 2 < a.dim(); ++i) d.batch *= a.shape()[i];
  return d;
}

// CPU: out[t, i, j] = sum_k a[t, i, k] · b[t or 0, j, k], int32 two's-complement accumulation.
void int8_cpu(const Tensor& out, const Tensor& a, const Tensor& b, const NtDims& d) {
  const int8_t* pa = static_cast<const int8_t*>(a.data_ptr());
  const int8_t* pb = static_cast<const int8_t*>(b.data_ptr());
  int32_t* po = static_cast<int32_t*>(out.data_ptr());
  for (int64_t t = 0; t < d.batch; ++t)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        const int8_t* ra = pa + (t * d.m + i) * d.k;
        const int8_t* rb = pb + ((d.b_shared ? 0 : t) * d.n + j) * d.k;
        uint32_t acc = 0;
        for (int64_t k = 0; k < d.k; ++k)
          acc += static_cast<uint32_t>(static_cast<int32_t>(ra[k]) * static_cast<int32_t>(rb[k]));
        po[(t * d.m + i) * d.n + j] = static_cast<int32_t>(acc);
      }
}

// The exact values of all 256 codes of an fp8 dtype.
std::vector<double> fp8_table(DType dt) {
  std::vector<double> v(256);
  for (int c = 0; c < 256; ++c) {
    const auto bits = static_cast<uint8_t>(c);
    v[static_cast<std::size_t>(c)] = dt == DType::f8e4m3 ? detail::e4m3_bits_to_float(bits)
                                                         : detail::e5m2_bits_to_float(bits);
  }
  return v;
}

// row / col: optional outer-vector scales (M and N f32 values; null = 1).
void fp8_cpu(const Tensor& out, const Tensor& a, const Tensor& b, double scale, const NtDims& d,
             const float* row = nullptr, const float* col = nullptr) {
  const std::vector<double> ta = fp8_table(a.dtype()), tb = fp8_table(b.dtype());
  const uint8_t* pa = static_cast<const uint8_t*>(a.data_ptr());
  const uint8_t* pb = static_cast<const uint8_t*>(b.data_ptr());
  const bool to_bf16 = out.dtype() == DType::bf16;
  for (int64_t t = 0; t < d.batch; ++t)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        const uint8_t* ra = pa + (t * d.m + i) * d.k;
        const uint8_t* rb = pb + ((d.b_shared ? 0 : t) * d.n + j) * d.k;
        double acc = 0.0;
        for (int64_t k = 0; k < d.k; ++k) acc += ta[ra[k]] * tb[rb[k]];
        double sc = scale;
        if (row) sc *= static_cast<double>(row[i]) * static_cast<double>(col[j]);
        const auto v = static_cast<float>(sc * acc);
        const int64_t o = (t * d.m + i) * d.n + j;
        if (to_bf16) static_cast<bf16*>(out.data_ptr())[o] = bf16(v);
        else static_cast<float*>(out.data_ptr())[o] = v;
      }
}

#ifdef HADATRAIN_CUDA
cuda::LowpPath lowp_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const float* scale_a,
                         const float* scale_b, const NtDims& d, const float* row_scale = nullptr,
                         const float* col_scale = nullptr,
                         Fp8Accumulation accumulation = Fp8Accumulation::precise) {
  cuda::DeviceGuard guard(out.device().index);
  cuda::LowpGemmArgs g;
  g.a_dtype = a.dtype();
  g.b_dtype = b.dtype();
  g.c_dtype = out.dtype();
  g.m = d.m;
  g.n = d.n;
  g.k = d.k;
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.c = out.data_ptr();
  g.lda = std::max<int64_t>(d.k, 1);
  g.ldb = std::max<int64_t>(d.k, 1);
  g.ldc = std::max<int64_t>(d.n, 1);
  g.batch = d.batch;
  g.stride_a = d.m * d.k;
  g.stride_b = d.b_shared ? 0 : d.n * d.k;
  g.stride_c = d.m * d.n;
  g.scale_a = scale_a;
  g.scale_b = scale_b;
  g.row_scale_a = row_scale;
  g.col_scale_b = col_scale;
  g.accum = accumulation == Fp8Accumulation::fast ? cuda::Fp8Accum::fast : cuda::Fp8Accum::precise;
  return cuda::gemm_lowp_nt(g);
}
#endif

void check_scale(const char* op, const char* name, const Tensor& s, Device dev) {
  HT_CHECK(s.defined() && s.dtype() == DType::f32 && s.numel() == 1,
           "{}: {} must be a one-element f32 tensor, got {}", op, name, s.defined() ? s.describe() : "undefined");
  HT_CHECK(s.device() == dev, "{}: {} must be on {} like a and b, got {}", op, name, to_string(dev), s.describe());
}

void check_vector(const char* op, const char* name, const Tensor& s, int64_t n, Device dev) {
  HT_CHECK(s.defined() && s.dtype() == DType::f32 && s.dim() == 1 && s.numel() == n,
           "{}: {} must be an f32 vector of {} values, got {}", op, name, n, s.defined() ? s.describe() : "undefined");
  HT_CHECK(s.device() == dev, "{}: {} must be on {} like a and b, got {}", op, name, to_string(dev), s.describe());
}

}  // namespace

Tensor int8_matmul_nt(const Tensor& a, const Tensor& b) {
  constexpr const char* op = "int8_matmul_nt";
  const NtDims d = nt_dims(op, a, b);
  HT_CHECK(a.dtype() == DType::i8 && b.dtype() == DType::i8, "{}: a and b must be i8, got a {} and b {}", op,
           a.describe(), b.describe());
  const Device dev = common_device(op, {&a, &b});
  const Tensor ac = a.detach().contiguous(), bc = b.detach().contiguous();
  Tensor out = empty(d.out, {DType::i32, dev});
  if (out.numel() == 0) return out;
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    lowp_cuda(out, ac, bc, nullptr, nullptr, d);
    return out;
#else
    no_cuda_kernel(op);
#endif
  }
  int8_cpu(out, ac, bc, d);
  return out;
}

Tensor fp8_matmul_nt(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b, DType out_dtype,
                     Fp8Accumulation accumulation) {
  constexpr const char* op = "fp8_matmul_nt";
  const NtDims d = nt_dims(op, a, b);
  HT_CHECK(is_fp8(a.dtype()) && is_fp8(b.dtype()), "{}: a and b must be f8e4m3 or f8e5m2, got a {} and b {}", op,
           a.describe(), b.describe());
  HT_CHECK(!(a.dtype() == DType::f8e5m2 && b.dtype() == DType::f8e5m2),
           "{}: f8e5m2 x f8e5m2 is not supported (cuBLASLt has no such kernel; make one operand f8e4m3), got a {} "
           "and b {}", op, a.describe(), b.describe());
  HT_CHECK(out_dtype == DType::f32 || out_dtype == DType::bf16, "{}: out_dtype must be f32 or bf16, got {}", op,
           dtype_name(out_dtype));
  const Device dev = common_device(op, {&a, &b});
  check_scale(op, "scale_a", scale_a, dev);
  check_scale(op, "scale_b", scale_b, dev);
  const Tensor ac = a.detach().contiguous(), bc = b.detach().contiguous();
  Tensor out = empty(d.out, {out_dtype, dev});
  if (out.numel() == 0) return out;
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    const Tensor sa = scale_a.detach().contiguous(), sb = scale_b.detach().contiguous();
    lowp_cuda(out, ac, bc, static_cast<const float*>(sa.data_ptr()), static_cast<const float*>(sb.data_ptr()), d,
              nullptr, nullptr, accumulation);
    return out;
#else
    no_cuda_kernel(op);
#endif
  }
  (void)accumulation;  // the CPU sums exactly
  const double scale = scale_a.item() * scale_b.item();
  fp8_cpu(out, ac, bc, scale, d);
  return out;
}

Tensor fp8_matmul_nt_outer(const Tensor& a, const Tensor& b, const Tensor& row_scale, const Tensor& col_scale,
                           DType out_dtype, Fp8Accumulation accumulation) {
  constexpr const char* op = "fp8_matmul_nt_outer";
  HT_CHECK(a.defined() && b.defined() && a.dim() == 2 && b.dim() == 2,
           "{}: a (M, K) and b (N, K) must be 2-D, got a {} and b {}", op, a.defined() ? a.describe() : "undefined",
           b.defined() ? b.describe() : "undefined");
  const NtDims d = nt_dims(op, a, b);
  HT_CHECK(is_fp8(a.dtype()) && is_fp8(b.dtype()) && !(a.dtype() == DType::f8e5m2 && b.dtype() == DType::f8e5m2),
           "{}: a and b must be f8e4m3 or f8e5m2, not both f8e5m2, got a {} and b {}", op, a.describe(), b.describe());
  HT_CHECK(out_dtype == DType::f32 || out_dtype == DType::bf16, "{}: out_dtype must be f32 or bf16, got {}", op,
           dtype_name(out_dtype));
  const Device dev = common_device(op, {&a, &b});
  check_vector(op, "row_scale", row_scale, d.m, dev);
  check_vector(op, "col_scale", col_scale, d.n, dev);
  const Tensor ac = a.detach().contiguous(), bc = b.detach().contiguous();
  const Tensor rs = row_scale.detach().contiguous(), cs = col_scale.detach().contiguous();
  Tensor out = empty(d.out, {out_dtype, dev});
  if (out.numel() == 0) return out;
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    if (lowp_cuda(out, ac, bc, nullptr, nullptr, d, static_cast<const float*>(rs.data_ptr()),
                  static_cast<const float*>(cs.data_ptr()), accumulation) != cuda::LowpPath::unsupported)
      return out;
    // cuBLASLt cannot take the vectors here: the unscaled f32 product, scaled by the outer product in f32
    Tensor acc = empty(d.out, {DType::f32, dev});
    lowp_cuda(acc, ac, bc, nullptr, nullptr, d, nullptr, nullptr, accumulation);
    return mul(acc, mul(reshape(rs, {d.m, 1}), reshape(cs, {1, d.n}))).to(out_dtype);
#else
    no_cuda_kernel(op);
#endif
  }
  (void)accumulation;  // the CPU sums exactly
  fp8_cpu(out, ac, bc, 1.0, d, static_cast<const float*>(rs.data_ptr()), static_cast<const float*>(cs.data_ptr()));
  return out;
}

}  // namespace ht
