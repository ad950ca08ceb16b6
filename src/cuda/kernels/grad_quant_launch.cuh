// Internals of the quantisation kernels shared by cuda/kernels/grad_quant*.cu (the interface is grad_quant.cuh): how a
// launch cuts its work (Geo, computed on the host by plan() in grad_quant.cu), the two-pass workspace, the
// dispatch helpers, and the launch functions of the two kernel families that launch_grad_quant calls:
//   grad_quant_units.cu  register units of 16 elements (or one Hadamard block): the fused unit kernel (LUQ,
//                        and uniform cases the item kernels cannot take), passes 1 and 3 on units;
//   grad_quant_items.cu  items of 8 elements: the fused item kernel (the HLQ g_x rows), passes 1 and 3 on
//                        items, and pass 3 into transposed values.
// grad_quant.cu holds the plan, the dispatch, pass 2 (finalize) and the other public launchers;
// grad_quant_common.cuh the device helpers. Included by .cu files only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hadatrain/tensor/scalar_types.h"
#include "cuda/kernels/grad_quant.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels::gq {

constexpr int kU = 16;              // register slots per unit
constexpr int kFusedUnits = 2;      // units per thread in the fused kernel
constexpr int kFusedTeam = 512;     // at most this many threads per group in the fused kernel
constexpr int kFusedBlock = 256;    // target threads per block of the fused kernel (several groups per block)
constexpr int kThreads = 256;
constexpr int kItem = 8;            // elements per item (grad_quant_items.cu)
constexpr int kItemSlots = 2;       // items per thread in the fused item kernel (its SAWB and dequantising forms)
constexpr int kItemSlotsWide = 3;   // or, when the team of 3-item threads costs less (codes without SAWB only)
constexpr int kItemSlotsLong = 4;   // rows whose 3-item team would exceed 512 threads (codes without SAWB only)

// How a launch cuts its work (computed on the host from the arguments).
struct Geo {
  int unit = kU;      // elements per unit: 16 (chunk mode) or T (block mode)
  bool vec = false;   // 16-byte loads and stores
  int64_t groups = 0;
  int64_t units = 0;  // units per group
  bool fused = false;
  bool items = false; // fused item path (quant_items_kernel): units are items of kItem elements
  int team = 32;      // fused: threads per group (a power of two <= 32, else a multiple of 32)
  int slots = kItemSlots;  // fused item path: items per thread (kItemSlots, kItemSlotsWide or kItemSlotsLong)
  int teams = 1;      // fused: groups per block (block = team · teams threads)
  int64_t parts = 1;  // two-pass: blocks per group in the partial reduction
};

// Workspace layout of the two-pass path: per (group, part) partial statistics, then m and r = qmax / m
// per group.
struct Workspace {
  double* s1;
  double* s2;
  float* amax;
  float* m;
  float* r;
  int64_t fold_parts = 0;  // > 0: one group, whose level pass 3 folds from this many parts (Note [Pass 2 in pass 3])
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the statistics use the SAWB rule (LUQ never does).
inline bool uses_sawb(const GradQuantArgs& a) { return a.sawb && a.kind == QuantKind::uniform; }

// Calls f(Out{}) with the stored type of the uniform quantiser's values (Out of the kernels).
template <class F>
void visit_store(QuantStore store, F&& f) {
  switch (store) {
    case QuantStore::codes: return f(uint8_t{});
    case QuantStore::f32: return f(float{});
    case QuantStore::bf16: return f(bf16{});
    case QuantStore::f16: return f(f16{});
  }
}

template <class F>
void visit_quant_dtype(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(f16{});
    default: HT_UNSUPPORTED_DTYPE(kernel, dt);
  }
}

// Blocks of a grid-stride loop over `blocks` work items of one block each: at least 1, at most grid_for's cap.
inline unsigned grid_cap(int64_t blocks) { return cuda::grid_for(blocks, 1); }

// Grid of a fused kernel: one block per g.teams groups (capped at 2^30 blocks), g.team · g.teams threads each.
inline unsigned fused_grid(const Geo& g) {
  const int64_t blocks = (g.groups + g.teams - 1) / g.teams;
  return static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : (int64_t{1} << 30));
}

// grad_quant_units.cu
void launch_fused_units(const GradQuantArgs& a, const Geo& g, cudaStream_t stream);
void launch_partial_units(const GradQuantArgs& a, const Geo& g, const Workspace& ws, cudaStream_t stream);
void launch_apply_units(const GradQuantArgs& a, const Geo& g, const Workspace& ws, cudaStream_t stream);
// grad_quant_items.cu
void launch_fused_items(const GradQuantArgs& a, const Geo& g, cudaStream_t stream);
void launch_partial_items(const GradQuantArgs& a, const Geo& g, const Workspace& ws, cudaStream_t stream);
void launch_apply_items(const GradQuantArgs& a, const Workspace& ws, cudaStream_t stream);
// Passes 1 and 3 of a quantisation of x = Wᵀ read from W (R, C) dense (Note [Quantiser of a transposed input]);
// pass 1 runs g.parts blocks. Both read tiles of 16 rows × kWtCols columns of W, one a thread.
constexpr int kWtCols = 4;
void launch_partial_wt(const GradQuantArgs& a, const Geo& g, const Workspace& ws, int64_t R, int64_t C,
                       cudaStream_t stream);
void launch_apply_wt(const GradQuantArgs& a, const Workspace& ws, int64_t R, int64_t C, cudaStream_t stream);
// Pass 3 into transposed values. With column_sums (strips_apply only): the strip kernel also writes each 128-row
// strip's column sums to sums_part ((N + 127) / 128, C) f32, then a second kernel adds them in strip order into
// column_sums (C).
void launch_apply_transposed(const GradQuantArgs& a, const Workspace& ws, float* sums_part, float* column_sums,
                             cudaStream_t stream);
// Whether the strip kernel serves a transposed launch (Note [Transposed quantiser strips]).
bool strips_apply(const GradQuantArgs& a);
// Rows per strip of the strip kernel.
constexpr int kStripRows = 128;

}  // namespace ht::kernels::gq
