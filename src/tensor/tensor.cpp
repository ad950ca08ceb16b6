// Tensor basics: metadata queries, allocation of new tensors, views over existing storage, host reads.
#include "hadatrain/tensor/tensor.h"

#include <cstring>
#include <limits>

#include "hadatrain/autograd/meta.h"
#include "hadatrain/ops/copy.h"

namespace ht {

TensorImpl::~TensorImpl() = default;

int64_t Tensor::size(int64_t dim) const { return shape()[wrap_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const { return strides()[wrap_dim(dim, this->dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  const auto& s = shape();
  const auto& st = strides();
  if (numel_of(s) == 0) return true;  // nothing to lay out: any strides describe an empty tensor
  int64_t expected = 1;
  for (int i = s.size() - 1; i >= 0; --i) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const auto& im = impl();
  auto* base = static_cast<char*>(im.storage->data.get());
  if (im.dtype == DType::i4x2) {
    HT_CHECK(im.offset % 2 == 0, "packed int4 views must start on a byte boundary (offset {})", im.offset);
    return base + im.offset / 2;
  }
  return base + static_cast<std::size_t>(im.offset) * itemsize(im.dtype);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{} {} on {}", dtype_name(dtype()), to_string(shape()), to_string(device()));
}

std::size_t new_tensor_bytes(const Shape& shape, DType dtype) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    HT_CHECK(d >= 0, "cannot create a tensor with negative size {}", to_string(shape));
    HT_CHECK(!__builtin_mul_overflow(numel, d, &numel), "cannot create a tensor of shape {}: more than 2^63 - 1 "
             "elements", to_string(shape));
  }
  const auto limit = static_cast<int64_t>(std::numeric_limits<int64_t>::max() / itemsize(dtype));
  HT_CHECK(numel <= limit, "cannot create a {} tensor of shape {}: more than 2^63 - 1 bytes", dtype_name(dtype),
           to_string(shape));
  return storage_bytes(dtype, numel);
}

Tensor empty(const Shape& shape, TensorOptions opts) {
  auto storage = std::make_shared<StorageImpl>();
  storage->nbytes = new_tensor_bytes(shape, opts.dtype);
  storage->data = allocator_for(opts.device.type).allocate(storage->nbytes, opts.device);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  impl->device = opts.device;
  Tensor t(std::move(impl));
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), {t.dtype(), t.device()}); }
Tensor empty_like(const Tensor& t, DType dtype) { return empty(t.shape(), {dtype, t.device()}); }

uint64_t storage_version(const Tensor& t) {
  if (!t.defined() || t.storage() == nullptr) return 0;
  return t.storage()->version.load(std::memory_order_acquire);
}

void mark_written(const Tensor& t) {
  if (t.defined() && t.storage() != nullptr) t.storage()->version.fetch_add(1, std::memory_order_acq_rel);
}

Tensor make_view(const Tensor& t, const Shape& shape, const Strides& strides, int64_t offset) {
  HT_ASSERT(shape.size() == strides.size(), "view shape {} and strides {} differ in rank", to_string(shape),
            to_string(strides));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  impl->device = t.device();
  return Tensor(std::move(impl));
}

double Tensor::item() const {
  HT_CHECK(numel() == 1, "item(): expected a tensor with one element, got {}", describe());
  return to_vector<double>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = to(Device::cpu()).to(dtype_of<T>()).contiguous();
  std::vector<T> out(static_cast<std::size_t>(host.numel()));
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size() * sizeof(T));
  return out;
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int8_t> Tensor::to_vector<int8_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

}  // namespace ht
