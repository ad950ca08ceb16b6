// Tensor: a shared handle to a TensorImpl (shape, strides, offset, dtype over a shared StorageImpl).
// Views share storage; copies are explicit. Autograd state lives in AutogradMeta (autograd/meta.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/tensor/allocator.h"
#include "hadatrain/tensor/dtype.h"
#include "hadatrain/tensor/shape.h"

namespace ht {

class Node;
struct AutogradMeta;
class Tensor;

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;

  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r) const { auto o = *this; o.requires_grad = r; return o; }
};

struct TensorImpl {
  std::shared_ptr<StorageImpl> storage;
  Shape shape;
  Strides strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  Device device{};
  std::unique_ptr<AutogradMeta> autograd;  // null until autograd touches the tensor
  ~TensorImpl();
};

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so the graph can be walked again
};

// A gradient hook: sees (and may replace) the gradient arriving at a leaf, once per backward call.
using GradHook = std::function<Tensor(const Tensor& grad)>;
// Runs after a leaf's .grad was updated (FSDP uses this to start reduce-scatter).
using PostAccumulateHook = std::function<void(Tensor& leaf)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int dim() const { return impl().shape.size(); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }
  bool is_cuda() const { return impl().device.is_cuda(); }
  bool is_cpu() const { return impl().device.is_cpu(); }
  int64_t numel() const { return numel_of(impl().shape); }
  std::size_t nbytes() const { return storage_bytes(dtype(), numel()); }
  bool is_contiguous() const;
  // Address of element 0 of this view.
  void* data_ptr() const;
  // Typed address of element 0; throws if T does not match the dtype.
  template <class T>
  T* data() const {
    HT_CHECK(dtype_of<T>() == dtype(), "tensor has dtype {}, accessed as {}", dtype_name(dtype()),
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<StorageImpl>& storage() const { return impl().storage; }
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  std::string describe() const;  // "f32 (2, 3) on cpu"

  // --- autograd ---
  bool requires_grad() const;
  Tensor& set_requires_grad(bool r);  // leaves only
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined Tensor when no gradient arrived yet
  void set_grad(const Tensor& g);
  void zero_grad();  // drops .grad
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  // Backpropagates from this tensor. `grad` defaults to 1 for a one-element tensor.
  void backward(const Tensor& grad = {}, BackwardOptions opts = {}) const;
  Tensor detach() const;  // shares storage, no autograd history
  void register_hook(GradHook hook);                      // leaves only
  void register_post_accumulate_hook(PostAccumulateHook hook);  // leaves only
  AutogradMeta& autograd_meta();  // creates it on first use
  AutogradMeta* autograd_meta_if_any() const { return impl_ ? impl_->autograd.get() : nullptr; }

  // --- conversions and views (defined in ops/) ---
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dt) const;
  Tensor to(Device dev) const;
  Tensor reshape(const Shape& s) const;
  Tensor view(const Shape& s) const;
  Tensor permute(const Dims& order) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& s) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // Value of a one-element tensor (any device), converted to double.
  double item() const;
  // Copies all elements (any device, any layout) to a host vector of T (converted).
  template <class T>
  std::vector<T> to_vector() const;

 private:
  TensorImpl& impl() const {
    HT_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// The bytes a new contiguous tensor of `shape` and `dtype` needs; throws ht::Error naming the shape when a size
// is negative or the element or byte count exceeds 2^63 - 1 (a shape taken from a file's header or a config).
std::size_t new_tensor_bytes(const Shape& shape, DType dtype);
// Allocates uninitialised memory for a contiguous tensor.
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor empty_like(const Tensor& t, DType dtype);
// A contiguous CPU tensor in page-locked (pinned) host memory, so that its copies to a CUDA device are
// asynchronous (Note [Pinned host memory] in src/cuda/runtime/pinned_host.cpp). `device`: the CUDA device it will be
// copied to (the allocation runs with it current; the memory is usable from every device). Without the CUDA
// backend or a visible device it is an ordinary CPU tensor (src/tensor/pinned.cpp).
Tensor empty_pinned(const Shape& shape, DType dtype, Device device = Device::cuda(0));
// True when t is a CPU tensor whose storage is page-locked host memory (always false without CUDA).
bool is_pinned(const Tensor& t);
// Note [Storage versions] (tensor/allocator.h): the version of t's storage (0 for an undefined tensor or one
// without storage), and the write that raises it.
uint64_t storage_version(const Tensor& t);
void mark_written(const Tensor& t);
// A new view over t's storage (no autograd history; view ops attach it).
Tensor make_view(const Tensor& t, const Shape& shape, const Strides& strides, int64_t offset);

}  // namespace ht
