// copy_, contiguous, clone, to(dtype), to(device). The CPU path converts elementwise over any strides;
// crossing devices goes through the CUDA hooks as one contiguous byte copy.
#include "hadatrain/ops/copy.h"

#include <algorithm>
#include <cstring>

#include "core/host_chunks.h"
#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/elementwise_glue.h"
#endif

namespace ht {
namespace {

void cpu_copy_int4(const Tensor& dst, const Tensor& src) {
  HT_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape(),
           "copy_: packed int4 copies need contiguous tensors of the same shape (dst {}, src {})", dst.describe(),
           src.describe());
  const int64_t n = dst.numel();
  auto get = [&](int64_t i) -> int {
    if (src.dtype() != DType::i4x2)
      return visit_dtype(src.dtype(), [&](auto tag) {
        using S = typename decltype(tag)::type;
        if constexpr (std::is_same_v<S, int4x2>) return 0;
        else {
          const double v = std::nearbyint(cpu::to_double(cpu::ptr<S>(src)[i]));
          return static_cast<int>(std::isnan(v) ? 0 : std::clamp(v, -8.0, 7.0));
        }
      });
    const int4x2 b = cpu::ptr<int4x2>(src)[i / 2];
    return (i % 2) ? b.hi() : b.lo();
  };
  if (dst.dtype() == DType::i4x2) {
    auto* out = cpu::ptr<int4x2>(dst);
    for (int64_t i = 0; i < n; i += 2) out[i / 2] = int4x2::pack(get(i), i + 1 < n ? get(i + 1) : 0);
    return;
  }
  visit_dtype(dst.dtype(), [&](auto tag) {
    using D = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<D, int4x2>) {
      D* out = cpu::ptr<D>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = cpu::convert<D>(get(i));
    }
  });
}

void cpu_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == DType::i4x2 || src.dtype() == DType::i4x2) return cpu_copy_int4(dst, src);
  const Strides ss = cpu::broadcast_strides(src, dst.shape());
  visit_dtype(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    visit_dtype(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      if constexpr (!std::is_same_v<D, int4x2> && !std::is_same_v<S, int4x2>) {
        D* out = cpu::ptr<D>(dst);
        const S* in = cpu::ptr<S>(src);
        if (dst.is_contiguous() && src.is_contiguous() && src.shape() == dst.shape()) {
          // Element i depends on i alone, so large copies (a model's weights cast or moved between dtypes) split
          // over host threads, at least 2^22 elements each: copies below 2^23 elements stay on the caller's thread.
          host::for_chunks(dst.numel(), 1, [=](int64_t begin, int64_t end) {
            if constexpr (std::is_same_v<D, S>) {
              std::memcpy(out + begin, in + begin, static_cast<std::size_t>(end - begin) * sizeof(D));
            } else {
              for (int64_t i = begin; i < end; ++i) out[i] = cpu::convert<D>(in[i]);
            }
          }, int64_t{1} << 22);
          return;
        }
        cpu::for_each_offset<2>(dst.shape(), {dst.strides(), ss},
                                [&](const std::array<int64_t, 2>& o) { out[o[0]] = cpu::convert<D>(in[o[1]]); });
      }
    });
  });
}

#ifdef HADATRAIN_CUDA
bool dense_same_layout(const Tensor& dst, const Tensor& src) {
  return dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous();
}

// A dense copy of t (same dtype) on its own device.
Tensor dense_on_device(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor d = empty(t.shape(), {t.dtype(), t.device()});
  if (t.is_cpu()) cpu_copy(d, t);
  else cuda_ops::copy(d, t);
  return d;
}

