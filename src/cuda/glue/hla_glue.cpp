// Tensor-level glue of the HLA projection kernel (cuda/kernels/hla.cuh): fp8 inputs are widened to f32 first (exact,
// as the CPU reference converts them), the kept rows travel by value in the launch, x keeps its strides. The
// identity plan (n = 1) of hla_project is a plain conversion through copy_; hla_project_unfolded's fused kernel
// runs it too (a gather of the columns converted to f32). hla_project_unfolded runs the fused kernel (one H200,
// bf16 step graphs: ResNet-50 b128 HLQ 45.02 ms against 49.44 with unfold2d + hla_project, ResNet-34 b256 21.55
// against 21.44 with 1.84 GiB of graph memory against 1.91), and the composition only for an image whose offsets do not fit the fused kernel's int32 indexing (or with
// negative strides). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/hla_glue.h"

#include "hadatrain/core/error.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/unfold.h"
#include "cuda/kernels/grad_quant.cuh"
#include "cuda/kernels/hla.cuh"

namespace ht::cuda_ops {

namespace {

void check_plan_fits(const char* op, const grad::HlaPlan& plan) {
  HT_CHECK(plan.block <= kernels::kHlaMaxBlock && plan.kept() <= kernels::kHlaMaxRows,
           "{}: the CUDA kernel supports blocks n <= {} with r <= {} kept rows, got plan {}", op,
           kernels::kHlaMaxBlock, kernels::kHlaMaxRows, plan.describe());
}

// The kernels read f32, f64, bf16 and f16; fp8 is widened to f32 first (exact, as the CPU reference converts it).
Tensor kernel_input(const Tensor& x) {
  const DType d = x.dtype();
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16 ? x : to_dtype(x, DType::f32);
}

kernels::HlaRows rows_of(const grad::HlaPlan& plan) {
  kernels::HlaRows rows{};
  for (int64_t i = 0; i < plan.kept(); ++i) rows.idx[i] = static_cast<int16_t>(plan.rows[static_cast<std::size_t>(i)]);
  return rows;
}

}  // namespace

void hla_project(const Tensor& out, const Tensor& x, const grad::HlaPlan& plan, grad::HlaLayout layout,
                 float* absmax) {
  if (out.numel() == 0) return;
  check_plan_fits("hla_project", plan);
  HT_ASSERT(out.is_contiguous() && out.dtype() == DType::f32, "hla_project: bad output {}", out.describe());
  if (plan.block == 1) {  // identity plan (odd L): a conversion to f32 (the same rounding), transposed for channels
    copy_(layout == grad::HlaLayout::rows ? out : out.transpose(1, 2), x);
    if (absmax) {
      cuda::DeviceGuard guard(out.device().index);
      kernels::launch_absmax(DType::f32, absmax, out.data_ptr(), out.numel(), cuda::current_stream(out.device().index));
    }
    return;
  }
  const Tensor in = kernel_input(x);
  const kernels::HlaRows rows = rows_of(plan);
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

void hla_project_unfolded(const Tensor& out, const Tensor& image, const Unfold2dParams& window,
                          const grad::HlaPlan& plan, grad::HlaLayout layout, float* absmax) {
  if (out.numel() == 0) return;
  check_plan_fits("hla_project_unfolded", plan);
  HT_ASSERT(out.is_contiguous() && out.dtype() == DType::f32 && image.dim() == 4,
            "hla_project_unfolded: bad output {} or image {}", out.describe(), image.describe());
  const Tensor in = kernel_input(image);
  const auto& st = in.strides();
  const int64_t C = in.size(1), H = in.size(2), W = in.size(3);
  const bool fits = st[0] >= 0 && st[1] >= 0 && st[2] >= 0 && st[3] >= 0 &&
                    (C - 1) * st[1] + (H - 1) * st[2] + (W - 1) * st[3] < (int64_t{1} << 31);
  // The fused kernel indexes one sample's image with non-negative int32 offsets; else the composition.
  if (!fits) {
    hla_project(out, unfold2d(in, window), plan, layout, absmax);
    return;
  }
  kernels::HlaUnfoldedArgs a;
  a.dtype = in.dtype();
  a.x = in.data_ptr();
  a.N = in.size(0);
  a.C = C;
  a.H = H;
  a.W = W;
  a.sn = st[0];
  a.sc = st[1];
  a.sh = st[2];
  a.sw = st[3];
  a.kh = window.kernel_h;
  a.kw = window.kernel_w;
  a.stride_h = window.stride_h;
  a.stride_w = window.stride_w;
  a.pad_h = window.pad_h;
  a.pad_w = window.pad_w;
  a.dil_h = window.dilation_h;
  a.dil_w = window.dilation_w;
  const Unfold2dGrid grid = unfold2d_grid("hla_project_unfolded", H, W, window);
  a.OH = grid.h;
  a.OW = grid.w;
  HT_ASSERT(a.OH * a.OW == plan.length, "hla_project_unfolded: the plan {} is not for the {}x{} output grid",
            plan.describe(), a.OH, a.OW);
  a.block = plan.block;
  a.kept = plan.kept();
  a.channels = layout == grad::HlaLayout::channels;
  a.out = static_cast<float*>(out.data_ptr());
  a.absmax = absmax;
  cuda::DeviceGuard guard(out.device().index);
  kernels::launch_hla_project_unfolded(a, rows_of(plan), cuda::current_stream(out.device().index));
}

void hla_back_project(const Tensor& out, const Tensor& g, const grad::HlaPlan& plan, float mult) {
  if (out.numel() == 0) return;
  check_plan_fits("hla_back_project", plan);
  HT_ASSERT(out.is_contiguous() && out.dim() == 3, "hla_back_project: bad output {}", out.describe());
  const Tensor in = g.dtype() == DType::f32 ? g : to_dtype(g, DType::f32);  // as the CPU converts
  kernels::HlaBackArgs a;
  a.out_dtype = out.dtype();
  a.g = static_cast<const float*>(in.data_ptr());
  a.B = out.size(0);
  a.L = out.size(1);
  a.C = out.size(2);
  a.sb = in.strides()[0];
  a.sr = in.strides()[1];
  a.sc = in.strides()[2];
  a.block = plan.block;
  a.kept = plan.kept();
  a.mult = mult;
  a.out = out.data_ptr();
  cuda::DeviceGuard guard(out.device().index);
  kernels::launch_hla_back_project(a, rows_of(plan), cuda::current_stream(out.device().index));
}

}  // namespace ht::cuda_ops
#endif
