// Launchers of the fused multi-tensor optimiser steps (SGD, AdamW): one launch updates up to kOptimBatch
// parameters of one dtype (f32 or f64 master weights). The per-tensor descriptors travel by value as a
// kernel argument, the step's hyper-parameters (learning rate, bias corrections) are read from device
// memory, staged before the step by launch_store_hyper: so a recorded step graph replays with the current
// learning rate and nothing is uploaded from the host per step (Note [Step graphs]). The grid is
// (blocks per tensor, tensors) and each block walks its tensor with a grid stride. Formulas are the
// CPU reference's in src/optim/{sgd,adamw}.cpp, evaluated in double with the same operation order and
// no FMA contraction (explicit _rn intrinsics), so f64 results are bit-identical and f32 ones round the
// same double value.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

// One SGD parameter: p, its gradient g and momentum buffer buf (nullptr without momentum), n elements,
// all contiguous of the launch's dtype.
struct SgdTensor {
  void* p;
  const void* g;
  void* buf;
  int64_t n;
  double weight_decay;  // coupled: g + wd * p (0 for parameters without decay)
  int32_t first;        // 1 on the buffer's first step: buf = g
  int32_t pad_;
  double lr_scale;  // this parameter's learning rate is lr * lr_scale (optim.lr_multipliers)
};
struct SgdHyper {
  double lr, momentum, dampening;
  int32_t nesterov;
};

// Descriptors per launch: 64 x 56 bytes keeps the kernel argument under the classic 4 KiB limit.
inline constexpr int kOptimBatch = 64;
template <class D>
struct OptimBatch {
  D t[kOptimBatch];
};

// One launch for `count` <= kOptimBatch descriptors; `h` points to device memory.
void launch_sgd_step(DType dt, const OptimBatch<SgdTensor>& tensors, int count, int64_t max_n, const SgdHyper* h,
                     cudaStream_t stream);

struct AdamWTensor {
  void* p;
  const void* g;
  void* m;
  void* v;
  int64_t n;
  double weight_decay;  // decoupled: p *= 1 - lr * weight_decay (0 for parameters without decay)
  double lr_scale;      // this parameter's learning rate is lr * lr_scale (optim.lr_multipliers)
};
struct AdamWHyper {
  double lr, beta1, beta2, eps;
  double bc1, bc2;  // 1 - beta^t, computed on the host with std::pow like the CPU path
};
void launch_adamw_step(DType dt, const OptimBatch<AdamWTensor>& tensors, int count, int64_t max_n,
                       const AdamWHyper* h, cudaStream_t stream);

// Writes `bytes` (<= 64) bytes of `src` (host memory, passed by value in the launch) to device memory `dst`
// in stream order.
void launch_store_hyper(void* dst, const void* src, int bytes, cudaStream_t stream);

}  // namespace ht::kernels
