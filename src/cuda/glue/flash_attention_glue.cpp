// Tensor-level glue of the fused attention kernels (see flash_attention_glue.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/flash_attention_glue.h"

#include <cstdint>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"

namespace ht::cuda_ops {
namespace {

// A (B, H, T, D) operand the kernels read: t itself when its layout allows, else a dense, aligned copy.
kernels::FlashIn readable(const Tensor& t, Tensor& keep) {
  keep = t;
  auto st = flash_strides(t);
  if (!st) {
    keep = t.contiguous();
    if (reinterpret_cast<std::uintptr_t>(keep.data_ptr()) % 16 != 0 || keep.is_same(t)) keep = t.clone().contiguous();
    st = flash_strides(keep);
    HT_ASSERT(st.has_value(), "flash attention: a dense copy is not 16-byte aligned ({})", keep.describe());
  }
  return {keep.data_ptr(), *st};
}

kernels::FlashOut writable(const char* what, const Tensor& t, DType dt, const Shape& shape) {
  HT_ASSERT(t.dtype() == dt && t.shape() == shape, "flash attention: {} is {}, expected {} {}", what, t.describe(),
            dtype_name(dt), to_string(shape));
  const auto st = flash_strides(t);
  HT_ASSERT(st.has_value(), "flash attention: the kernels cannot write {} ({}, strides {})", what, t.describe(),
            to_string(t.strides()));
  return {t.data_ptr(), *st};
}

}  // namespace

bool flash_attention_applies(DType dt, const kernels::AttnShape& s) {
  return kernels::flash_attention_supported(dt, s);
}

std::optional<kernels::AttnStrides> flash_strides(const Tensor& t) {
  if (t.dim() != 4 || t.numel() == 0 || t.stride(3) != 1) return std::nullopt;
  auto used = [&](int d) { return t.size(d) == 1 ? int64_t{0} : t.stride(d); };  // size-1 strides are never used
  const kernels::AttnStrides st{used(0), used(1), used(2)};
  if (!kernels::flash_layout_ok(t.data_ptr(), st)) return std::nullopt;
  return st;
}

Tensor flash_attention_forward_into(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const kernels::AttnShape& s) {
  NoGradGuard no_grad;
  const DType dt = q.dtype();
  const Device dev = q.device();
  Tensor qk, kk, vk;  // keep any copies alive until the launch is queued
  kernels::FlashForwardArgs a{};
  a.q = readable(q, qk);
  a.k = readable(k, kk);
  a.v = readable(v, vk);
  a.out = writable("out", out, dt, {s.B, s.Hq, s.T, s.Dv});
  Tensor lse = empty({s.B, s.Hq, s.T}, {DType::f32, dev});
  a.lse = static_cast<float*>(lse.data_ptr());
  cuda::DeviceGuard guard(dev.index);
  kernels::launch_flash_attention_forward(dt, a, s, cuda::current_stream(dev.index));
  return lse;
}

std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const kernels::AttnShape& s) {
  Tensor out = empty({s.B, s.Hq, s.T, s.Dv}, {q.dtype(), q.device()});
  Tensor lse = flash_attention_forward_into(out, q, k, v, s);
  return {out, lse};
}

void flash_attention_backward_into(const std::array<Tensor, 3>& grads, const FlashBackwardInputs& in,
                                   const kernels::AttnShape& s) {
  NoGradGuard no_grad;
  const DType dt = in.q.dtype();
  const Device dev = in.q.device();
  Tensor keep[5];
  kernels::FlashBackwardArgs a{};
  a.q = readable(in.q, keep[0]);
  a.k = readable(in.k, keep[1]);
  a.v = readable(in.v, keep[2]);
  a.out = readable(in.out, keep[3]);
  a.dout = readable(to_dtype(in.dout, dt), keep[4]);
  a.dq = writable("dq", grads[0], dt, {s.B, s.Hq, s.T, s.D});
  a.dk = writable("dk", grads[1], dt, {s.B, s.Hkv, s.S, s.D});
  a.dv = writable("dv", grads[2], dt, {s.B, s.Hkv, s.S, s.Dv});
  const Tensor lse = to_dtype(in.lse, DType::f32).contiguous();
  a.lse = static_cast<const float*>(lse.data_ptr());
  Tensor dsum = empty({s.B, s.Hq, s.T}, {DType::f32, dev});
  Tensor dq_acc = empty({s.B, s.Hq, s.T, s.D}, {DType::f32, dev});
  HT_ASSERT(reinterpret_cast<std::uintptr_t>(dq_acc.data_ptr()) % 16 == 0,
            "flash attention: a fresh allocation is not 16-byte aligned ({})", dq_acc.describe());
  a.dsum = static_cast<float*>(dsum.data_ptr());
  a.dq_acc = static_cast<float*>(dq_acc.data_ptr());
  cuda::DeviceGuard guard(dev.index);
  kernels::launch_flash_attention_backward(dt, a, s, cuda::current_stream(dev.index));
}

std::array<Tensor, 3> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& lse, const Tensor& dout, const kernels::AttnShape& s) {
  const DType dt = q.dtype();
  const Device dev = q.device();
  std::array<Tensor, 3> g{empty({s.B, s.Hq, s.T, s.D}, {dt, dev}), empty({s.B, s.Hkv, s.S, s.D}, {dt, dev}),
                          empty({s.B, s.Hkv, s.S, s.Dv}, {dt, dev})};
  flash_attention_backward_into(g, {q, k, v, out, lse, dout}, s);
  return g;
}

}  // namespace ht::cuda_ops
#endif
