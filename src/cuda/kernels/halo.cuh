// Launchers of HALO's row kernels (CPU reference and contract: src/grad/halo_quant.cpp, Note [HALO rotations] and
// Note [HALO quantiser] in include/hadatrain/grad/pipeline_halo.h). One CTA per row at a time (grid-stride over
// rows): the row, zero-padded to the rotation size n, is loaded into shared memory as f32 (n <= 32768: up to
// 128 KiB, opted in once per kernel), the butterfly stages run with __fadd_rn / __fsub_rn (the first eight
// in registers and warp shuffles when the power-of-two runs allow), then each thread owns columns
// p < n/K for the K×K stage in registers. The quantiser is two launches over the rows: the absmax pass (rotation,
// max |v|, one atomicMax per CTA on the f32 bits of a zeroed device word) and the quantise pass (the same rotation
// again, then the codes); the scale never leaves the device. Rotations whose power-of-two part is at least 512 (every
// LLaMA width and token count of 512 and more) go to the kernels of cuda/kernels/halo_fast.cuh instead (Note [HALO
// fast rows]: 16-byte loads, 3 to 5 barriers a row, the next row prefetched), and rows of exactly 2048 ... 16384
// values (K = 1) from there to the square row kernels (halo_square.cuh), with the same results; the unrotated
// passes and the int32 epilogue move 16 bytes per thread and step, and the transposes (halo_transpose.cu) 16-byte
// vectors where the shapes allow (Note [HALO transposes]).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

inline constexpr int kHaloKernelMaxK = 60;

// H_K's sign bits by value (bit j of row i set: H_K[i][j] = −1); K = 1 has none.
struct HaloSigns {
  uint64_t row[kHaloKernelMaxK];
};

struct HaloRowsArgs {
  DType in_dtype;           // f32, bf16 or f16
  const void* x;            // (R, C) contiguous
  int64_t R = 0, C = 0;
  int64_t n = 0;            // rotation size K·2^j >= C; 0: no rotation (the row as it is, n = C)
  int k = 1;                // K: 1, 12, 20, 28, 36, 44 or 60
  bool inverse = false;     // v·H̃ᵀ instead of v·H̃
  bool square = true;       // the square row kernels may take the rows (HADATRAIN_HALO_SQUARE=0: never)
};

// out (R, cols) of out_dtype (f32 or bf16) = first cols columns of mult·rotate(x row), rounded once.
void launch_halo_rotate(const HaloRowsArgs& a, const HaloSigns& signs, void* out, DType out_dtype, int64_t cols,
                        float mult, cudaStream_t stream);

// codes (R, n) of code_dtype (i8: qmax 127, f8e4m3: 448) and *scale = m / qmax (0 when m = 0), with m = max |v|
// over every rotated value, kept in *absmax (a device f32 the launcher zeroes first).
void launch_halo_quantize(const HaloRowsArgs& a, const HaloSigns& signs, void* codes, DType code_dtype, float* absmax,
                          float* scale, cudaStream_t stream);

// The two passes of launch_halo_quantize apart (HQ-FSDP's weight all-gather takes the max over ranks between
// them, dist/comm_quant.h): *absmax = max |v| over every rotated value (zeroed first), and the codes and *scale
// of the quantise pass for the m = *absmax given (m may exceed the rows' own max: values then use fewer levels).
void launch_halo_absmax(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, cudaStream_t stream);
void launch_halo_quantize_given(const HaloRowsArgs& a, const HaloSigns& signs, void* codes, DType code_dtype,
                                const float* absmax, float* scale, cudaStream_t stream);

// launch_halo_quantize of the rows rotated (a.n > 0: codes (R, n), *scale) and unrotated (codes_plain (R, C),
// *scale_plain) together; absmax: two device f32 words (rotated, unrotated), zeroed here. Rotations the fast kernels
// take run both in one absmax and one quantise pass (Note [HALO paired quantiser] in halo_fast.cu).
void launch_halo_quantize_pair(const HaloRowsArgs& a, const HaloSigns& signs, void* codes, void* codes_plain,
                               DType code_dtype, float* absmax, float* scale, float* scale_plain, cudaStream_t stream);

// launch_halo_quantize of the unrotated rows (a.n is ignored) with the codes in both layouts: codes (R, C) and
// codes_t (C, R), in one quantise pass after the absmax pass where R and C are multiples of 16 and x, codes and
// codes_t 16-byte aligned (Note [HALO transposed codes] in halo_transpose.cu), else the quantise pass and
// launch_halo_transpose. *absmax: a device word, zeroed here.
void launch_halo_quantize_transposed(const HaloRowsArgs& a, void* codes, void* codes_t, DType code_dtype,
                                     float* absmax, float* scale, cudaStream_t stream);

// out (count) of out_dtype (f32 or bf16) = float(acc[i]) · ((*s_a · *s_b) · mult), each an f32 round-to-nearest.
void launch_halo_scale_i32(const int32_t* acc, int64_t count, const float* s_a, const float* s_b, float mult,
                           void* out, DType out_dtype, cudaStream_t stream);

// Launches of the square row kernels (cuda/kernels/halo_square.cuh) in this process (the GPU tests read it to see
// that rows of 2048 ... 16384 values went through them).
int64_t halo_square_launches();

// out (C, R) = x (R, C)ᵀ for elements of elem_bytes 1 or 2 (codes, bf16 / f16), both contiguous: tiles through
// shared memory, coalesced reads and writes (Note [HALO transposes] in halo_transpose.cu).
void launch_halo_transpose(const void* x, int64_t R, int64_t C, int elem_bytes, void* out, cudaStream_t stream);

}  // namespace ht::kernels
