// Launchers of the 2-D pooling kernels (CPU reference: src/ops/pool.cpp). One thread per output element
// forward; backward is a gather, one thread per input element summing the gradients of the windows that
// hold it in the CPU's order (ascending oh, ow), so results are deterministic. All sums are in double, as
// on the CPU. Supported dtypes: f32, f64, bf16, f16 (the op file converts others).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

struct PoolShape {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input (N, C, H, W)
  int64_t OH = 0, OW = 0;              // output (N, C, OH, OW)
  int kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;  // fixed windows (unused by adaptive pools)
};

// Element strides of the input x (N, C, H, W); outputs and gradients are contiguous.
struct PoolStrides {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

enum class AvgKind { fixed, adaptive };

// out (N, C, OH, OW), indices (N, C, OH, OW) i64 = h * W + w of the first maximal element (NaN wins).
void launch_max_pool2d(DType dt, const void* x, PoolStrides xs, const PoolShape& s, void* out, int64_t* indices,
                       cudaStream_t stream);
// gx (N, C, H, W) = sum of grad_out over the outputs whose index selects each element; gout contiguous.
void launch_max_pool2d_backward(DType dt, const void* grad_out, const int64_t* indices, const PoolShape& s, void* gx,
                                cudaStream_t stream);
// out (N, C, OH, OW) = window mean (fixed: divisor kh*kw, padding counted; adaptive: PyTorch's bins).
void launch_avg_pool2d(DType dt, AvgKind kind, const void* x, PoolStrides xs, const PoolShape& s, void* out,
                       cudaStream_t stream);
// gx (N, C, H, W) = sum over the windows holding each element of grad_out / divisor.
void launch_avg_pool2d_backward(DType dt, AvgKind kind, const void* grad_out, const PoolShape& s, void* gx,
                                cudaStream_t stream);

}  // namespace ht::kernels
