// empty_pinned / is_pinned: CPU tensors in page-locked host memory through the CUDA hooks (plain CPU
// tensors when there is no CUDA backend or no visible device).
#include "hadatrain/autograd/meta.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/tensor.h"

namespace ht {
namespace {
const CudaHooks* pinning_hooks() {
  const CudaHooks* h = cuda_hooks();
  return h != nullptr && h->device_count() > 0 ? h : nullptr;
}
}  // namespace

Tensor empty_pinned(const Shape& shape, DType dtype, Device device) {
  const CudaHooks* h = pinning_hooks();
  if (h == nullptr) return empty(shape, {dtype, Device::cpu()});
  auto storage = std::make_shared<StorageImpl>();
  storage->nbytes = new_tensor_bytes(shape, dtype);
  storage->data = h->allocate_pinned(storage->nbytes, device);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = Device::cpu();
  return Tensor(std::move(impl));
}

bool is_pinned(const Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.storage()->data.get() == nullptr) return false;
  const CudaHooks* h = pinning_hooks();
  return h != nullptr && h->is_pinned(t.storage()->data.get());
}

}  // namespace ht
