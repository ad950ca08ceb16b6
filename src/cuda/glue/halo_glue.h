// Tensor-level entry points to HALO's row kernels (cuda/kernels/halo.cuh). Internal to src/grad; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include "hadatrain/grad/pipeline_halo.h"

namespace ht::cuda_ops {

// out (R, spec.cols) contiguous of spec.out_dtype; x (R, C) on out's device, any floating dtype and strides.
void halo_rotate(const Tensor& out, const Tensor& x, const grad::HaloRotate& spec);
// codes (R, n) contiguous i8 / f8e4m3, scale f32 (1); x (R, C) on their device; rotation n = 1: none (n = C).
void halo_quantize(const Tensor& codes, const Tensor& scale, const Tensor& x, grad::Carrier carrier,
                   grad::HaloRotation rotation);
// halo_quantize of x's rows rotated (codes (R, n), scale) and unrotated (codes_plain (R, C), scale_plain), in one
// absmax and one quantise pass where the fast kernels apply; rotation.n > 1.
void halo_quantize_pair(const Tensor& codes, const Tensor& scale, const Tensor& codes_plain, const Tensor& scale_plain,
                        const Tensor& x, grad::HaloRotation rotation);
// halo_quantize without rotation, the codes also transposed: codes (R, C) and codes_t (C, R) contiguous i8 / f8e4m3,
// scale f32 (1); x (R, C) on their device (Note [HALO transposed codes] in cuda/kernels/halo_transpose.cu).
void halo_quantize_transposed(const Tensor& codes, const Tensor& codes_t, const Tensor& scale, const Tensor& x);
// absmax f32 (1) = max |v| over x's rotated values; codes (i8 / f8e4m3: the carrier) and scale as halo_quantize
// for the m = absmax given (a device f32).
void halo_absmax(const Tensor& absmax, const Tensor& x, grad::HaloRotation rotation);
void halo_quantize_given(const Tensor& codes, const Tensor& scale, const Tensor& x, grad::HaloRotation rotation,
                         const Tensor& absmax);
// out (M, N) f32 / bf16 = float(acc)·((s_a·s_b)·mult); acc (M, N) i32 contiguous, s_a / s_b f32 (1) on the device.
void halo_scale_i32(const Tensor& out, const Tensor& acc, const Tensor& s_a, const Tensor& s_b, float mult);

// out (C, R) contiguous = x (R, C)ᵀ, x contiguous with 1- or 2-byte elements, on out's device.
void halo_transpose(const Tensor& out, const Tensor& x);

}  // namespace ht::cuda_ops
#endif
