// Low-precision matrix products: building blocks for quantized gradient pipelines. Not differentiable (the
// results carry no autograd history). Both operands are "NT": K is the last dim of a AND of b, so
// out = a · bᵀ. CUDA runs them on cuBLASLt's int8 / fp8 tensor-core kernels (cuda/cublaslt_gemm.h, gemm_lowp_nt;
// any sizes, unaligned ones through zero-padded copies); the CPU has plain reference loops.
#pragma once
#include "hadatrain/tensor/tensor.h"

namespace ht {

// a (..., M, K) i8, b (..., N, K) i8 -> (..., M, N) i32 = a · bᵀ, exact (int32 accumulation, wrapping like
// two's complement if a sum leaves the int32 range). The leading batch dims of a and b are equal, or b is
// 2-D and shared by every batch of a.
Tensor int8_matmul_nt(const Tensor& a, const Tensor& b);

// How CUDA's fp8 products sum: `precise` promotes the tensor cores' partial sums to f32 at intervals along K
// (cuBLASLt's default); `fast` (CUBLASLT_MATMUL_DESC_FAST_ACCUM) keeps them in the tensor cores' narrower
// accumulator across the whole K: faster where the promotion costs, less accurate for long K. The CPU computes
// the exact product either way.
//
// Note [Fast accumulation of integer codes]
// Hopper's fp8 tensor cores add products into an accumulator of 14 significant bits (an f32 exponent with a
// 13-bit mantissa); `precise` moves that partial sum into an f32 register at intervals along K, `fast` never
// does. When both operands hold integers (HLQ's 4-bit levels −7..7 in e4m3, products of at most 49) every product
// and every partial sum is an integer, and an accumulator of 14 significant bits holds every integer of magnitude
// below 2^14 exactly: while no partial sum of an output reaches 2^14, the fast product equals the exact sum, and
// so the precise product, bit for bit. A partial sum of row a and column b is at most ‖a‖·‖b‖ (Cauchy–Schwarz),
// and the products of gradient levels and weight levels have mixed signs, so their partial sums wander far less
// than that bound. tests/gpu/test_gpu_lowp_matmul.cpp walks partial sums up to 14700 (exact) and past 2^14;
// tests/gpu/test_gpu_grad_pipelines.cpp compares HLQ's g_x both ways at Llama-3-8B shapes (K = 4096 and 14336,
// Gaussian and with outlier channels): the same bits. Past 2^14 each product added loses the bits below the
// accumulator's 14th (less than 2^-13 of the partial sum each; measured there: 19552 for an exact 19658). HALO's
// fp8 operands are not integers, so its fast products differ from the precise ones; it defaults to fast on
// measured errors (Note [HALO's fp8 accumulation] in src/grad/pipeline_halo.cpp).
enum class Fp8Accumulation { precise, fast };

// a (..., M, K) f8e4m3 or f8e5m2, b (..., N, K) f8e4m3 or f8e5m2 (not both f8e5m2: cuBLASLt has no such
// kernel); batch dims as for int8_matmul_nt. scale_a, scale_b: one-element f32 tensors on the device of a
// and b (on CUDA they are read by the GPU when the product runs, never by the host). Returns
// (..., M, N) of out_dtype (f32 or bf16) = scale_a · scale_b · (a · bᵀ): fp32 accumulation on CUDA
// (exact fp8 products; `accumulation` above), double on the CPU; one rounding at the end (CPU: to f32, then to
// out_dtype).
Tensor fp8_matmul_nt(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b, DType out_dtype,
                     Fp8Accumulation accumulation = Fp8Accumulation::precise);

// 2-D a (M, K), b (N, K) fp8 as above, with outer-vector scales: row_scale (M) and col_scale (N) f32 tensors on
// the device of a and b. Returns (M, N) of out_dtype = row_scale[i] · col_scale[j] · (a · bᵀ)[i][j] with one
// rounding. On CUDA the scales go into cuBLASLt's product (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) when it
// can take them in place (16-byte alignment of K, N and the pointers, an algorithm for the shape); otherwise
// the unscaled f32 product is scaled by the outer product of the vectors and rounded (the same values; slower).
// The CPU computes fp32(row · col · acc) in double and rounds once to f32, then to out_dtype. `accumulation` as
// for fp8_matmul_nt.
Tensor fp8_matmul_nt_outer(const Tensor& a, const Tensor& b, const Tensor& row_scale, const Tensor& col_scale,
                           DType out_dtype, Fp8Accumulation accumulation = Fp8Accumulation::precise);

}  // namespace ht
