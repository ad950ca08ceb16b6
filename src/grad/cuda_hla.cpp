// Tensor-level glue of the HLA projection kernel (kernels/hla.h): fp8 inputs are widened to f32 first (exact,
// as the CPU reference converts them), the kept rows travel by value in the launch, x keeps its strides. The
// identity plan (n = 1) is a plain conversion through copy_.
// CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "grad/cuda_hla.h"

#include "hadatrain/core/error.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "kernels/grad_quant.h"
#include "kernels/hla.h"

namespace ht::cuda_ops {

void hla_project(const Tensor& out, const Tensor& x, const grad::HlaPlan& plan, grad::HlaLayout layout,
                 float* absmax) {
  if (out.numel() == 0) return;
  HT_CHECK(plan.block <= kernels::kHlaMaxBlock && plan.kept() <= kernels::kHlaMaxRows,
           "hla_project: the CUDA kernel supports blocks n <= {} with r <= {} kept rows, got plan {}",
           kernels::kHlaMaxBlock, kernels::kHlaMaxRows, plan.describe());
  HT_ASSERT(out.is_contiguous() && out.dtype() == DType::f32, "hla_project: bad output {}", out.describe());
  if (plan.block == 1) {  // identity plan (odd L): a conversion to f32 (the same rounding), transposed for channels
    copy_(layout == grad::HlaLayout::rows ? out : out.transpose(1, 2), x);
    if (absmax) {
      cuda::DeviceGuard guard(out.device().index);
      kernels::launch_absmax(DType::f32, absmax, out.data_ptr(), out.numel(), cuda::current_stream(out.device().index));
    }
    return;
  }
  const bool wide = x.dtype() == DType::f32 || x.dtype() == DType::f64 || x.dtype() == DType::bf16 ||
                    x.dtype() == DType::f16;
  const Tensor in = wide ? x : to_dtype(x, DType::f32);  // fp8: exact in f32
  kernels::HlaRows rows{};
  for (int64_t i = 0; i < plan.kept(); ++i) rows.idx[i] = static_cast<int16_t>(plan.rows[static_cast<std::size_t>(i)]);
  kernels::HlaProjectArgs a;
  a.dtype = in.dtype();
  a.x = in.data_ptr();
  a.B = in.size(0);
  a.L = in.size(1);
  a.C = in.size(2);
  a.sb = in.strides()[0];
  a.sl = in.strides()[1];
  a.sc = in.strides()[2];
  a.block = plan.block;
  a.kept = plan.kept();
  a.channels = layout == grad::HlaLayout::channels;
  a.out = static_cast<float*>(out.data_ptr());
  a.absmax = absmax;
  cuda::DeviceGuard guard(out.device().index);
  kernels::launch_hla_project(a, rows, cuda::current_stream(out.device().index));
}

}  // namespace ht::cuda_ops
#endif
