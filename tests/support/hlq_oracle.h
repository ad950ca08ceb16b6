// An f64 oracle for HLQ's quantised backward products (specification hlq.md §3, §4), shared by the CPU and CUDA
// oracle tests (tests/cpu/test_hlq_oracle.cpp, tests/gpu/test_gpu_hlq_oracle.cpp).
//
// The oracle asks the quantiser (grad::quantize, on the CPU) for the codes and scales of HLQ's four operands, with
// the specs and noise keys the pipeline uses: the 4-bit Hadamard-rotated g_y and W of the g_x product, HLA's
// projected 8-bit g̃ and x̃ of the g_w product. It then checks those codes and scales against the data, computed
// independently in f64 (explicit ±1 Hadamard and Walsh rows, absmax or SAWB from the definition, the code within
// the rounding interval of value / scale), and from them alone rebuilds
//   g_x[r, i] = s_g[group(r)] · (s_w / T) · Σ_o q_g[r, o] · q_w[i, o]
//   g_w[o, i] = (1 / n) · Σ_b s_g̃[b] · s_x̃[b] · Σ_R q_g̃[b, R, o] · q_x̃[b, R, i]      (one scale each per tensor or
//                                                                                  per sample)
// in f64. A scale that is wrong in the quantiser fails the data checks; one that is wrong in a pipeline's product
// or epilogue (both backends alike) fails the comparison with these sums.
#pragma once
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::test {

// The noise roles of HLQ's quantised operands (philox_stream's purpose field, src/grad/pipeline_helpers.h); the oracle
// draws the same stochastic rounding as the pipeline through them.
inline constexpr uint32_t kRoleGxGy = 1, kRoleGxW = 2, kRoleGwGy = 3;

// How the g_w product uses x̃: the 8-bit codes (the specification, a Linear, a conv's columns form) or the
// unquantised projection (a conv's conv_gw wgrad_simulated, Note [HLQ conv g_w] in src/grad/pipeline_hlq.cpp).
enum class OracleX { codes, exact };

struct HlqOracle {
  Tensor g_x;        // (B, L, I) f64
  Tensor g_x_bound;  // (B, L, I) f64: the same sum over |terms|, the scale of a rounding error
  Tensor g_w;        // (O, I) f64 (undefined when gw_bits is 0)
  Tensor g_w_bound;  // (O, I) f64
  // Violations of the quantiser checks (scale against the data, code outside its rounding interval), at most a
  // few per operand; empty when the codes and scales are right.
  std::vector<std::string> problems;
  // The oracle against the unquantised products it estimates (relative error, f64): g_x against g_y·W, g_w
  // against the projected (1/n)·Σ_b g̃[b]ᵀ·x̃[b] (the same projection, no quantisation).
  double gx_error = 0, gw_error = 0;
};

// x (B, L, I) (a Linear's input or a conv's im2col columns), w (O, I), g_y (B, L, O): CPU tensors of one floating
// dtype. `o`: the pipeline's options (gx_bits > 0; the identity, pad or split fallbacks are not modelled: L must
// have a power-of-two factor > 1 or the fallback must be ref). `key`: the NoiseKey the pipeline's forward got.
HlqOracle hlq_oracle(const Tensor& x, const Tensor& w, const Tensor& g_y, const grad::HlqOptions& o,
                     const grad::NoiseKey& key, OracleX x_form = OracleX::codes);

// Empty when |got − ref| <= rel · bound element by element (got on any device, any floating dtype; ref and bound
// f64 of the same shape), else the first mismatches with their ratio |got − ref| / bound.
std::string within_bound(const Tensor& got, const Tensor& ref, const Tensor& bound, double rel);

// ---- the cases both oracle tests run ----

struct OracleCase {
  std::string name;
  grad::HlqOptions options;
  int64_t B = 2, L = 64, I = 32, O = 48;  // a Linear (B, L, I) -> (B, L, O)
  // A Conv2d instead (conv_channels > 0): image (B, conv_channels, side, side), 3×3 window, padding 1, so
  // L = side², I = conv_channels·9.
  int64_t conv_channels = 0, side = 0;
  // Largest |got − oracle| / bound allowed for g_x and g_w (bound: the oracle's sum over |terms|): a few f32
  // roundings where the product of the codes is exact; more where the pipeline rounds scaled codes first.
  double rel_x = 1e-6, rel_w = 1e-6;
};
std::vector<OracleCase> hlq_oracle_cases();

// One case run through grad::make_pipeline on `device`: each string is empty when that check holds.
struct OracleRun {
  std::string quantiser;    // the codes and scales against the data (hlq_oracle's problems)
  std::string g_x, g_w;     // the pipeline's gradients against the oracle
  std::string sensitivity;  // the same comparisons against the oracle with its scale off by 2^-6 must fail
  double gx_error = 0, gw_error = 0;  // HlqOracle::gx_error, gw_error
};
OracleRun run_oracle_case(const OracleCase& c, Device device);

}  // namespace ht::test
