// Tensor-level matrix products on CUDA (see gemm_glue.h): matmul's broadcast batches become strided-batched
// cuBLASLt calls, linear's bias goes into the GEMM epilogue when cuBLASLt's fast kernels can take it.
// fp8 operands are multiplied in f32 and rounded once, as the CPU reference does. CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/gemm_glue.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/cublaslt_gemm.h"
#include "hadatrain/ops/copy.h"
#include "ops/cpu/gemm.h"

namespace ht::cuda_ops {
namespace {

bool is_fp8(DType dt) { return dt == DType::f8e4m3 || dt == DType::f8e5m2; }

cuda::Trans trans_of(cpu::Trans t) { return t == cpu::Trans::yes ? cuda::Trans::yes : cuda::Trans::no; }

const char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<const char*>(t.data_ptr()) + elem_offset * static_cast<int64_t>(itemsize(t.dtype()));
}

// Strides of t's batch dims (all but the last two) over `batch` (0 on broadcast dims).
std::vector<int64_t> batch_strides(const Tensor& t, const Shape& batch) {
  std::vector<int64_t> st(static_cast<std::size_t>(batch.size()), 0);
  const int tb = t.dim() - 2, lead = batch.size() - tb;
  for (int i = lead; i < batch.size(); ++i)
    if (t.shape()[i - lead] != 1) st[static_cast<std::size_t>(i)] = t.strides()[i - lead];
  return st;
}

// The batch dims as an outer loop (`outer`) around one strided-batched GEMM over the innermost dims that
// merge into a single stride for all three operands (`count`, `inner`). Size-1 dims are dropped first.
struct BatchPlan {
  struct Dim {
    int64_t size;
    std::array<int64_t, 3> stride;  // out, a, b
  };
  std::vector<Dim> outer;
  int64_t count = 1;
  std::array<int64_t, 3> inner{0, 0, 0};
};

BatchPlan plan_batches(const Shape& batch, const std::array<std::vector<int64_t>, 3>& st) {
  std::vector<BatchPlan::Dim> dims;
  for (int i = 0; i < batch.size(); ++i)
    if (batch[i] != 1) {
      const auto u = static_cast<std::size_t>(i);
      dims.push_back({batch[i], {st[0][u], st[1][u], st[2][u]}});
    }
  BatchPlan p;
  if (dims.empty()) return p;
  std::size_t first = dims.size() - 1;  // the inner group is dims[first..]
  auto merges = [&](const BatchPlan::Dim& hi, const BatchPlan::Dim& lo) {
    for (std::size_t k = 0; k < 3; ++k)
      if (hi.stride[k] != lo.stride[k] * lo.size) return false;
    return true;
  };
  while (first > 0 && merges(dims[first - 1], dims[first])) --first;
  for (std::size_t i = first; i < dims.size(); ++i) p.count *= dims[i].size;
  p.inner = dims.back().stride;
  p.outer.assign(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(first));
  return p;
}

// fp8 has no cuBLAS path here: f32 product (exact fp8 -> f32 inputs, fp32 accumulation), rounded once.
template <class F>
bool via_f32(const Tensor& out, F&& body) {
  if (!is_fp8(out.dtype())) return false;
  Tensor tmp = empty(out.shape(), {DType::f32, out.device()});
  body(tmp);
  copy_(out, tmp);
  return true;
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  if (via_f32(out, [&](const Tensor& tmp) { matmul(tmp, to_dtype(a, DType::f32), to_dtype(b, DType::f32)); })) return;
  cuda::DeviceGuard guard(out.device().index);
  const int nd = out.dim();
  const int64_t M = out.shape()[nd - 2], N = out.shape()[nd - 1], K = a.shape().back();
  const cpu::GemmOperand ao = cpu::gemm_operand(a), bo = cpu::gemm_operand(b);  // copies only odd layouts
  Shape batch = out.shape();
  batch.resize(nd - 2);
  const BatchPlan bp = plan_batches(batch, {batch_strides(out, batch), batch_strides(ao.t, batch),
                                            batch_strides(bo.t, batch)});
  cuda::GemmArgs g;
  g.dtype = a.dtype();  // out is of a's dtype, or f32 for bf16 / f16 operands (matmul_f32)
  g.c_dtype = out.dtype();
  g.m = M;
  g.n = N;
  g.k = K;
  g.trans_a = trans_of(ao.layout.trans);
  g.lda = ao.layout.ld;
  g.trans_b = trans_of(bo.layout.trans);
  g.ldb = bo.layout.ld;
  g.ldc = std::max<int64_t>(1, N);
  g.batch = bp.count;
  g.stride_c = bp.inner[0];
  g.stride_a = bp.inner[1];
  g.stride_b = bp.inner[2];
  // Outer batch dims (those that do not merge into one stride): an odometer over their indices.
  std::vector<int64_t> idx(bp.outer.size(), 0);
  std::array<int64_t, 3> off{0, 0, 0};  // element offsets of out, a, b
  while (true) {
    g.c = const_cast<char*>(byte_ptr(out, off[0]));
    g.a = byte_ptr(ao.t, off[1]);
    g.b = byte_ptr(bo.t, off[2]);
    cuda::gemm(g);
    int d = static_cast<int>(bp.outer.size()) - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      for (std::size_t k = 0; k < 3; ++k) off[k] += bp.outer[u].stride[k];
      if (++idx[u] < bp.outer[u].size) break;
      for (std::size_t k = 0; k < 3; ++k) off[k] -= bp.outer[u].stride[k] * bp.outer[u].size;
      idx[u] = 0;
    }
    if (d < 0) break;
  }
}

