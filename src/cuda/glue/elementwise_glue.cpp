// Tensor-level entry points to the CUDA kernels (see elementwise_glue.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/elementwise_glue.h"

#include <array>
#include <cstring>

#include "ops/cpu/loops.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "cuda/kernels/copy.cuh"

namespace ht::cuda_ops {
namespace {

// The device of a launch made current for its duration, and that device's current stream.
struct OnDevice {
  explicit OnDevice(const Tensor& t) : guard(t.device().index), stream(cuda::current_stream(t.device().index)) {}
  cuda::DeviceGuard guard;
  cudaStream_t stream;
};

// Element strides of each tensor over `shape` (0 on broadcast dims), as a kernel layout.
template <int N>
kernels::Layout<N> layout_of(const Shape& shape, const std::array<const Tensor*, N>& ts) {
  std::array<Strides, N> st;
  const int64_t* ptrs[N];
  for (int k = 0; k < N; ++k) {
    st[static_cast<std::size_t>(k)] = cpu::broadcast_strides(*ts[static_cast<std::size_t>(k)], shape);
    ptrs[k] = st[static_cast<std::size_t>(k)].begin();
  }
  return kernels::make_layout<N>(shape.size(), shape.begin(), ptrs);
}

// The dtype a kernel computes `dt` in (Note: identical results to the CPU's acc_t computation).
DType arith_dtype(DType dt) {
  if (dt == DType::f8e4m3 || dt == DType::f8e5m2) return DType::f32;  // fp8 -> f32 is exact; rounding back once
  if (dt == DType::b8) return DType::i64;                             // the CPU computes bool in int64
  return dt;
}

// Runs `body(compute_out)` in the compute dtype of out and converts the result into out.
template <class F>
bool via_compute_dtype(const Tensor& out, DType ct, F&& body) {
  if (ct == out.dtype()) return false;
  Tensor tmp = empty(out.shape(), {ct, out.device()});
  body(tmp);
  cuda_ops::copy(out, tmp);
  return true;
}

void check_no_int4(const char* op, const Tensor& t) {
  HT_CHECK(t.dtype() != DType::i4x2, "{}: packed int4 takes part in no arithmetic ({})", op, t.describe());
}

}  // namespace

void binary(kernels::BinaryOp op, double alpha, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_no_int4("binary op", out);
  const DType ct = arith_dtype(out.dtype());
  if (via_compute_dtype(out, ct, [&](const Tensor& tmp) { binary(op, alpha, tmp, to_dtype(a, ct), to_dtype(b, ct)); }))
    return;
  if (op == kernels::BinaryOp::div && is_integral(out.dtype()))
    HT_CHECK(ht::sum(ht::eq(b, 0.0)).item() == 0, "div: integer division by zero");
  OnDevice on(out);
  kernels::launch_binary(out.dtype(), op, alpha,
                         {out.data_ptr(), a.data_ptr(), b.data_ptr(), layout_of<3>(out.shape(), {&out, &a, &b})},
                         on.stream);
}

void compare(kernels::CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  HT_CHECK(a.dtype() != DType::i4x2, "compare: packed int4 cannot be compared");
  DType ct = a.dtype();
  if (ct == DType::f8e4m3 || ct == DType::f8e5m2) ct = DType::f32;  // exact
  if (ct == DType::b8) ct = DType::u8;                               // 0/1 compare the same
  if (ct != a.dtype()) return compare(op, out, to_dtype(a, ct), to_dtype(b, ct));
  OnDevice on(out);
  kernels::launch_compare(ct, op, {out.data_ptr(), a.data_ptr(), b.data_ptr(), layout_of<3>(out.shape(), {&out, &a, &b})},
                          on.stream);
}

void unary(const UnaryCall& call, const Tensor& out, const Tensor& x) {
  check_no_int4("unary op", out);
  const DType ct = arith_dtype(out.dtype());
  if (via_compute_dtype(out, ct, [&](const Tensor& tmp) { unary(call, tmp, to_dtype(x, ct)); })) return;
  OnDevice on(out);
  kernels::UnaryArgs args{call.op, call.mode, call.s0, call.s1, out.data_ptr(), x.data_ptr(),
                          layout_of<2>(out.shape(), {&out, &x})};
  kernels::launch_unary(out.dtype(), args, on.stream);
}

void unary_backward(const UnaryCall& call, const Tensor& gx, const Tensor& g, const Tensor& x) {
  OnDevice on(gx);
  kernels::launch_unary_backward(gx.dtype(), call.op, call.s0, call.s1,
                                 {gx.data_ptr(), g.data_ptr(), x.data_ptr(), layout_of<3>(gx.shape(), {&gx, &g, &x})},
                                 on.stream);
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  HT_CHECK(out.dtype() != DType::i4x2, "where: packed int4 is not supported");
  OnDevice on(out);
  kernels::WhereArgs args{out.data_ptr(), static_cast<const bool*>(cond.data_ptr()), a.data_ptr(), b.data_ptr(),
                          layout_of<4>(out.shape(), {&out, &cond, &a, &b})};
  kernels::launch_where(itemsize(out.dtype()), args, on.stream);
}

void copy(const Tensor& dst, const Tensor& src) {
  HT_ASSERT(dst.is_cuda() && src.device() == dst.device(), "cuda_ops::copy: {} <- {}", dst.describe(),
            src.describe());
  HT_CHECK(dst.dtype() != DType::i4x2 && src.dtype() != DType::i4x2,
           "copy_: packed int4 tensors on CUDA can only be copied as whole contiguous buffers (dst {}, src {})",
           dst.describe(), src.describe());
  OnDevice on(dst);
  kernels::launch_copy({dst.dtype(), src.dtype(), dst.data_ptr(), src.data_ptr(), layout_of<2>(dst.shape(), {&dst, &src})},
                       on.stream);
}

void fill(const Tensor& dst, const Tensor& value) {
  HT_CHECK(dst.dtype() != DType::i4x2, "fill_: packed int4 CUDA tensors cannot be filled elementwise ({})",
           dst.describe());
  HT_ASSERT(value.is_cpu() && value.numel() == 1 && value.dtype() == dst.dtype(), "cuda_ops::fill: bad value {}",
            value.describe());
  uint64_t bits = 0;
  std::memcpy(&bits, value.data_ptr(), itemsize(dst.dtype()));
  OnDevice on(dst);
  kernels::launch_fill(itemsize(dst.dtype()), bits, dst.data_ptr(), layout_of<1>(dst.shape(), {&dst}), on.stream);
}

void sum(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double scale) {
  HT_CHECK(x.dtype() != DType::i4x2, "reductions do not take packed int4");
  HT_ASSERT(out.is_contiguous(), "cuda_ops::sum: output {} must be contiguous", out.describe());
  bool mask[kMaxDims] = {};
  for (int d = 0; d < x.dim(); ++d) mask[d] = reduced[static_cast<std::size_t>(d)];
  const kernels::ReduceLayout layout =
      kernels::make_reduce_layout(x.dim(), x.shape().begin(), x.strides().begin(), mask);
  const kernels::SumPlan plan = kernels::plan_sum(x.dtype(), layout);
  Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = empty({static_cast<int64_t>(plan.workspace_bytes)}, {DType::u8, x.device()});
  OnDevice on(out);
  kernels::launch_sum({x.dtype(), out.data_ptr(), x.data_ptr(), layout, scale}, plan,
                      workspace.defined() ? workspace.data_ptr() : nullptr, on.stream);
}

}  // namespace ht::cuda_ops
#endif
