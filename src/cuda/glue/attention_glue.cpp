// Tensor-level glue of the attention kernels (see attention_glue.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/attention_glue.h"

#include <limits>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"

namespace ht::cuda_ops {
namespace {

// The dtype the kernels compute `dt` in: its own, or f32 for fp8.
DType kernel_dtype(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16 ? dt : DType::f32;
}

void check_sizes(const kernels::AttnShape& s) {
  const int64_t rows = s.B * s.Hq * s.T;
  HT_CHECK(rows <= std::numeric_limits<int32_t>::max(),
           "scaled_dot_product_attention: {} query rows exceed the CUDA kernel's grid", rows);
  // Shared memory of the backward kernel: (2 D + Dv + 256) accumulators of at most 8 bytes, plus 32 for
  // the block reduction, within the 48 KiB a launch gets without opting in.
  HT_CHECK(2 * s.D + s.Dv <= 5800,
           "scaled_dot_product_attention: head dims D = {}, Dv = {} are too large for the CUDA kernel "
           "(needs 2 D + Dv <= 5800)",
           s.D, s.Dv);
}

}  // namespace

std::pair<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const kernels::AttnShape& s) {
  NoGradGuard no_grad;
  check_sizes(s);
  const DType dt = q.dtype(), kt = kernel_dtype(dt);
  const Device dev = q.device();
  const Tensor qc = to_dtype(q, kt).contiguous(), kc = to_dtype(k, kt).contiguous(), vc = to_dtype(v, kt).contiguous();
  Tensor out = empty({s.B, s.Hq, s.T, s.Dv}, {kt, dev});
  Tensor lse = empty({s.B, s.Hq, s.T}, {kt == DType::f64 ? DType::f64 : DType::f32, dev});
  cuda::DeviceGuard guard(dev.index);
  kernels::launch_attention_forward(kt, out.data_ptr(), lse.data_ptr(), qc.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                                    s, cuda::current_stream(dev.index));
  return {kt == dt ? out : to_dtype(out, dt), lse};
}

std::array<Tensor, 3> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                                         const Tensor& dout, const kernels::AttnShape& s) {
  NoGradGuard no_grad;
  check_sizes(s);
  const DType kt = kernel_dtype(q.dtype());
  const Device dev = q.device();
  const Tensor qc = to_dtype(q, kt).contiguous(), kc = to_dtype(k, kt).contiguous(), vc = to_dtype(v, kt).contiguous();
  const Tensor doc = to_dtype(dout, kt).contiguous();
  const Tensor lc = to_dtype(lse, kt == DType::f64 ? DType::f64 : DType::f32).contiguous();
  const DType acc = kernels::attention_acc_dtype(kt);
  Tensor dq = empty(q.shape(), {kt, dev});
  Tensor dk = zeros(k.shape(), {acc, dev});
  Tensor dv = zeros(v.shape(), {acc, dev});
  cuda::DeviceGuard guard(dev.index);
  kernels::launch_attention_backward(kt, {dq.data_ptr(), dk.data_ptr(), dv.data_ptr()}, qc.data_ptr(), kc.data_ptr(),
                                     vc.data_ptr(), lc.data_ptr(), doc.data_ptr(), s, cuda::current_stream(dev.index));
  return {to_dtype(dq, q.dtype()), to_dtype(dk, k.dtype()), to_dtype(dv, v.dtype())};
}

}  // namespace ht::cuda_ops
#endif
