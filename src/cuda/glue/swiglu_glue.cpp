// Tensor-level glue of the fused SwiGLU kernels (see swiglu_glue.h).
#ifdef HADATRAIN_CUDA
#include "cuda/glue/swiglu_glue.h"

#include "hadatrain/core/error.h"
#include "hadatrain/cuda/context.h"
#include "cuda/kernels/swiglu.cuh"

namespace ht::cuda_ops {

void swiglu_forward(const Tensor& y, const Tensor& g, const Tensor& u) {
  HT_ASSERT(y.is_contiguous(), "swiglu: output must be contiguous");
  const Tensor gc = g.contiguous(), uc = u.contiguous();
  cuda::DeviceGuard guard(y.device().index);
  kernels::launch_swiglu_forward(y.dtype(), y.data_ptr(), gc.data_ptr(), uc.data_ptr(), y.numel(),
                                 cuda::current_stream(y.device().index));
}

void swiglu_backward(const Tensor& dg, const Tensor& du, const Tensor& dy, const Tensor& g, const Tensor& u) {
  HT_ASSERT(dg.is_contiguous() && du.is_contiguous(), "swiglu backward: outputs must be contiguous");
  const Tensor dyc = dy.contiguous(), gc = g.contiguous(), uc = u.contiguous();
  cuda::DeviceGuard guard(dg.device().index);
  const kernels::SwigluBackwardArgs a{dg.data_ptr(), du.data_ptr(), dyc.data_ptr(), gc.data_ptr(), uc.data_ptr(),
                                      dg.numel()};
  kernels::launch_swiglu_backward(dg.dtype(), a, cuda::current_stream(dg.device().index));
}

}  // namespace ht::cuda_ops
#endif
