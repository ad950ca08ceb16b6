// Launchers of the 2-D pooling kernels (CPU reference: src/ops/pool.cpp). Forward: one thread per output
// element (NCHW) or per output pixel and group of channels (NHWC, 16-byte accesses along C where C allows);
// backward is a gather, one thread per input element (or pixel and channel group) summing the gradients of
// the windows that hold it in the CPU's order (ascending oh, ow), so results are deterministic. All sums are
// in double, as on the CPU; max compares in float for narrow dtypes (exact). The global average pool (the
// whole plane, output 1x1) has its own kernels. Index math is 32-bit (fast division) when every index fits,
// else 64-bit. Supported dtypes: f32, f64, bf16, f16 (the op file converts others).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

// Memory layout of out, indices, grad_out and gx, all dense: nchw (N, C, H, W) row-major, or nhwc
// (N, H, W, C) row-major (a channels-last tensor). With nhwc, x is an (N, H, W, C)-dense buffer too.
enum class PoolLayout { nchw, nhwc };

struct PoolShape {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input (N, C, H, W)
  int64_t OH = 0, OW = 0;              // output (N, C, OH, OW)
  int kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;  // fixed windows (unused by adaptive pools)
  PoolLayout layout = PoolLayout::nchw;
};

// Element strides of the input x (N, C, H, W), read through them with layout nchw (ignored with nhwc).
struct PoolStrides {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

enum class AvgKind { fixed, adaptive };

// out (N, C, OH, OW), indices (same layout) i32 = h * W + w of the first maximal element (NaN wins), or
// null when no backward needs them. Requires H * W < 2^31 (the op checks).
void launch_max_pool2d(DType dt, const void* x, PoolStrides xs, const PoolShape& s, void* out, int32_t* indices,
                       cudaStream_t stream);
// gx (N, C, H, W) = sum of grad_out over the outputs whose index selects each element.
void launch_max_pool2d_backward(DType dt, const void* grad_out, const int32_t* indices, const PoolShape& s, void* gx,
                                cudaStream_t stream);
// out (N, C, OH, OW) = window mean (fixed: divisor kh*kw, padding counted; adaptive: PyTorch's bins).
void launch_avg_pool2d(DType dt, AvgKind kind, const void* x, PoolStrides xs, const PoolShape& s, void* out,
                       cudaStream_t stream);
// gx (N, C, H, W) = sum over the windows holding each element of grad_out / divisor.
void launch_avg_pool2d_backward(DType dt, AvgKind kind, const void* grad_out, const PoolShape& s, void* gx,
                                cudaStream_t stream);

}  // namespace ht::kernels
