// Side branches (tensor/side_branch.h, Note [Side branches]).
#include "hadatrain/tensor/side_branch.h"

#include <vector>

namespace ht {

SideBranch::SideBranch(Device device, bool enabled) {
  if (!enabled || !device.is_cuda()) return;
  if (const CudaHooks* h = cuda_hooks()) backend_ = h->fork(device);
}

SideBranch::~SideBranch() {
  if (!backend_) return;
  try {
    backend_->wait(backend_->mark(), {});
  } catch (...) {  // a CUDA error here is reported by the next call that checks; never throw from a destructor
  }
}

namespace {

std::vector<StorageImpl*> storages_of(std::initializer_list<Tensor> tensors) {
  std::vector<StorageImpl*> out;
  for (const Tensor& t : tensors)
    if (t.defined() && t.storage()) out.push_back(t.storage().get());
  return out;
}

}  // namespace

SideBranch::Mark SideBranch::mark() { return {backend_ ? backend_->mark() : 0}; }

void SideBranch::wait(Mark m, std::initializer_list<Tensor> produced) {
  if (backend_) backend_->wait(m.id, storages_of(produced));
}

void SideBranch::join(std::initializer_list<Tensor> produced) {
  if (!backend_) return;
  std::unique_ptr<BranchBackend> b = std::move(backend_);
  b->wait(b->mark(), storages_of(produced));
}

}  // namespace ht
