// Launchers of the quantisation kernels of the gradient pipelines (include/hadatrain/grad/quant.h,
// docs/gradient_pipelines.md, "Quantisation primitives"): blockwise Hadamard rotation (T <= 16 in registers,
// larger blocks by extra in-place stages), symmetric b-bit quantisation with absmax / SAWB scales and nearest /
// stochastic rounding, LUQ, and int4 packing. Inputs are dense, row-major, f32 / bf16 / f16 (the glue converts other
// dtypes to f32 first, exactly as the CPU reference does). Every result equals the CPU reference bit for bit
// (Note [Bit-identical quantisation]): fp32 math with explicit _rn intrinsics, SAWB sums in double.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

enum class QuantKind : uint8_t {
  uniform,  // symmetric levels −qmax..qmax, int8 values, scale m / qmax
  luq,      // levels 0, ±2^0..±2^top as e4m3 codes, scale α = m / 2^top
};

// What the uniform quantiser stores: codes (int8 levels, or e4m3 codes with fp8_values), or the dequantised
// values convert(float(level) · scale) in f32 / bf16 / f16 (Note [Bit-identical quantisation] step 4).
enum class QuantStore : uint8_t { codes, f32, bf16, f16 };

// Groups of `group_len` consecutive elements share one scale. The launcher picks a fused kernel (a team of
// threads per group, several groups per block: load, rotate, reduce, quantise, store; x read once) when a
// group is at most 16384 elements and there are enough groups to fill the GPU, else a partial-reduction
// kernel, a per-group finalisation kernel that writes the group's m and scale to device memory, and a
// quantisation kernel. No host synchronisation. Stochastic rounding of `uniform` draws 16 bits per element
// (Note [SR noise layout], include/hadatrain/grad/sr_noise.h); LUQ 32 bits (philox_word). Every kernel that
// stores levels is templated on what it stores (codes, or dequantised f32 / bf16 / f16 values), so each
// output compiles to its own kernels and the int8 / e4m3 ones carry no code of the dequantised ones.
struct GradQuantArgs {
  DType dtype = DType::f32;  // of x: f32, bf16 or f16
  const void* x = nullptr;   // (numel) dense
  int64_t numel = 0;
  int64_t group_len = 0;     // >= 1; divides numel; hadamard divides it
  int hadamard = 1;          // T in {1, 2, 4, 8, 16} (blocks aligned to multiples of T in the flat index)
  QuantKind kind = QuantKind::uniform;
  int qmax = 7;              // uniform: 2^(bits−1) − 1; luq: the top exponent (bits 4: 7)
  bool sawb = false;         // uniform only: SAWB scale (else absmax)
  bool stochastic = true;    // uniform only (LUQ is always stochastic)
  uint64_t seed = 0, stream = 0;  // Philox noise key; element i draws philox_word(seed, stream, i)
  // Optional (grad::Noise::step_word): device int64 added to `stream` when the kernel runs, so that a recorded
  // step graph draws each replay's step (Note [Step graphs]).
  const int64_t* stream_add = nullptr;
  bool fp8_values = false;        // uniform only: e4m3 codes of the levels instead of int8 (qmax <= 15)
  // uniform, one group (group_len == numel), hadamard 1, cols % 8 == 0 only: values stored transposed, as
  // (cols, numel / cols) for x seen as (numel / cols, cols) (QuantSpec's ValuesLayout::transposed). Runs the
  // two-pass path with a tiled quantise-and-transpose kernel.
  bool transposed = false;
  // Uniform kind, natural layout only: what `values` holds. Here it fills padding: the struct stays 128 bytes
  // and the other fields keep their offsets, so the code-storing kernels compile as before.
  QuantStore store = QuantStore::codes;
  int64_t cols = 0;
  // Optional: max |x| of the (unrotated) input is folded into *input_absmax with atomicMax on the f32 bits
  // (the caller zeroes it; NaN never wins). Computed by the kernel that first reads x (fused or partial);
  // the input must not be pre-rotated (the glue computes it separately then, launch_absmax).
  float* input_absmax = nullptr;
  // Optional (one group, uniform, absmax rule): m is read from device memory; the statistics pass is skipped.
  const float* known_m = nullptr;
  uint8_t* values = nullptr;      // (numel) int8 levels (uniform) or e4m3 codes (luq, or fp8_values); or, with
                                  // `store`, dequantised values (f32 / bf16 / f16 elements)
  float* scale = nullptr;         // (numel / group_len)
  void* workspace = nullptr;      // grad_quant_workspace_bytes(args) bytes of device memory (may be 0)
};

