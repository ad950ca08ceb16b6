// Launchers of sum/mean reductions over any set of dims of a strided input. The input is viewed as
// M kept positions x K reduced positions; out[m] = scale * sum_k in[m, k], accumulated in float for
// f32/bf16/f16/fp8, double for f64 and int64 for integers and bool (whose output is i64). The order of
// additions is fixed by the shapes (no atomics), so results are deterministic.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/reduce_plan.h"

namespace ht::kernels {

struct SumArgs {
  DType dtype;  // input dtype; the output is the same for floating dtypes, i64 otherwise
  void* out;    // contiguous, kept.count elements
  const void* in;
  ReduceLayout layout;
  double scale;  // 1 for sum, 1/K for mean
};

// `workspace` holds plan.workspace_bytes bytes of device memory (may be null when that is 0).
void launch_sum(const SumArgs& args, const SumPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace ht::kernels
