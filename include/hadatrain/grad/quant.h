// Quantisation primitives of the gradient pipelines (docs/gradient_pipelines.md): block Hadamard
// rotation, symmetric b-bit quantisation (absmax or SAWB scale; nearest or stochastic rounding from
// Philox), LUQ (logarithmic unbiased 4-bit) and packed int4 storage. Tensor level, not differentiable,
// CPU reference and CUDA. For the same inputs and noise key the CPU and CUDA paths produce bit-identical
// quantised values and scales (Note [Bit-identical quantisation]).
//
// Note [Bit-identical quantisation]
// Every step is defined as a fixed sequence of IEEE fp32 operations with round-to-nearest, no FMA
// contraction, so both backends compute the same bits:
//  1. Inputs of any floating dtype are converted to f32 first (exact for bf16/f16/fp8).
//  2. Rotation (hadamard_block T > 1): each run of T consecutive values along the last dim is multiplied
//     by the unnormalised Sylvester H_T with the butterfly: for h = 1, 2, 4, ..., T/2 (in this order), for
//     every pair (j, j + h) with (j / h) even: (a, b) <- (a + b, a - b). The result is x·H_T (H_T symmetric).
//  3. Scale value m per group (Granularity): absmax: m = max |x| (exact in any order). SAWB: with sums
//     S1 = Σ|x| and S2 = Σx² accumulated in double and n the group size,
//     α = 12.1·sqrt(S2/n) − 12.2·(S1/n) in double, m = float(α); if m is not finite or m <= 0, absmax.
//     (Double sums can differ in the last bits between summation orders; the f32 rounding of α hides that
//     except in astronomically rare ties.)
//  4. If m == 0 (or the group is empty): all values 0, scale 0. Else, once per group, s = m / qmax and
//     r = qmax / m (two f32 divisions); per element v = min(max(x, −m), m) · r (f32 multiply, no division),
//     a = |v|, f = floor(a), frac = a − f.
//     nearest: q = rint(a) (ties to even). stochastic: u = the 16-bit uniform of element i (Note [SR noise
//     layout] in sr_noise.h: u = (2h + 1)·2^−17, eight elements per Philox block), i the row-major index of
//     the element in the (rotated) input, q = f + (u < frac).
//     Then q = min(q, qmax), value = sign(v)·q as int8 (or its e4m3 code: values_dtype f8e4m3, bits <= 5).
//     E[q·s] = clamp(x, −m, m) for stochastic rounding up to 2^−17 of a step (16-bit u) and the f32
//     rounding of r·s ≈ 1 (relative 2^−23).
//     Dequantised values (values_dtype bf16 / f16 / f32): the element is d = convert(float(l) · s), l the
//     signed integer level above (+0 for level 0, never −0) and s the group's scale: one f32 product
//     (float(l) is exact, so this is the only f32 rounding; __fmul_rn on CUDA, no contraction), then one
//     round-to-nearest-even conversion to the target dtype (Note [Narrow-float conversion]; none for f32).
//     A NaN product (an input with an infinite element gives s = inf, and inf · 0 for its level-0
//     elements) is stored as the quiet NaN 0x7FC00000 (bf16 0x7FC0, f16 0x7E00) on both backends. The same
//     levels, noise and scales as the int8 output, just stored differently.
//  5. LUQ (luq_quantize): see the function comment; exponents are taken from the f32 bit pattern (frexp
//     semantics), never from log2f.
#pragma once
#include <cstdint>

#include "hadatrain/tensor/tensor.h"

