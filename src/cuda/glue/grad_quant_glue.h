// Tensor-level entry points to the quantisation kernels (cuda/kernels/grad_quant.cuh). Outputs are allocated by the
// caller (src/grad/quant.cpp, luq.cpp) with their final shapes; inputs are checked there. Internal to
// src/grad; CUDA builds only.
#pragma once
#ifdef HADATRAIN_CUDA
#include <cstdint>

#include "hadatrain/grad/quant.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::cuda_ops {

// q.values (x's shape, spec.values_dtype: levels, e4m3 codes or dequantised values; (C, N) for the transposed
// layout) and q.scale (f32, one per group) for x on the same device, any floating dtype and strides. With
// spec.report_column_sums, sets q.column_sums (quant.h: in the strip kernel's pass where it serves the launch).
void grad_quantize(grad::Quantized& q, const Tensor& x, const grad::QuantSpec& spec);
// q.values (x's shape, f8e4m3) and q.scale (α, f32).
void grad_luq(const grad::Quantized& q, const Tensor& x, const grad::LuqSpec& spec);
// out (x's shape, f32, contiguous) = x rotated by blockwise H_block along the last dim.
void grad_hadamard(const Tensor& out, const Tensor& x, int64_t block);
// out (i4x2, contiguous) from values (i8, contiguous, values in -8..7 by precondition); and back.
void grad_pack_int4(const Tensor& out, const Tensor& values);
void grad_unpack_int4(const Tensor& out, const Tensor& packed);
// out (f32 or bf16, contiguous, acc's numel) = f32(acc) · (scale_a · scale_b · mult · row_scale[row group])
// in one pass; acc i32 contiguous (rows, last dim), scale_a / scale_b one-element f32 tensors on the device
// (read by the kernel), row_scale (rows / rows_per_scale) f32 contiguous or undefined.
void grad_scale_i32(const Tensor& out, const Tensor& acc, const Tensor& scale_a, const Tensor& scale_b, double mult,
                    const Tensor& row_scale, int64_t rows_per_scale);
// out (2, codes' numel) bf16 contiguous: the hi and lo halves of scale[r]·codes[r, ...] (cuda/kernels/lowp_gemm.cuh,
// split_scaled); codes (rows, ...) i8 or f8e4m3 contiguous, scale (rows) f32 contiguous.
void grad_split_scaled(const Tensor& out, const Tensor& codes, const Tensor& scale);

}  // namespace ht::cuda_ops
#endif
