// Tensor glue of HALO's row kernels (cuda/kernels/halo.cuh): inputs other than f32 / bf16 / f16 are widened to f32
// first (exact, as the CPU reference converts them) and made contiguous; H_K's signs travel by value in the launch;
// the quantiser's absmax word comes from the stream-ordered allocator. CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/halo_glue.h"

#include <cstdlib>
#include <cstring>

#include "hadatrain/core/error.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"
#include "cuda/kernels/halo.cuh"

namespace ht::cuda_ops {
namespace {

Tensor kernel_input(const Tensor& x) {
  const DType d = x.dtype();
  const Tensor t = d == DType::f32 || d == DType::bf16 || d == DType::f16 ? x : to_dtype(x, DType::f32);
  return t.contiguous();
}

kernels::HaloSigns signs_of(int k) {
  kernels::HaloSigns s{};
  const auto rows = grad::halo_hadamard_signs(k);
  HT_ASSERT(static_cast<int>(rows.size()) <= kernels::kHaloKernelMaxK, "halo: order {} above the kernel's {}", k,
            kernels::kHaloKernelMaxK);
  for (std::size_t i = 0; i < rows.size(); ++i) s.row[i] = rows[i];
  return s;
}

// HADATRAIN_HALO_SQUARE=0 keeps rows of 2048 ... 16384 values on the fast row kernels (Note [HALO square rows] in
// cuda/kernels/halo_square.cu): the same bits, for measuring what the square kernels give; read once.
bool square_rows() {
  static const bool on = [] {
    const char* v = std::getenv("HADATRAIN_HALO_SQUARE");
    if (!v || !*v || std::strcmp(v, "1") == 0) return true;
    if (std::strcmp(v, "0") == 0) return false;
    HT_FAIL("HADATRAIN_HALO_SQUARE={} is not 0 or 1", v);
  }();
  return on;
}

kernels::HaloRowsArgs rows_args(const Tensor& in, grad::HaloRotation rotation, bool inverse) {
  kernels::HaloRowsArgs a;
  a.in_dtype = in.dtype();
  a.x = in.data_ptr();
  a.R = in.size(0);
  a.C = in.size(1);
  a.n = rotation.n > 1 ? rotation.n : 0;
  a.k = rotation.k;
  a.inverse = inverse;
  a.square = square_rows();
  return a;
}

}  // namespace

void halo_rotate(const Tensor& out, const Tensor& x, const grad::HaloRotate& spec) {
  if (out.numel() == 0) return;
  const Tensor in = kernel_input(x);
  cuda::DeviceGuard guard(out.device().index);
  kernels::HaloRowsArgs a = rows_args(in, spec.rotation, spec.direction == grad::HaloDirection::inverse);
  a.n = spec.rotation.n;  // a rotation of size 1 is still a (trivial) rotation here
  kernels::launch_halo_rotate(a, signs_of(spec.rotation.k), out.data_ptr(), out.dtype(), spec.cols, spec.mult,
                              cuda::current_stream(out.device().index));
}

void halo_quantize(const Tensor& codes, const Tensor& scale, const Tensor& x, grad::Carrier carrier,
                   grad::HaloRotation rotation) {
  if (codes.numel() == 0) {  // nothing to quantise: scale 0
    fill_(scale, 0.0);
    return;
  }
  const Tensor in = kernel_input(x);
  cuda::DeviceGuard guard(codes.device().index);
  Tensor absmax = empty({1}, {DType::f32, codes.device()});
  kernels::launch_halo_quantize(rows_args(in, rotation, false), signs_of(rotation.k), codes.data_ptr(), codes.dtype(),
                                static_cast<float*>(absmax.data_ptr()), static_cast<float*>(scale.data_ptr()),
                                cuda::current_stream(codes.device().index));
}

void halo_quantize_pair(const Tensor& codes, const Tensor& scale, const Tensor& codes_plain, const Tensor& scale_plain,
                        const Tensor& x, grad::HaloRotation rotation) {
  if (codes.numel() == 0) {
    fill_(scale, 0.0);
    fill_(scale_plain, 0.0);
    return;
  }
  const Tensor in = kernel_input(x);
  cuda::DeviceGuard guard(codes.device().index);
  Tensor absmax = empty({2}, {DType::f32, codes.device()});
  kernels::launch_halo_quantize_pair(rows_args(in, rotation, false), signs_of(rotation.k), codes.data_ptr(),
                                     codes_plain.data_ptr(), codes.dtype(), static_cast<float*>(absmax.data_ptr()),
                                     static_cast<float*>(scale.data_ptr()), static_cast<float*>(scale_plain.data_ptr()),
                                     cuda::current_stream(codes.device().index));
}

void halo_quantize_transposed(const Tensor& codes, const Tensor& codes_t, const Tensor& scale, const Tensor& x) {
  if (codes.numel() == 0) {
    fill_(scale, 0.0);
    return;
  }
  const Tensor in = kernel_input(x);
  cuda::DeviceGuard guard(codes.device().index);
  Tensor absmax = empty({1}, {DType::f32, codes.device()});
  kernels::launch_halo_quantize_transposed(rows_args(in, {}, false), codes.data_ptr(), codes_t.data_ptr(),
                                           codes.dtype(), static_cast<float*>(absmax.data_ptr()),
                                           static_cast<float*>(scale.data_ptr()),
                                           cuda::current_stream(codes.device().index));
}

void halo_absmax(const Tensor& absmax, const Tensor& x, grad::HaloRotation rotation) {
  if (x.numel() == 0) {
    fill_(absmax, 0.0);
    return;
  }
  const Tensor in = kernel_input(x);
  cuda::DeviceGuard guard(absmax.device().index);
  kernels::launch_halo_absmax(rows_args(in, rotation, false), signs_of(rotation.k),
                              static_cast<float*>(absmax.data_ptr()), cuda::current_stream(absmax.device().index));
}

void halo_quantize_given(const Tensor& codes, const Tensor& scale, const Tensor& x, grad::HaloRotation rotation,
                         const Tensor& absmax) {
  if (codes.numel() == 0) {
    fill_(scale, 0.0);
    return;
  }
  const Tensor in = kernel_input(x);
  const Tensor m = absmax.contiguous();
  cuda::DeviceGuard guard(codes.device().index);
  kernels::launch_halo_quantize_given(rows_args(in, rotation, false), signs_of(rotation.k), codes.data_ptr(),
                                      codes.dtype(), static_cast<const float*>(m.data_ptr()),
                                      static_cast<float*>(scale.data_ptr()), cuda::current_stream(codes.device().index));
}

void halo_scale_i32(const Tensor& out, const Tensor& acc, const Tensor& s_a, const Tensor& s_b, float mult) {
  if (out.numel() == 0) return;
  const Tensor sa = s_a.contiguous(), sb = s_b.contiguous();
  cuda::DeviceGuard guard(out.device().index);
  kernels::launch_halo_scale_i32(static_cast<const int32_t*>(acc.data_ptr()), acc.numel(),
                                 static_cast<const float*>(sa.data_ptr()), static_cast<const float*>(sb.data_ptr()),
                                 mult, out.data_ptr(), out.dtype(), cuda::current_stream(out.device().index));
}

void halo_transpose(const Tensor& out, const Tensor& x) {
  if (out.numel() == 0) return;
  cuda::DeviceGuard guard(out.device().index);
  kernels::launch_halo_transpose(x.data_ptr(), x.size(0), x.size(1), static_cast<int>(itemsize(x.dtype())),
                                 out.data_ptr(), cuda::current_stream(out.device().index));
}

}  // namespace ht::cuda_ops
#endif