// Copies involving a CUDA tensor. Transfers move whole dense buffers in the source dtype; conversion,
// strides and broadcasting are then done by the copy kernel on the destination device (the CPU does them
// when the destination is host memory, or for packed int4, which has no CUDA kernels).
void cuda_copy(const Tensor& dst, const Tensor& src) {
  const CudaHooks& hooks = require_cuda("copy_ to/from a CUDA tensor");
  const bool int4 = dst.dtype() == DType::i4x2 || src.dtype() == DType::i4x2;
  if (dst.is_cuda() && src.is_cpu() && src.numel() == 1 && !int4) {
    // A host scalar (fill_, full, zeros of any shape, also a 0-dim f64 into a 0-dim f64): the value travels as
    // a kernel argument. A pageable one-element copy would synchronise the stream, and a recorded step graph
    // could not contain it.
    Tensor value = empty({}, {dst.dtype(), Device::cpu()});
    cpu_copy(value, make_view(src, {}, {}, src.offset()));
    return cuda_ops::fill(dst, value);
  }
  if (dense_same_layout(dst, src)) {
    // Host -> device from pinned memory (empty_pinned, pinned loader batches) is one cudaMemcpyAsync on the
    // current stream with no host synchronisation; the pinned-host cache keeps the source block from reuse
    // until the copy has run (Note [Pinned host memory] in src/cuda/runtime/pinned_host.cpp). From pageable memory the
    // copy has finished on return. A pinned host destination is made readable on return, like a pageable one.
    hooks.copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes());
    if (dst.is_cpu() && is_pinned(dst)) hooks.synchronize(src.device());
    return;
  }
  if (dst.is_cpu()) {  // device -> host: transfer, then convert on the host
    const Tensor dense = dense_on_device(src);
    Tensor staged = empty(src.shape(), {src.dtype(), Device::cpu()});
    hooks.copy_bytes(staged.data_ptr(), Device::cpu(), dense.data_ptr(), dense.device(), dense.nbytes());
    return cpu_copy(dst, staged);
  }
  if (int4) {  // convert on the host (CPU rules for packed int4), then one transfer into a dense dst
    HT_CHECK(dst.is_contiguous(), "copy_: packed int4 CUDA destinations must be contiguous, got {}", dst.describe());
    const Tensor host = src.is_cpu() ? src : to_device(src, Device::cpu());
    Tensor staged = empty(dst.shape(), {dst.dtype(), Device::cpu()});
    cpu_copy(staged, host);
    return hooks.copy_bytes(dst.data_ptr(), dst.device(), staged.data_ptr(), Device::cpu(), staged.nbytes());
  }
  Tensor on_dst = src;
  if (src.device() != dst.device()) {  // host or another GPU -> dst's device, dense in the source dtype
    const Tensor dense = dense_on_device(src);
    on_dst = empty(src.shape(), {src.dtype(), dst.device()});
    hooks.copy_bytes(on_dst.data_ptr(), dst.device(), dense.data_ptr(), dense.device(), dense.nbytes());
  }
  cuda_ops::copy(dst, on_dst);
}
#endif

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  HT_CHECK(!(grad_enabled() && dst.requires_grad()), "copy_: the destination {} requires grad; copy under NoGradGuard",
           dst.describe());
  broadcast_shapes(dst.shape(), src.shape(), "copy_");
  HT_CHECK(broadcast_shapes(dst.shape(), src.shape(), "copy_") == dst.shape(),
           "copy_: source {} cannot be broadcast to destination {}", src.describe(), dst.describe());
  if (dst.numel() == 0) return;
  mark_written(dst);
  if (dst.is_cpu() && src.is_cpu()) return cpu_copy(dst, src);
#ifdef HADATRAIN_CUDA
  cuda_copy(dst, src);
#else
  no_cuda_kernel("copy_ to/from a CUDA tensor");
#endif
}

namespace {
// Gradient of a conversion: the incoming gradient converted back to the input's dtype and device.
class ConvertBackward final : public Node {
 public:
  ConvertBackward(DType dt, Device dev) : dtype_(dt), device_(dev) {}
  std::string name() const override { return "ConvertBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Tensor g = grads[0];
    if (g.device() != device_) g = to_device(g, device_);
    if (g.dtype() != dtype_) g = to_dtype(g, dtype_);
    return {g};
  }

 private:
  DType dtype_;
  Device device_;
};

// t written into `out` (a fresh tensor of t's shape, any layout, dtype and device), recorded as a conversion.
Tensor converted_into(const Tensor& t, Tensor out) {
  {
    GradModeGuard no_grad(false);
    copy_(out, t);
  }
  if (needs_grad({&t})) {
    HT_CHECK(is_floating(out.dtype()), "cannot convert {} to {} while it requires grad", t.describe(),
             dtype_name(out.dtype()));
    connect(std::make_shared<ConvertBackward>(t.dtype(), t.device()), {&t}, {&out});
  }
  return out;
}

Tensor converted(const Tensor& t, DType dt, Device dev) { return converted_into(t, empty(t.shape(), {dt, dev})); }
}  // namespace

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : converted(t, t.dtype(), t.device()); }
Tensor clone(const Tensor& t) { return converted(t, t.dtype(), t.device()); }
Tensor to_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : converted(t, dt, t.device()); }
Tensor to_device(const Tensor& t, Device dev) { return t.device() == dev ? t : converted(t, t.dtype(), dev); }

Tensor to_dtype_in_order(const Tensor& t, DType dt, const std::vector<int64_t>& order) {
  HT_CHECK(order.size() == static_cast<std::size_t>(t.dim()), "to_dtype_in_order: order has {} dims for {}",
           order.size(), t.describe());
  std::vector<int64_t> inverse(order.size(), -1);
  Shape laid;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int64_t d = order[i];
    HT_CHECK(d >= 0 && d < t.dim() && inverse[static_cast<std::size_t>(d)] < 0,
             "to_dtype_in_order: order is not a permutation of {}'s dims", t.describe());
    inverse[static_cast<std::size_t>(d)] = static_cast<int64_t>(i);
    laid.push_back(t.size(d));
  }
  // t's shape in `order`'s memory (a view of a fresh tensor, so nothing is recorded for the permute)
  return converted_into(t, permute(empty(laid, {dt, t.device()}), Dims(inverse.begin(), inverse.end())));
}

Tensor Tensor::contiguous() const { return ht::contiguous(*this); }
Tensor Tensor::clone() const { return ht::clone(*this); }
Tensor Tensor::to(DType dt) const { return to_dtype(*this, dt); }
Tensor Tensor::to(Device dev) const { return to_device(*this, dev); }

}  // namespace ht