namespace ht::grad {

// Where stochastic rounding draws its bits: element i of a quantised tensor uses
// philox_word(seed, stream, i) (Note [Philox stream layout]); `stream` is usually
// philox_stream(layer, step, role) (Noise roles are chosen by the pipelines).
struct Noise {
  uint64_t seed = 0;
  uint64_t stream = 0;
  // CUDA only, optional: a device int64 holding the step field of the stream ((step mod 2^40) << 8, see
  // philox_stream), added to `stream` when the kernel runs. A recorded step graph then draws the noise of
  // the step it replays (Note [Step graphs]); `stream` carries the step-0 stream. Never set on the CPU.
  const int64_t* step_word = nullptr;
};

// Which elements share one scale. tensor: all; sample: each index of dim 0; row: each index of all dims
// but the last (one scale per row of the last dim, "per token").
enum class Granularity { tensor, sample, row };
// Pipeline options shared by hlq and luq: the scale granularity of an operand (token: one scale per row), and
// the 4-bit weight quantiser (SAWB or absmax scale, round to nearest; absmax_sr: absmax with stochastic rounding).
enum class ScaleGranularity { tensor, sample, token };
enum class WeightQuant { sawb, absmax, absmax_sr };
enum class ScaleRule { absmax, sawb };
enum class Rounding { nearest, stochastic };
// Where the values go. natural: the input's shape. transposed: the input seen as (N, C) (C = its last dim,
// N = numel / C) is stored as values (C, N) contiguous — the K-major operand of a product that contracts
// over N (HLA's g_w = g̃ᵀ·x̃), written by the quantiser instead of a separate transpose. Tensor granularity
// and hadamard_block 1 only. The noise index of an element stays its row-major index in the input.
enum class ValuesLayout { natural, transposed };

struct QuantSpec {
  int bits = 4;                 // symmetric levels −qmax..qmax, qmax = 2^(bits−1) − 1; 2 <= bits <= 8
  Granularity granularity = Granularity::tensor;
  ScaleRule scale_rule = ScaleRule::absmax;
  Rounding rounding = Rounding::stochastic;
  Noise noise;                  // used when rounding == stochastic
  int64_t hadamard_block = 1;   // T: 1 (no rotation) or a power of two dividing the last dim
  // i8, or f8e4m3 (bits <= 5: every level −15..15 is exact in e4m3) to feed fp8 tensor cores directly;
  // a level of 0 is +0. Or bf16 / f16 / f32: the dequantised values level · scale rounded once to that dtype
  // (Note [Bit-identical quantisation] step 4), the operand of a compute-dtype product (HLQ's simulated cuDNN
  // dgrad over the dequantised g_y) written in the quantiser's one pass instead of quantize + dequantize + a
  // conversion.
  // Natural layout only; any bits, granularity, scale rule, rounding and hadamard_block.
  DType values_dtype = DType::i8;
  ValuesLayout layout = ValuesLayout::natural;
  // Also return max |x| of the input before any rotation (Quantized::input_absmax, f32 (1), fmax semantics:
  // NaN never wins), computed in the same pass over x on CUDA. Lets a second quantisation of the same x
  // (HLA's g_y, tensor absmax scale) skip its statistics pass through known_absmax.
  bool report_input_absmax = false;
  // Tensor granularity with the absmax rule only: a one-element f32 tensor on x's device that holds m = max |x|
  // (e.g. input_absmax of an earlier quantisation of the same x). The scale pass is skipped and m is used as
  // given; with any other value the result is that of quantising with m.
  Tensor known_absmax;
  // Also return the sums of x over every dim but the last (Quantized::column_sums, (C) for C = the last dim): the
  // bias gradient of a product whose g_y this quantises unrotated (HLQ's g̃ of the identity HLA plan), taken in the
  // quantiser's pass over x where the CUDA transposed strip kernel runs (Note [Column sums in the g̃ pass] in
  // docs/gradient_pipelines.md). Not a quantised quantity: the backends agree to f32 summation order, not bit for bit.
  bool report_column_sums = false;
};

inline int qmax_of(int bits) { return (1 << (bits - 1)) - 1; }

struct Quantized {
  Tensor values;  // int8 (or e4m3, QuantSpec::values_dtype), the input's shape (or (C, N): ValuesLayout),
                  // contiguous, |value| <= qmax; or, for values_dtype bf16 / f16 / f32, the dequantised
                  // values level · scale in that dtype (the input's shape, contiguous)
  Tensor scale;   // f32, contiguous: (1) for tensor, (x.size(0)) for sample, (numel / last dim) for row;
                  // dequantised element = value · scale of its group (rotated domain when T > 1); returned
                  // for dequantised values too
  Tensor input_absmax;  // f32 (1): max |x| before rotation, when QuantSpec::report_input_absmax
  // (C), when QuantSpec::report_column_sums: Σ of x over every dim but the last. f32 from the CUDA strip kernel
  // (f32 sums: four rows per lane, a warp's 32 lanes by butterfly, then the 128-row strips in order); otherwise
  // sum(x, every dim but the last) in its result dtype (the CPU, and CUDA launches the strip kernel does not serve).
  Tensor column_sums;
};

// Rotates (optionally), picks the scale and quantises in one call (one fused pass per group on CUDA
// where the group fits, else a reduction pass then a quantisation pass). x: any floating dtype, >= 1 dim,
// any strides. Throws naming the shape when T does not divide the last dim or bits is out of range.
Quantized quantize(const Tensor& x, const QuantSpec& spec);

// x rotated by blockwise H_T along the last dim, as f32 (Note [Bit-identical quantisation] step 2).
// For tests and fake-quantisation; quantize() fuses it.
Tensor hadamard_blocks(const Tensor& x, int64_t block);

// values (int8 or e4m3 levels) · scale broadcast per group, as f32 (inverse of quantize without the
// rotation). Throws for values that quantize already dequantised (values_dtype bf16 / f16 / f32).
Tensor dequantize(const Quantized& q, Granularity granularity);

// LUQ, logarithmic unbiased quantisation (Chmiel et al. 2023) with `bits` (default 4): per group,
// m = max |x|, α = m / 2^(2^(bits−1)−1) (bits 4: m/128); a = |x| / α (f32).
//   a < 1 (stochastic underflow): q = 1 with probability a (u < a), else 0.
//   a >= 1: e = exponent with 2^e <= a < 2^(e+1) (from the f32 bits), p = a / 2^e − 1 (exact),
//           q = 2^(e+1) if u < p else 2^e; q = min(q, 2^(2^(bits−1)−1)).
//   value = sign(x)·q; E[value·α] = x. m == 0 gives zeros and α = 0. u = uniform_from_word(philox_word(noise.seed,
//   noise.stream, i)) for element i: a 32-bit draw per element, not quantize()'s 16-bit layout (sr_noise.h).
// values are returned as f8e4m3 (every ±2^k, k <= 7, and 0 are exact there), scale (α) f32 as for quantize.
struct LuqSpec {
  int bits = 4;  // 2..4 (2^(2^(bits−1)−1) must fit e4m3 exactly)
  Granularity granularity = Granularity::sample;
  Noise noise;
};
Quantized luq_quantize(const Tensor& x, const LuqSpec& spec);

// Packed int4 storage (DType::i4x2): element 2k in the low nibble, 2k+1 in the high nibble, two's
// complement. pack_int4 takes int8 values in −8..7 (throws naming the first bad value on CPU; on CUDA
// out-of-range values are a documented precondition) with an even last dim; unpack_int4 inverts it.
Tensor pack_int4(const Tensor& values);
Tensor unpack_int4(const Tensor& packed);

}  // namespace ht::grad
