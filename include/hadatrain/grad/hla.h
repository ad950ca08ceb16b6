// HLA, the Hadamard low-rank approximation of the g_w path (docs/gradient_pipelines.md; specification
// hlq.md §4): a per-sample projection of the token/pixel axis onto the lowest-sequency Walsh–Hadamard
// rows, block by block. Tensor level, not differentiable, CPU reference and CUDA, bit-identical.
//
// Note [HLA projection]
// x (B, L, C) is cut along L into L/n blocks of n consecutive positions (n a power of two dividing L).
// Each block, per channel, is transformed with the unnormalised Sylvester H_n by the butterfly of
// Note [Bit-identical quantisation] (f32, stages h = 1, 2, ..., n/2), giving natural-order coefficients
// c[k] = Σ_t H_n[k][t]·x[t]. Sequency row j of the Walsh matrix S_n is natural row bitrev_m(j XOR (j >> 1))
// (n = 2^m). The plan lists the kept sequency rows (ascending) as natural indices; the projection writes,
// for block p and kept row i, out row p·r + i = c[plan.rows[i]]. Because P_r = kept rows of S_n satisfies
// P_r·P_rᵀ = n·I, Π = P_rᵀP_r / n is an orthogonal projector, and
//   g_w ≈ (1/n) Σ_b project(g_y)[b]ᵀ · project(x)[b].
// All n rows kept gives exactly g_yᵀx (up to f32 rounding).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/ops/unfold.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::grad {

// How many rows per block to keep.
struct HlaRank {
  enum class Kind { percentile, full, rows };
  Kind kind = Kind::percentile;
  double pct = 50.0;  // percentile rule of the reference (hlq.md §4.4); 0 < pct <= 50
  int64_t rows = 0;   // Kind::rows: the r lowest rows of the 2-D triangle order (u+v, then u), r <= s²

  static HlaRank of_pct(double p) { return {Kind::percentile, p, 0}; }
  static HlaRank all() { return {Kind::full, 50.0, 0}; }
  static HlaRank of_rows(int64_t r) { return {Kind::rows, 50.0, r}; }
};

struct HlaPlan {
  int64_t length = 0;          // L
  int64_t block = 1;           // n (1: identity, nothing compressed)
  std::vector<int32_t> rows;   // r kept natural Hadamard indices in ascending sequency order
  int64_t kept() const { return static_cast<int64_t>(rows.size()); }       // r
  int64_t projected_length() const { return length / block * kept(); }     // R = (L/n)·r
  std::string describe() const;  // e.g. "L 1024: n 1024, r 528 (51.6 %)"
};

// The largest power of two dividing L (no cap).
int64_t hla_block_for(int64_t length);
// The plan for L positions (hlq.md §4.2–4.6). Throws for pct outside (0, 50] (reference bug #3) or rows
// outside 1..s². n == 1 gives the identity plan (r = 1).
HlaPlan hla_plan(int64_t length, const HlaRank& rank);
// The kept sequency indices (not natural indices) of the percentile rule, for tests against hlq.md's table.
std::vector<int32_t> hla_sequency_rows(int64_t block, const HlaRank& rank);

// Output layout of hla_project: rows (B, R, C) or channels (B, C, R) (R contiguous, the K-major operand
// the int8 / fp8 GEMMs want).
enum class HlaLayout { rows, channels };

// x (B, L, C) any floating dtype and strides, L == plan.length -> f32 projection (Note [HLA projection]).
// absmax: when not null, receives max |projection| (f32 (1) on x's device; fmax semantics, NaN never wins),
// computed while the projection is written (CUDA: one atomicMax per warp), so that a tensor-absmax
// quantisation of the projection (QuantSpec::known_absmax) needs no statistics pass.
Tensor hla_project(const Tensor& x, const HlaPlan& plan, HlaLayout layout = HlaLayout::rows,
                   Tensor* absmax = nullptr);

// hla_project(unfold2d(image, window), plan, layout, absmax) without materialising the columns: image
// (N, C, H, W) any floating dtype and strides (e.g. the permuted view of a channels-last map), plan for
// L = OH·OW. Bit-identical to the composition on both backends (the CPU runs the composition; CUDA reads the
// image through the im2col index map of include/hadatrain/ops/unfold.h). What HLQ's ACBP of a Conv2d uses.
Tensor hla_project_unfolded(const Tensor& image, const Unfold2dParams& window, const HlaPlan& plan,
                            HlaLayout layout = HlaLayout::rows, Tensor* absmax = nullptr);

// Note [HLA back-projection]
// The adjoint of hla_project (rows layout): g (B, R, C) any floating dtype and strides, R = (L/n)·r for the plan
// -> (B, L, C) in out_dtype with, per sample, block p and channel c,
//   out[p·n + t] = mult · Σ_i H_n[plan.rows[i]][t] · g[p·r + i],
// i.e. P_rᵀ·g: the kept coefficients scattered to their natural indices (zeros elsewhere) and transformed with
// the same butterfly as the projection (H_n is symmetric), in f32, then one f32 product by mult and one rounding
// to out_dtype. back_project(project(x)) · (1/n) = Π·x, the projector of Note [HLA projection]. HLQ's conv_gw
// wgrad_simulated uses it for Σ_b project(g_y)[b]ᵀ·project(cols)[b] / n = Σ_b (Π·g_y[b])ᵀ·cols[b], a convolution
// backward (Note [HLQ conv g_w] in src/grad/pipeline_hlq.cpp). Bit-identical on both backends.
Tensor hla_back_project(const Tensor& g, const HlaPlan& plan, double mult, DType out_dtype);

}  // namespace ht::grad