// Whether a launch with these arguments (x, values, cols set) can sum the columns of x in its pass
// (launch_grad_quant's column_sums): a transposed launch served by the strip kernel. Otherwise the caller sums them
// separately.
bool grad_quant_sums_in_pass(const GradQuantArgs& args);

// Device scratch the launch needs for these arguments (0 on the fused path); with_sums: for a launch given
// column_sums (the strip kernel's per-strip partial sums).
std::size_t grad_quant_workspace_bytes(const GradQuantArgs& args, bool with_sums = false);
// column_sums: optional, for launches grad_quant_sums_in_pass accepts: (cols) f32, the sums of x seen as
// (numel / cols, cols) over its rows, taken in the quantisation pass (the bias gradient of a g_y quantised
// unrotated; Note [Column sums in the g̃ pass] in docs/gradient_pipelines.md). The workspace must then be sized
// with with_sums. (Not a field of GradQuantArgs: the kernels' parameter block stays 128 bytes.)
void launch_grad_quant(const GradQuantArgs& args, cudaStream_t stream, float* column_sums = nullptr);

// The quantisation of x = Wᵀ (numel = R·C elements, (C, R)) where args.x points to W, a dense (R, C) matrix, read
// without a transposed copy (Note [Quantiser of a transposed input] in cuda/kernels/grad_quant_items.cu): the
// uniform kind into codes in x's natural layout, one group, T = 16, no known m, no input maximum, no column sums,
// bf16 / f16, R % 16 == 0, C % 8 == 0, x and values 16-byte aligned. grad_quant_of_transpose_applies says whether
// these hold; the workspace is grad_quant_of_transpose_workspace_bytes(R, C) bytes.
bool grad_quant_of_transpose_applies(const GradQuantArgs& args, int64_t R, int64_t C);
std::size_t grad_quant_of_transpose_workspace_bytes(int64_t R, int64_t C);
void launch_grad_quant_of_transpose(const GradQuantArgs& args, int64_t R, int64_t C, cudaStream_t stream);
// Launches of that path in this process (the GPU tests read it to see which path ran).
int64_t grad_quant_of_transpose_launches();

// *out = max(*out, max |x|) over x (numel, dtype f32 / bf16 / f16, dense) by atomicMax on the f32 bits (NaN
// never wins); *out must hold a non-negative value (e.g. 0) before.
void launch_absmax(DType dtype, float* out, const void* x, int64_t numel, cudaStream_t stream);

// out (numel, f32) = x (numel, dtype f32 / bf16 / f16, dense) times blockwise H_block along runs of `block`
// consecutive elements (block a power of two; blocks start at multiples of block). Stages h = 1..8 run in
// registers, h >= 16 as in-place passes over out.
void launch_hadamard_blocks(DType dtype, float* out, const void* x, int64_t numel, int64_t block,
                            cudaStream_t stream);

// out[k] = (in[2k] & 0xF) | (in[2k+1] << 4) for k < numel / 2 (numel even; values in −8..7 by precondition).
void launch_pack_int4(uint8_t* out, const int8_t* in, int64_t numel, cudaStream_t stream);
// out[2k], out[2k+1] = sign-extended low and high nibbles of in[k].
void launch_unpack_int4(int8_t* out, const uint8_t* in, int64_t numel, cudaStream_t stream);

}  // namespace ht::kernels
