// Launchers for the low-precision GEMM helpers (src/cuda/libs/gemm_lowp.cpp, Note [Low-precision GEMM]):
//  * a batched, zero-padding 2-D copy, used to bring operands that miss cuBLASLt's int8/fp8 alignment
//    requirements into padded buffers (zeros along K add nothing to a dot product) and to copy the padded
//    result back;
//  * simple, correct "NT" product kernels (one thread per output element), the last resort when cuBLASLt
//    offers no algorithm even for the padded problem: int8 x int8 -> int32 (exact, int32 accumulation) and
//    fp8 x fp8 -> f32/bf16 (fp32 products and accumulation, scales read from device memory).
// All matrices are row-major with the given leading dims (elements) and batch strides (elements; 0 = one
// matrix shared by every batch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

// dst (batch, dst_rows, dst_cols) with row stride dst_ld = src (batch, rows, cols) with row stride src_ld,
// zero outside (rows <= dst_rows, cols <= dst_cols). elem_bytes is 1, 2 or 4.
struct PadCopyArgs {
  const void* src = nullptr;
  int64_t src_ld = 0, src_batch_stride = 0, rows = 0, cols = 0;
  void* dst = nullptr;
  int64_t dst_ld = 0, dst_batch_stride = 0, dst_rows = 0, dst_cols = 0;
  int64_t batch = 1;
  int elem_bytes = 1;
};
void launch_pad_copy_2d(const PadCopyArgs& args, cudaStream_t stream);

// c (batch, m, n) = a (batch, m, k) · b (batch, n, k)ᵀ.
struct LowpKernelArgs {
  DType a_dtype = DType::i8, b_dtype = DType::i8, c_dtype = DType::i32;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  const float* scale_a = nullptr;  // fp8 only, device pointers (nullptr = 1)
  const float* scale_b = nullptr;
};
// i8 x i8 -> i32, or f8e4m3/f8e5m2 x f8e4m3/f8e5m2 -> f32/bf16 (c = scale_a·scale_b·sum, rounded once).
void launch_lowp_gemm_nt(const LowpKernelArgs& args, cudaStream_t stream);

// The epilogue of an integer product in one pass: out[i] = f32(acc[i]) · (s · row_scale[(i / cols) /
// rows_per_scale]) with s = (scale_a · scale_b) · mult, f32 arithmetic (__fmul_rn), stored as f32 or bf16
// (rounded once). scale_a / scale_b: device pointers to one f32 each (nullptr = 1), read by the kernel;
// mult: a host constant (e.g. HLA's 1/n); row_scale: optional per-row-group f32 scales (HQ's per-token or
// per-sample s_g), nullptr = 1.
struct ScaleI32Args {
  const int32_t* acc = nullptr;  // (n) = (rows, cols)
  int64_t n = 0;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  float mult = 1.0f;
  const float* row_scale = nullptr;  // (rows / rows_per_scale)
  int64_t cols = 1, rows_per_scale = 1;
  DType out_dtype = DType::f32;  // f32 or bf16
  void* out = nullptr;           // (n)
};
void launch_scale_i32(const ScaleI32Args& args, cudaStream_t stream);


// The scaled codes of a product with per-sample scales on its contraction axis (Note [Per-sample scales in one
// product], src/grad/pipeline.cpp): for codes (rows, cols) (i8 or f8e4m3, contiguous) and scale (rows) f32,
// t = scale[r]·code in f32 (__fmul_rn), hi[i] = bf16(t) and lo[i] = bf16(t − f32(hi[i])) (round to nearest even,
// as the CPU's conversions), stored as out (2, rows, cols) bf16: hi, then lo.
struct SplitScaledArgs {
  const void* codes = nullptr;
  DType codes_dtype = DType::i8;
  const float* scale = nullptr;  // (rows)
  int64_t rows = 0, cols = 0;
  void* out = nullptr;  // (2, rows, cols) bf16
};
void launch_split_scaled(const SplitScaledArgs& args, cudaStream_t stream);


}  // namespace ht::kernels
