// CUDA glue of the optimiser steps (see cuda_step.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda_step.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "hadatrain/cuda/context.h"
#include "hadatrain/tensor/factory.h"

namespace ht::optim::cuda_step {
namespace {

// Copies `descs` to a device array on `dev` (a u8 tensor; its stream-ordered free follows the launch).
// Staged in pinned host memory so that the copy is asynchronous: from pageable memory it would
// synchronise the stream, i.e. wait every step for the whole forward and backward to finish.
template <class Desc>
Tensor to_device(const std::vector<Desc>& descs, Device dev) {
  Tensor host = empty_pinned({static_cast<int64_t>(descs.size() * sizeof(Desc))}, DType::u8, dev);
  std::memcpy(host.data_ptr(), descs.data(), descs.size() * sizeof(Desc));
  return host.to(dev);
}

void check_item(const char* opt, const Tensor& p, const Tensor& g) {
  HT_CHECK(p.is_contiguous(), "{}: CUDA parameter {} must be contiguous", opt, p.describe());
  HT_CHECK(g.dtype() == p.dtype() && g.device() == p.device() && g.shape() == p.shape(),
           "{}: gradient {} does not match its parameter {}", opt, g.describe(), p.describe());
}

// Groups descriptors by (device index, dtype) and launches each group in chunks the grid's y can hold.
template <class Desc, class Launch>
void run_groups(const std::map<std::pair<int, DType>, std::pair<std::vector<Desc>, int64_t>>& groups, Launch&& launch) {
  constexpr std::size_t kMaxTensors = 65535;  // gridDim.y limit
  for (const auto& [key, val] : groups) {
    const auto& [descs, max_n] = val;
    const Device dev = Device::cuda(key.first);
    cuda::DeviceGuard guard(dev.index);
    const cudaStream_t stream = cuda::current_stream(dev.index);
    for (std::size_t start = 0; start < descs.size(); start += kMaxTensors) {
      std::vector<Desc> chunk(descs.begin() + static_cast<std::ptrdiff_t>(start),
                              descs.begin() + static_cast<std::ptrdiff_t>(std::min(descs.size(), start + kMaxTensors)));
      const Tensor dev_descs = to_device(chunk, dev);
      launch(key.second, static_cast<const Desc*>(dev_descs.data_ptr()), static_cast<int>(chunk.size()), max_n,
             stream);
    }
  }
}

}  // namespace

void sgd(const std::vector<SgdItem>& items, const kernels::SgdHyper& h) {
  std::map<std::pair<int, DType>, std::pair<std::vector<kernels::SgdTensor>, int64_t>> groups;
  std::vector<Tensor> keep;  // contiguous gradients live until the launches are queued
  for (const SgdItem& it : items) {
    const Tensor g = it.g.contiguous();
    check_item("SGD", it.p, g);
    keep.push_back(g);
    auto& grp = groups[{it.p.device().index, it.p.dtype()}];
    grp.first.push_back({it.p.data_ptr(), g.data_ptr(), it.buf.defined() ? it.buf.data_ptr() : nullptr, it.p.numel(),
                         it.weight_decay, it.first ? 1 : 0, 0});
    grp.second = std::max(grp.second, it.p.numel());
  }
  run_groups(groups, [&](DType dt, const kernels::SgdTensor* d, int n, int64_t max_n, cudaStream_t s) {
    kernels::launch_sgd_step(dt, d, n, max_n, h, s);
  });
}

void adamw(const std::vector<AdamWItem>& items, const kernels::AdamWHyper& h) {
  std::map<std::pair<int, DType>, std::pair<std::vector<kernels::AdamWTensor>, int64_t>> groups;
  std::vector<Tensor> keep;
  for (const AdamWItem& it : items) {
    const Tensor g = it.g.contiguous();
    check_item("AdamW", it.p, g);
    keep.push_back(g);
    auto& grp = groups[{it.p.device().index, it.p.dtype()}];
    grp.first.push_back({it.p.data_ptr(), g.data_ptr(), it.m.data_ptr(), it.v.data_ptr(), it.p.numel(), it.decay});
    grp.second = std::max(grp.second, it.p.numel());
  }
  run_groups(groups, [&](DType dt, const kernels::AdamWTensor* d, int n, int64_t max_n, cudaStream_t s) {
    kernels::launch_adamw_step(dt, d, n, max_n, h, s);
  });
}

}  // namespace ht::optim::cuda_step
#endif
