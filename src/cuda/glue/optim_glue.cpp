// CUDA glue of the optimiser steps (see optim_glue.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/optim_glue.h"

#include <algorithm>
#include <map>
#include <utility>

#include "hadatrain/cuda/context.h"
#include "hadatrain/tensor/factory.h"

namespace ht::optim::cuda_step {
namespace {

void check_item(const char* opt, const Tensor& p, const Tensor& g) {
  HT_CHECK(p.is_contiguous(), "{}: CUDA parameter {} must be contiguous", opt, p.describe());
  HT_CHECK(g.dtype() == p.dtype() && g.device() == p.device() && g.shape() == p.shape(),
           "{}: gradient {} does not match its parameter {}", opt, g.describe(), p.describe());
}

// Groups descriptors by (device index, dtype) and launches each group in batches of kOptimBatch.
template <class Desc, class Launch>
void run_groups(const std::map<std::pair<int, DType>, std::vector<std::pair<Desc, int64_t>>>& groups,
                const DeviceHyper& hyper, Launch&& launch) {
  for (const auto& [key, descs] : groups) {
    const Device dev = Device::cuda(key.first);
    cuda::DeviceGuard guard(dev.index);
    const cudaStream_t stream = cuda::current_stream(dev.index);
    const void* h = hyper.get(dev.index);
    for (std::size_t start = 0; start < descs.size(); start += kernels::kOptimBatch) {
      kernels::OptimBatch<Desc> batch{};
      const std::size_t count = std::min<std::size_t>(kernels::kOptimBatch, descs.size() - start);
      int64_t max_n = 0;
      for (std::size_t i = 0; i < count; ++i) {
        batch.t[i] = descs[start + i].first;
        max_n = std::max(max_n, descs[start + i].second);
      }
      launch(key.second, batch, static_cast<int>(count), max_n, h, stream);
    }
  }
}

}  // namespace

void DeviceHyper::stage_bytes(int device, const void* h, int bytes) {
  auto it = bufs_.find(device);
  if (it == bufs_.end()) it = bufs_.emplace(device, empty({64}, {DType::u8, Device::cuda(device)})).first;
  cuda::DeviceGuard guard(device);
  kernels::launch_store_hyper(it->second.data_ptr(), h, bytes, cuda::current_stream(device));
}

const void* DeviceHyper::get(int device) const {
  const auto it = bufs_.find(device);
  HT_ASSERT(it != bufs_.end(), "optimiser: no hyper-parameters staged on cuda:{} (begin_step before apply)", device);
  return it->second.data_ptr();
}

void sgd(const std::vector<SgdItem>& items, const DeviceHyper& hyper) {
  std::map<std::pair<int, DType>, std::vector<std::pair<kernels::SgdTensor, int64_t>>> groups;
  std::vector<Tensor> keep;  // contiguous gradients live until the launches are queued
  for (const SgdItem& it : items) {
    const Tensor g = it.g.contiguous();
    check_item("SGD", it.p, g);
    keep.push_back(g);
    groups[{it.p.device().index, it.p.dtype()}].push_back(
        {{it.p.data_ptr(), g.data_ptr(), it.buf.defined() ? it.buf.data_ptr() : nullptr, it.p.numel(),
          it.weight_decay, it.first ? 1 : 0, 0, it.lr_scale},
         it.p.numel()});
  }
  run_groups(groups, hyper,
             [&](DType dt, const kernels::OptimBatch<kernels::SgdTensor>& b, int n, int64_t max_n, const void* h,
                 cudaStream_t s) {
               kernels::launch_sgd_step(dt, b, n, max_n, static_cast<const kernels::SgdHyper*>(h), s);
             });
}

void adamw(const std::vector<AdamWItem>& items, const DeviceHyper& hyper) {
  std::map<std::pair<int, DType>, std::vector<std::pair<kernels::AdamWTensor, int64_t>>> groups;
  std::vector<Tensor> keep;
  for (const AdamWItem& it : items) {
    const Tensor g = it.g.contiguous();
    check_item("AdamW", it.p, g);
    keep.push_back(g);
    groups[{it.p.device().index, it.p.dtype()}].push_back(
        {{it.p.data_ptr(), g.data_ptr(), it.m.data_ptr(), it.v.data_ptr(), it.p.numel(), it.weight_decay,
          it.lr_scale},
         it.p.numel()});
  }
  run_groups(groups, hyper,
             [&](DType dt, const kernels::OptimBatch<kernels::AdamWTensor>& b, int n, int64_t max_n, const void* h,
                 cudaStream_t s) {
               kernels::launch_adamw_step(dt, b, n, max_n, static_cast<const kernels::AdamWHyper*>(h), s);
             });
}

}  // namespace ht::optim::cuda_step
#endif