void linear(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (via_f32(y, [&](const Tensor& tmp) {
        linear(tmp, to_dtype(x, DType::f32), to_dtype(w, DType::f32),
               bias.defined() ? to_dtype(bias, DType::f32) : Tensor());
      }))
    return;
  cuda::DeviceGuard guard(y.device().index);
  const int64_t R = x.shape()[0], in = x.shape()[1], out_f = w.shape()[0];
  const cpu::GemmOperand xo = cpu::gemm_operand(x);
  const cpu::GemmOperand wt = cpu::gemm_operand(w.transpose(0, 1));  // Wᵀ (in, out): a transposed view
  cuda::GemmArgs g;
  g.dtype = g.c_dtype = y.dtype();
  g.m = R;
  g.n = out_f;
  g.k = in;
  g.trans_a = trans_of(xo.layout.trans);
  g.lda = xo.layout.ld;
  g.trans_b = trans_of(wt.layout.trans);
  g.ldb = wt.layout.ld;
  g.ldc = std::max<int64_t>(1, out_f);
  g.a = xo.t.data_ptr();
  g.b = wt.t.data_ptr();
  g.c = y.data_ptr();
  if (bias.defined() && R > 0 && out_f > 0) {
    // The epilogue adds the bias in fp32 before the one rounding, as the CPU's pre-loaded C does. It is used
    // where cuBLASLt's vectorised kernels apply (16-byte aligned pointers and rows, not f64); elsewhere the
    // bias is pre-loaded into y and accumulated with beta = 1, which rounds the same way.
    const int64_t item = static_cast<int64_t>(itemsize(y.dtype()));
    const Tensor b = bias.contiguous();
    const bool epilogue = y.dtype() != DType::f64 && in > 0 && (g.lda * item) % 16 == 0 &&
                          (g.ldb * item) % 16 == 0 && (g.ldc * item) % 16 == 0 && aligned16(xo.t) &&
                          aligned16(wt.t) && aligned16(b) && aligned16(y);
    if (epilogue) {
      g.bias = b.data_ptr();
    } else {
      copy_(y, b.expand({R, out_f}));
      g.beta = 1.0;
    }
    cuda::gemm(g);
    return;
  }
  cuda::gemm(g);
}

}  // namespace ht::cuda_ops
#endif
