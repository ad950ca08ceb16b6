// Launchers of the fused multi-tensor optimiser steps (SGD, AdamW): one launch updates every parameter
// of one dtype (f32 or f64 master weights). The per-tensor descriptors live in a device array; the grid
// is (blocks per tensor, tensors) and each block walks its tensor with a grid stride. Formulas are the
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
};
struct SgdHyper {
  double lr, momentum, dampening;
  int32_t nesterov;
};
// tensors: a device array of `count` descriptors.
void launch_sgd_step(DType dt, const SgdTensor* tensors, int count, int64_t max_n, const SgdHyper& h,
                     cudaStream_t stream);

struct AdamWTensor {
  void* p;
  const void* g;
  void* m;
  void* v;
  int64_t n;
  double decay;  // 1 - lr * wd (1 for parameters without decay)
};
struct AdamWHyper {
  double lr, beta1, beta2, eps;
  double bc1, bc2;  // 1 - beta^t, computed on the host with std::pow like the CPU path
};
void launch_adamw_step(DType dt, const AdamWTensor* tensors, int count, int64_t max_n, const AdamWHyper& h,
                       cudaStream_t stream);

}  // namespace ht::kernels
