// Launchers of the "row" kernels: softmax / log_softmax, cross-entropy (forward and fused backward),
// layer_norm / rms_norm forward, embedding gather and scatter-add, max / argmax. Every row kernel works on
// R contiguous rows of length L (the op files move the reduced dim last and make it dense first) with a
// warp per row for short rows (L <= 256) and a 256-thread block per row otherwise. Accumulation: float for
// f32/bf16/f16, double for f64 (S below is that type; statistics and losses are stored in it). Formulas are
// those of the CPU reference in src/ops/{softmax,cross_entropy,layer_norm,rms_norm,embedding,max}.cpp.
// Floating dtypes: f32 f64 bf16 f16. Max also takes i8 u8 i32 i64 (the op file handles fp8 and bool).
// Pointers without a dtype of their own: S is float (double for f64); ids and targets are int64.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"

namespace ht::kernels {

enum class SoftmaxKind : uint8_t { softmax, log_softmax };

// out (R, L) = softmax or log_softmax of in (R, L) along L.
void launch_softmax(DType dt, SoftmaxKind kind, void* out, const void* in, int64_t rows, int64_t len,
                    cudaStream_t stream);

// Backward along L: gx = y * (g - sum(g * y)) (softmax) or g - exp(y) * sum(g) (log_softmax), y the forward
// output; gx, g and y are (R, L) of dtype dt.
void launch_softmax_backward(DType dt, SoftmaxKind kind, void* gx, const void* g, const void* y, int64_t rows,
                             int64_t len, cudaStream_t stream);

// status (2 x uint64, zeroed by the caller) after a cross-entropy or embedding launch:
//   status[0]: number of counted rows (cross-entropy: targets not equal to ignore_index and in range);
//   status[1]: 0, or (n - first offending index) when some target / id was out of range.
struct CrossEntropyArgs {
  DType dtype;              // logits dtype
  const void* logits;       // (R, C)
  const int64_t* target;    // (R)
  int64_t rows, classes;
  int64_t ignore_index;
  double label_smoothing;
  void* lse;                // (R) S: log-sum-exp of each row
  void* loss;               // (R) S: per-row loss, 0 for ignored (and out-of-range) rows
  unsigned long long* status;
};
void launch_cross_entropy(const CrossEntropyArgs& args, cudaStream_t stream);

// g_logits = scale_i * (softmax - q) with q the (label-smoothed) target distribution; rows whose target is
// ignore_index get 0. scale_i = g[i * g_stride] * g_scale (g_stride 1: reduction none, 0: sum / mean).
struct CrossEntropyBackwardArgs {
  DType dtype;             // logits dtype (and g_logits dtype)
  void* g_logits;          // (R, C)
  const void* logits;      // (R, C)
  const int64_t* target;   // (R)
  const void* lse;         // (R) S
  const void* g;           // S: (R) or one element
  int64_t g_stride;
  double g_scale;
  int64_t rows, classes;
  int64_t ignore_index;
  double label_smoothing;
};
void launch_cross_entropy_backward(const CrossEntropyBackwardArgs& args, cudaStream_t stream);

enum class NormKind : uint8_t { layer, rms };
// y = (x - mean) * rstd * weight + bias (layer) or x * rstd * weight (rms) along rows of length D.
struct NormArgs {
  DType dtype;
  NormKind kind;
  void* out;            // (R, D)
  void* mean;           // (R) S, layer only (may be null for rms)
  void* rstd;           // (R) S
  const void* x;        // (R, D)
  const void* weight;   // (D) S (or dtype when weight_narrow) or null
  const void* bias;     // (D) S (or dtype when bias_narrow) or null
  int64_t rows, dim;
  double eps;
  bool weight_narrow = false, bias_narrow = false;  // the parameter is stored in dtype (bf16 / f16), not S
};
void launch_norm(const NormArgs& args, cudaStream_t stream);

// The layer_norm / rms_norm kernels (Note [Norm kernels] in rows_norm.cu): the staged kernels (cp.async
// pipeline; bf16 / f16 forward statistics in one shifted reduction) for packable rows of at most 256 x 4
// packs, with the forward's parameters in shared memory below 2048 elements a row and in registers from 2048
// up, and the backward's partial sums of the parameter gradients one row per block below 2048 and one row per
// thread block cluster from 2048 up; else the register-resident kernels, else the multi-pass kernels. Each is
// deterministic.
// Launches of the staged forward / backward kernels in this process (tests assert that packable rows take
// them rather than falling back).
struct NormStagedCounts {
  int64_t forward = 0, backward = 0;
};
NormStagedCounts norm_staged_counts();

// Backward of layer_norm / rms_norm, per row (xhat = (x - mean) * rstd, gh = g * weight, means over D):
//   gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))   (layer; rms drops the mean(gh) term)
struct NormBackwardArgs {
  DType dtype;           // x, g and gx dtype
  NormKind kind;
  void* gx;              // (R, D)
  const void* g;         // (R, D)
  const void* x;         // (R, D)
  const void* mean;      // (R) S, layer only
  const void* rstd;      // (R) S
  const void* weight;    // (D) S (or dtype when weight_narrow) or null
  int64_t rows, dim;
  // Optional, for the fused parameter gradients (see norm_backward_partials): (partials, D) S each, per-block
  // partial sums of g * xhat (weight) and g (bias), for the caller to add over dim 0.
  void* gw_partial = nullptr;
  void* gb_partial = nullptr;
  bool weight_narrow = false;  // the weight is stored in dtype (bf16 / f16), not S
  // gx holds a gradient to add to (a residual input's other branch): gx = result + gx, rounded once (Note
  // [Gradients accumulated in place] in autograd/node.h).
  bool accumulate = false;
};
void launch_norm_backward(const NormBackwardArgs& args, cudaStream_t stream);
// Rows of the parameter-gradient partial sums that launch_norm_backward writes alongside gx when args has
// gw_partial / gb_partial (the staged or the register-resident kernel: packable rows of at most 256 x 4 packs;
// one partial row per block, or per cluster), or 0 when it cannot for these args (then use
// launch_norm_param_grad). Pointers of args are only checked for alignment.
int norm_backward_partials(const NormBackwardArgs& args);

// Parameter gradients as a column reduction in two passes: this kernel writes per-split partial sums
// (splits, D) in S of g * xhat (weight) and g (bias) over `chunk` rows each; the caller adds the splits
// (a deterministic sum over dim 0). norm_param_splits gives the split count the launcher uses.
struct NormParamGradArgs {
  DType dtype;
  NormKind kind;
  void* gw_partial;      // (splits, D) S or null
  void* gb_partial;      // (splits, D) S or null
  const void* g;         // (R, D)
  const void* x;         // (R, D)
  const void* mean;      // (R) S, layer only
  const void* rstd;      // (R) S
  int64_t rows, dim;
};
int norm_param_splits(int64_t rows, int64_t dim);
void launch_norm_param_grad(const NormParamGradArgs& args, cudaStream_t stream);

// Second step of both forms: gw / gb (D) = the sums over the `parts` rows of the (parts, D) partial sums
// (S) that launch_norm_backward or launch_norm_param_grad wrote, added in row order (deterministic), each
// stored in its own dtype (norm_param_dtype_ok: f32 f64 bf16 f16; the parameter's dtype, so no conversion
// follows). One launch for both; a null partial or output skips that gradient.
struct NormParamFinalizeArgs {
  DType stat_dtype;          // S: f32 or f64
  const void* gw_partial;    // (parts, D) S or null
  const void* gb_partial;    // (parts, D) S or null
  void* gw;                  // (D) gw_dtype or null
  DType gw_dtype;
  void* gb;                  // (D) gb_dtype or null
  DType gb_dtype;
  int64_t parts, dim;
};
bool norm_param_dtype_ok(DType dt);
void launch_norm_param_finalize(const NormParamFinalizeArgs& args, cudaStream_t stream);

// out (n, D) = weight[ids[k], :], a bit copy of elements of `itemsize` bytes; weight (V, D) has element
// strides (s0, s1). Out-of-range ids set status[1] (their output rows are zero).
struct EmbeddingArgs {
  std::size_t itemsize;
  void* out;
  const void* weight;
  const int64_t* ids;
  int64_t n, vocab, dim, s0, s1;
  unsigned long long* status;
};
void launch_embedding(const EmbeddingArgs& args, cudaStream_t stream);

// acc (V, D) S, zero-initialised by the caller, += g (n, D) scattered to rows ids[k], with atomicAdd: the
// order of the additions into one row is not fixed, so repeated ids give results that may differ in the last
// bits from run to run (not deterministic).
void launch_embedding_backward(DType g_dtype, void* acc, const void* g, const int64_t* ids, int64_t n, int64_t dim,
                               cudaStream_t stream);

// values (R) (may be null) and indices (R) of the first maximal element of each row of x (R, L); NaN is
// larger than everything.
void launch_max(DType dt, void* values, int64_t* indices, const void* x, int64_t rows, int64_t len,
                cudaStream_t stream);

}  // namespace ht::kernels
