// Device checks shared by op files.
#include "hadatrain/ops/dispatch.h"

#include "hadatrain/tensor/cuda_hooks.h"

namespace ht {

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    HT_CHECK(t->device() == first->device(), "{}: tensors are on different devices ({} and {}); move them with .to()",
             op, to_string(first->device()), to_string(t->device()));
  }
  HT_CHECK(first != nullptr, "{}: no defined tensor among the inputs", op);
  return first->device();
}

void no_cuda_kernel(const char* op) {
  require_cuda(op);
  HT_FAIL("{}: no CUDA kernel for this op yet", op);
}

void check_floating(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t && t->defined())
      HT_CHECK(is_floating(t->dtype()), "{}: expected a floating tensor, got {}", op, t->describe());
}

}  // namespace ht
