// The `halo` gradient pipeline (HALO, Ashkboos et al. 2025; specification reference/halo.md, docs in
// docs/gradient_pipelines.md): all three products of a Linear — the forward y = x·Wᵀ, g_x = g_y·W and
// g_w = g_yᵀ·x — run on 8-bit operands (int8 or fp8 e4m3) with one absmax scale per tensor, after
// full-size Hadamard rotations that depend on the level:
//   level 0: no rotation;
//   level 1: x and W rotated on their `in` dimension (right Hadamard); the products' outputs rotated back;
//   level 2: level 1, plus g_y rotated on its token dimension (left Hadamard) for the g_x product.
// The forward saves the 8-bit rotated operands (no high-precision copy of x); backward reuses them.
// Round to nearest, no stochastic rounding (the specification has none), so the pipeline draws no noise.
//
// Note [HALO rotations]
// A rotation of size n = K·2^j (K = 1 or a Paley order in kHaloPaleyOrders) multiplies each row, zero-padded
// from its C <= n values to n, by the UNNORMALISED H̃_n = H_K ⊗ H_{2^j} (entries ±1; H̃·H̃ᵀ = n·I): the
// row is viewed as (K, 2^j) with the K index slowest. Fixed f32 operation order, identical on CPU and CUDA
// (no FMA: additions only):
//  1. on each run of 2^j values, the Sylvester butterfly of Note [Bit-identical quantisation] (grad/quant.h):
//     for h = 1, 2, ..., 2^(j−1), every pair (a, b) = (v[i], v[i+h]) with (i / h) even becomes (a + b, a − b);
//  2. for each p < 2^j, with u_k = v[k·2^j + p]: out_i = Σ_{k=0..K−1} ±u_k summed from 0.0f in k order, the
//     sign H_K[k][i] (forward, v·H̃) or H_K[i][k] (inverse, v·H̃ᵀ); for K = 28 and 36 (Paley II, symmetric) the
//     pair sums and differences first and K/2 terms an output (Note [HALO paired K×K stage] in
//     grad/halo_paley.h). Skipped when K = 1.
// NaN: a rotated value that is NaN is the canonical NaN 0x7FFFFFFF, whatever the NaN operands' signs. CUDA's f32
// additions return it for any NaN operand; x86 keeps an operand's sign (and makes 0xFFC00000 of Inf − Inf), so the
// CPU reference replaces its NaNs by it (and the quantiser's unrotated values', which CUDA multiplies by r). The
// sign matters: it is in a bf16 output's bits and an e4m3 code's (sign | 0x7F).
// halo_rotation_size(n) is the smallest such size >= n: a dimension of another size is zero-padded and its
// rotated-back result cropped (exact without quantisation; the reference rejects such sizes, §4 / §9).
// The 1/n that makes the rotations orthonormal is applied once per product, in its scale (HaloProduct::mult).
//
// Note [HALO quantiser]
// Per tensor: v = the rotated row values (f32, above) or x converted to f32; m = max |v| over the tensor.
// m == 0: every code 0 and scale 0. Else, with qmax = 127 (int8) or 448 (e4m3): s = m / qmax and
// r = qmax / m (two f32 divisions, once), and per element t = v·r (one f32 multiply):
//   int8: code = rint(min(max(t, −127), 127)) (ties to even); e4m3: code = RNE saturating cast of t.
// Decoded value code·s ≈ v. The CPU and CUDA paths give bit-identical codes and scales.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"  // Carrier, Fp8Accumulation

