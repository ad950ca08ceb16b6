// Tensor-level glue of the unfold / fold kernels (see unfold_glue.h): fp8 runs in f32 (exact widening; the CPU
// reference accumulates fp8 in f32 and rounds once too), tensors keep their strides. CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/unfold_glue.h"

#include "hadatrain/cuda/context.h"
#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/tensor.h"
#include "cuda/kernels/unfold.cuh"

namespace ht::cuda_ops {
namespace {

bool has_kernel(DType dt) { return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16; }

kernels::UnfoldGeometry geometry(const UnfoldProblem& s) {
  kernels::UnfoldGeometry g;
  g.N = s.N;
  g.C = s.C;
  g.H = s.H;
  g.W = s.W;
  g.OH = s.OH;
  g.OW = s.OW;
  g.kh = s.p.kernel_h;
  g.kw = s.p.kernel_w;
  g.sh = s.p.stride_h;
  g.sw = s.p.stride_w;
  g.ph = s.p.pad_h;
  g.pw = s.p.pad_w;
  g.dh = s.p.dilation_h;
  g.dw = s.p.dilation_w;
  return g;
}

}  // namespace

void unfold2d(const Tensor& cols, const Tensor& x, const UnfoldProblem& s) {
  if (!has_kernel(cols.dtype())) {  // fp8: an exact copy, computed in f32
    const Tensor wide = empty(cols.shape(), {DType::f32, cols.device()});
    unfold2d(wide, to_dtype(x, DType::f32), s);
    copy_(cols, wide);
    return;
  }
  cuda::DeviceGuard guard(cols.device().index);
  const kernels::UnfoldStrides4 xs{x.strides()[0], x.strides()[1], x.strides()[2], x.strides()[3]};
  kernels::launch_unfold2d(cols.dtype(), x.data_ptr(), xs, geometry(s), cols.data_ptr(),
                           cuda::current_stream(cols.device().index));
}

void fold2d(const Tensor& x, const Tensor& cols, const UnfoldProblem& s) {
  if (!has_kernel(x.dtype())) {  // fp8: sums in f32, rounded once to fp8 (as the CPU's acc_t)
    const Tensor wide = empty(x.shape(), {DType::f32, x.device()});
    fold2d(wide, to_dtype(cols, DType::f32), s);
    copy_(x, wide);
    return;
  }
  cuda::DeviceGuard guard(x.device().index);
  const kernels::FoldStrides3 cs{cols.strides()[0], cols.strides()[1], cols.strides()[2]};
  // Contiguous, or the (N, C, H, W) view of a contiguous (N, H, W, C) tensor (when C or H·W is 1 the two orders
  // are the same memory and x is contiguous).
  const bool channels_last = !x.is_contiguous();
  HT_CHECK(!channels_last || is_channels_last(x), "fold2d: the output must be contiguous or channels-last, got {}",
           x.describe());
  kernels::launch_fold2d(x.dtype(), cols.data_ptr(), cs, geometry(s), x.data_ptr(), channels_last,
                         cuda::current_stream(x.device().index));
}

}  // namespace ht::cuda_ops
#endif
