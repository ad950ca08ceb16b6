// Tensor-level glue of the fused attention kernels (see flash_attention.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "flash_attention.h"

#include <cstdint>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"

namespace ht::cuda_ops {
namespace {

// A dense copy of t whose data starts on a 16-byte boundary (the kernels move 16-byte chunks).
Tensor dense16(const Tensor& t) {
  Tensor c = t.contiguous();
  if (reinterpret_cast<std::uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone().contiguous();
  HT_ASSERT(reinterpret_cast<std::uintptr_t>(c.data_ptr()) % 16 == 0,
            "flash attention: a fresh allocation is not 16-byte aligned ({})", c.describe());
  return c;
}

}  // namespace

bool flash_attention_applies(DType dt, const kernels::AttnShape& s) {
  return kernels::flash_attention_supported(dt, s);
}

std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const kernels::AttnShape& s) {
  NoGradGuard no_grad;
  const DType dt = q.dtype();
  const Device dev = q.device();
  const Tensor qc = dense16(q), kc = dense16(k), vc = dense16(v);
  Tensor out = empty({s.B, s.Hq, s.T, s.Dv}, {dt, dev});
  Tensor lse = empty({s.B, s.Hq, s.T}, {DType::f32, dev});
  cuda::DeviceGuard guard(dev.index);
  kernels::launch_flash_attention_forward(dt, out.data_ptr(), static_cast<float*>(lse.data_ptr()), qc.data_ptr(),
                                          kc.data_ptr(), vc.data_ptr(), s, cuda::current_stream(dev.index));
  return {out, lse};
}

std::array<Tensor, 3> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& lse, const Tensor& dout, const kernels::AttnShape& s) {
  NoGradGuard no_grad;
  const DType dt = q.dtype();
  const Device dev = q.device();
  const Tensor qc = dense16(q), kc = dense16(k), vc = dense16(v), oc = dense16(out);
  const Tensor doc = dense16(to_dtype(dout, dt));
  const Tensor lc = to_dtype(lse, DType::f32).contiguous();
  Tensor dq = empty(q.shape(), {dt, dev});
  Tensor dk = empty(k.shape(), {dt, dev});
  Tensor dv = empty(v.shape(), {dt, dev});
  Tensor dsum = empty({s.B, s.Hq, s.T}, {DType::f32, dev});
  Tensor dq_acc = empty({s.B, s.Hq, s.T, s.D}, {DType::f32, dev});
  cuda::DeviceGuard guard(dev.index);
  kernels::launch_flash_attention_backward(
      dt,
      {dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), static_cast<float*>(dsum.data_ptr()),
       static_cast<float*>(dq_acc.data_ptr())},
      qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), oc.data_ptr(), static_cast<const float*>(lc.data_ptr()),
      doc.data_ptr(), s, cuda::current_stream(dev.index));
  return {dq, dk, dv};
}

}  // namespace ht::cuda_ops
#endif
