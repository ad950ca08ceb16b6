// Tensor-level glue of the dropout and rotary-embedding kernels (see dropout_rope_glue.h). fp8 tensors are
// computed in f32 (the CPU's acc_t for them) and converted back. CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/dropout_rope_glue.h"

#include <cmath>
#include <vector>

#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"
#include "cuda/glue/elementwise_glue.h"

namespace ht::cuda_ops {
namespace {

bool has_kernel(DType dt) { return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16; }

}  // namespace

void dropout(const Tensor& out, const Tensor& x, double p, uint64_t seed, uint64_t stream,
             const int64_t* step_word) {
  if (!has_kernel(out.dtype())) {
    Tensor tmp = empty(out.shape(), {DType::f32, out.device()});
    dropout(tmp, to_dtype(x, DType::f32), p, seed, stream, step_word);
    cuda_ops::copy(out, tmp);
    return;
  }
  HT_ASSERT(out.is_contiguous(), "dropout: output must be contiguous");
  const Tensor xc = x.contiguous();
  cuda::DeviceGuard guard(out.device().index);
  kernels::launch_dropout(out.dtype(), out.data_ptr(), xc.data_ptr(), {p, seed, stream, out.numel(), step_word},
                          cuda::current_stream(out.device().index));
}

void rope(const Tensor& out, const Tensor& x, const RopeCall& call) {
  if (!has_kernel(out.dtype())) {
    Tensor tmp = empty(out.shape(), {DType::f32, out.device()});
    rope(tmp, to_dtype(x, DType::f32), call);
    cuda_ops::copy(out, tmp);
    return;
  }
  const int64_t D = x.size(3);
  HT_ASSERT(call.freq.head_dim == D, "rotary_embedding: frequencies for head dim {}, x has {}", call.freq.head_dim, D);
  HT_CHECK(D / 2 * 3 * static_cast<int64_t>(sizeof(double)) <= kernels::kRopeTableBytes,
           "rotary_embedding: the CUDA kernel supports head dims up to {} (its shared frequency and cos/sin table), "
           "got {}",
           kernels::kRopeTableBytes / static_cast<int64_t>(3 * sizeof(double)) * 2, x.describe());
  cuda::DeviceGuard guard(out.device().index);
  // Both operands are read and written through their strides (no contiguous copy of a transposed projection).
  kernels::RopeArgs a{x.size(0), x.size(1), x.size(2), D, call.position_offset, {}, {}, call.sign,
                      call.interleaved ? 1 : 0, call.freq};
  for (int d = 0; d < 4; ++d) {
    a.in_stride[d] = x.strides()[static_cast<std::size_t>(d)];
    a.out_stride[d] = out.strides()[static_cast<std::size_t>(d)];
  }
  kernels::launch_rope(out.dtype(), out.data_ptr(), x.data_ptr(), a, cuda::current_stream(out.device().index));
}

}  // namespace ht::cuda_ops
#endif