namespace ht::grad {

// ---- options -------------------------------------------------------------------------------------------

struct HaloOptions {
  int level = 2;                   // 0, 1 or 2 (above)
  Carrier carrier = Carrier::int8; // int8 or fp8 (e4m3 for every operand); the reference pairs level 2 with int8
  // false: the same rotations and dataflow with f32 operands and f32 products instead of 8-bit ones (tests of
  // the rotation algebra, and the rotation's own effect in inspect-grads)
  bool quantize = true;
  // On CUDA, g_w's GEMM and rotation back run on a side stream beside g_x's chain (Note [HALO's two chains] in
  // src/grad/pipeline_halo.cpp), and the forward's saved transposes beside its y GEMM (Note [HALO's saved
  // transposes]); the same values either way. Off: one stream.
  bool overlap = true;
  // fp8 carrier: how CUDA's products sum (ops/lowp_matmul.h, Fp8Accumulation). `fast` (the default) is the
  // reference's FP8 kernel's mode (halo.md §8, §10); `precise` promotes the partial sums to f32 along K. Note
  // [HALO's fp8 accumulation] in src/grad/pipeline_halo.cpp gives the figures the default rests on. The int8
  // carrier sums in int32 and ignores this field (a config that asks it for `fast` is an error).
  Fp8Accumulation fp8_accumulation = Fp8Accumulation::fast;
  // A weight that needs no gradient (LoRA's frozen base) is quantised once and its codes reused while its storage
  // and version are the same (Note [HALO's frozen weight codes] in src/grad/pipeline_halo.cpp); false quantises it
  // in every forward (no memory kept between steps).
  bool cache_frozen_weight = true;
};

// How many times a halo pipeline's forward reused a frozen weight's cached codes since the process started (tests).
int64_t frozen_weight_uses();

// A new halo pipeline for one layer.
std::shared_ptr<Pipeline> make_halo_pipeline(const HaloOptions& o);

// Phase marks (bench_halo's HT_BENCH_PHASES): when a hook is set, every halo pipeline calls it with the name of
// each phase of its forward and backward just before issuing that phase's work (e.g. "fwd Q(x·H)", "bwd g_w GEMM"),
// and with "end" after its last one, on the calling thread. The hook may record a CUDA event on the current stream;
// it must not synchronise while a step graph records. None by default; an empty function removes it. Not
// synchronised with concurrent pipelines: set it before and clear it after the calls it observes.
using HaloPhaseHook = std::function<void(const char* phase)>;
void set_halo_phase_hook(HaloPhaseHook hook);
// Calls the hook, if one is set, with `phase` (the pipeline and halo_product use it).
void halo_phase(const char* phase);
// True while a hook is set: the pipeline then queues all its work on one stream, so each phase is timed alone.
bool halo_phases_marked();

// ---- rotations (Note [HALO rotations]) -------------------------------------------------------------------

// The non-power-of-two factors K of a rotation size, each the order of a Paley Hadamard matrix (type I for
// q = 11, 19, 43, 59 prime ≡ 3 mod 4; type II for q = 13, 17 prime ≡ 1 mod 4).
inline constexpr std::array<int, 6> kHaloPaleyOrders = {12, 20, 28, 36, 44, 60};
inline constexpr int kHaloMaxK = 60;
inline constexpr int64_t kHaloMaxRotation = 32768;  // rows rotated in one CUDA block's shared memory

struct HaloRotation {
  int64_t n = 1;  // K·2^j
  int k = 1;      // K
};
// The smallest rotation size >= n (Note [HALO rotations]). Throws when it exceeds kHaloMaxRotation.
HaloRotation halo_rotation_size(int64_t n);
// H_K as K rows of K sign bits (bit j of row i set: H_K[i][j] = −1), K = 1 or one of kHaloPaleyOrders: the
// compile-time tables of grad/halo_paley.h, checked once to be Hadamard matrices.
std::vector<uint64_t> halo_hadamard_signs(int k);

enum class HaloDirection { forward, inverse };  // v·H̃ or v·H̃ᵀ
struct HaloRotate {
  HaloRotation rotation;
  HaloDirection direction = HaloDirection::forward;
  int64_t cols = 0;        // columns of the result kept (<= n): the first `cols`
  float mult = 1.0f;       // each result value is multiplied by mult (one f32 multiply) before its conversion
  DType out_dtype = DType::f32;
};
// x (R, C) of any floating dtype, C <= n: out (R, cols) of out_dtype = first cols columns of
// mult·(x zero-padded to n)·H̃ (or ·H̃ᵀ), rounded once to out_dtype. CPU and CUDA give the same bits.
Tensor halo_rotate(const Tensor& x, const HaloRotate& spec);

// x (R, C) -> (C, R) contiguous, bit for bit (a tiled transpose on CUDA for 1- and 2-byte dtypes: codes, bf16).
Tensor halo_transpose(const Tensor& x);

// ---- quantiser (Note [HALO quantiser]) -------------------------------------------------------------------

struct HaloQuantized {
  Tensor codes;  // (R, n) i8 or f8e4m3, contiguous (n = C without rotation)
  Tensor scale;  // f32 (1), on x's device
};
// x (R, C) of any floating dtype; rotation n = 1: none (codes (R, C)), else rotated at that size (C <= n).
HaloQuantized halo_quantize(const Tensor& x, Carrier carrier, HaloRotation rotation = {});
// {halo_quantize(x, carrier, rotation), halo_quantize(x, carrier)}: x's rows rotated and unrotated, the same codes
// and scales; on CUDA in one absmax and one quantise pass over x instead of two each where the rotation's
// power-of-two part is at least 512 (HALO-2's two quantisations of g_yᵀ; Note [HALO paired quantiser] in
// src/cuda/kernels/halo_fast.cu).
std::pair<HaloQuantized, HaloQuantized> halo_quantize_pair(const Tensor& x, Carrier carrier, HaloRotation rotation);
// {halo_quantize(x, carrier), its codes transposed (C, R) contiguous}: the unrotated quantiser with the codes in
// both layouts its two products read (levels 0 and 1 quantise g_y once for g_x = Q(g_y)·… and g_w = Q(g_y)ᵀ·…); on
// CUDA one quantise pass writes both where the shapes allow (Note [HALO transposed codes] in
// src/cuda/kernels/halo_transpose.cu), else the quantiser and halo_transpose. The same codes and scale bit for bit.
std::pair<HaloQuantized, Tensor> halo_quantize_transposed(const Tensor& x, Carrier carrier);
// halo_quantize in its two passes, for a scale shared beyond one tensor (HQ-FSDP's weight all-gather takes the max
// over ranks between them, dist/comm_quant.h): halo_absmax gives m = max |v| of x's rotated values (f32 (1) on x's
// device); halo_quantize_with_absmax the codes and scale for a given m (f32 (1) on x's device, never read by the
// host; m >= x's own max, else values beyond m saturate). halo_quantize(x) equals
// halo_quantize_with_absmax(x, …, halo_absmax(x, …)) bit for bit.
Tensor halo_absmax(const Tensor& x, HaloRotation rotation = {});
HaloQuantized halo_quantize_with_absmax(const Tensor& x, Carrier carrier, HaloRotation rotation, const Tensor& absmax);
// codes · scale as f32 (R, n): the values the products see (tests, inspect).
Tensor halo_dequantize(const HaloQuantized& q);

// ---- scaled 8-bit product -----------------------------------------------------------------------------

// out (M, N) of out_dtype = ((s_a·s_b)·mult) · (a · bᵀ) for codes a (M, K), b (N, K) of one dtype (i8 or
// f8e4m3), s_a, s_b one-element f32 tensors on their device (read by the GPU, never by the host). int8: the exact
// int32 product, then float(acc)·alpha rounded once (CPU and CUDA the same bits); fp8: cuBLASLt with device
// scales, fp32 accumulation between tensor-core groups that keep fewer bits within (CPU: exact, in double), one
// rounding; the two differ by up to K·2^-12 of Σ|a_k·b_k|·scale (Note [HALO fp8 product tolerance] in
// tests/gpu/test_gpu_halo.cpp derives it).
struct HaloProduct {
  float mult = 1.0f;
  DType out_dtype = DType::f32;
  Fp8Accumulation accumulation = Fp8Accumulation::precise;  // fp8 codes on CUDA (ops/lowp_matmul.h)
};
Tensor halo_product(const Tensor& a, const Tensor& b, const Tensor& s_a, const Tensor& s_b, const HaloProduct& p);

}  // namespace ht::grad
