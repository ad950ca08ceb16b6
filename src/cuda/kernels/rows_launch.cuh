// Internals of the row kernels shared by cuda/kernels/rows*.cu (the interface is rows.cuh): the block constants, the
// launch shapes of the kernel families (RowGrid: the multi-pass kernels; CacheGrid, BwdGrid: the
// register-resident ones; StagedGrid: the staged norm kernels), and the launch functions of the norm kernel
// families that the public launchers in rows_norm.cu pick between (Note [Norm kernels]):
//   rows_norm_cached.cu     register-resident layer_norm / rms_norm forward and backward;
//   rows_norm_staged_fwd.cu the staged forward, and the staged launch shape (staged_grid, pick_cluster);
//   rows_norm_staged_bwd.cu the staged backward (the block and the cluster kernels).
// rows.cu holds softmax, cross-entropy, embedding and max; rows_norm.cu the kernel choice, the multi-pass
// norm kernels, the parameter-gradient kernels and the public norm launchers. rows_common.cuh holds the device
// helpers, rows_staged.cuh those of the staged kernels. Included by .cu files only.
#pragma once
#include <cstddef>
#include <initializer_list>

#include "cuda/kernels/map.cuh"
#include "cuda/kernels/rows.cuh"

namespace ht::kernels::rk {

constexpr int kRowBlock = 256;
// The most threads per row of the register-resident forward kernels (rows_common.cuh: RowCache).
constexpr int kCacheMaxTpr = 512;

// Row-group geometry of a launch: threads per row and the grid.
struct RowGrid {
  int tpr;
  unsigned blocks;
};
inline RowGrid row_grid(int64_t rows, int64_t len) {
  const int tpr = len <= 256 ? 32 : kRowBlock;
  const int64_t per_block = kRowBlock / tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  constexpr int64_t kMaxBlocks = 132 * 64;
  return {tpr, static_cast<unsigned>(groups < 1 ? 1 : (groups > kMaxBlocks ? kMaxBlocks : groups))};
}

// Launch shape of the register-resident kernels: packs per thread (4 or 8; 0 when they do not apply: the
// rows are not packable, i.e. len not a multiple of the pack or a pointer not 16-byte aligned, or are
// longer than 512 x 8 packs), threads per row, block and grid.
struct CacheGrid {
  int np = 0, tpr = 0;
  unsigned block = 0, blocks = 0;
};
inline CacheGrid cache_grid(int64_t rows, int64_t len, int vec, std::initializer_list<const void*> ptrs) {
  CacheGrid g;
  if (len <= 0 || len % vec != 0) return g;
  for (const void* p : ptrs)
    if (!aligned_to(p, 16)) return g;
  const int64_t packs = len / vec;
  g.np = packs <= 4 * kCacheMaxTpr ? 4 : 8;
  if (packs > static_cast<int64_t>(g.np) * kCacheMaxTpr) return CacheGrid{};
  g.tpr = 32;
  while (static_cast<int64_t>(g.tpr) * g.np < packs) g.tpr *= 2;
  const int block = g.tpr < kRowBlock ? kRowBlock : g.tpr;
  const int64_t per_block = block / g.tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  constexpr int64_t kMaxBlocks = 132 * 64;
  g.block = static_cast<unsigned>(block);
  g.blocks = static_cast<unsigned>(groups < 1 ? 1 : (groups > kMaxBlocks ? kMaxBlocks : groups));
  return g;
}

// ---- register-resident backward rows: softmax / log_softmax and layer_norm / rms_norm ----------------------
// Two rows (g and y, or g and x) held in registers: both are read once, reduced, and gx written once (the
// multi-pass kernels read them twice). A group of tpr threads (32..256, a power of two) per row, NP (2 or 4)
// packs per thread and row, 256-thread blocks. The norm kernel also accumulates the parameter gradients (sums over rows
// of g * xhat and g) per column in registers: a lane keeps the same columns for every row it visits, so the
// block adds its row groups' sums in shared memory and writes one partial row (D) per block; the caller
// adds the blocks' rows (no second pass over g and x).
struct BwdGrid {
  int np = 0, tpr = 0;
  unsigned blocks = 0;
};
constexpr int64_t kBwdMaxBlocks = 132 * 4;  // bounds the (blocks, D) partial sums of the norm kernel
inline BwdGrid bwd_grid(int64_t rows, int64_t len, int vec, std::initializer_list<const void*> ptrs,
                        int64_t max_blocks) {
  BwdGrid g;
  if (len <= 0 || len % vec != 0) return g;
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return g;
  // Two packs per thread while 256 threads cover the row (the bf16 norm kernel keeps about 100 registers:
  // two blocks per SM); four packs per thread (about 170 registers, one block per SM) only beyond that.
  const int64_t packs = len / vec;
  int np = 2, tpr = 32;
  while (static_cast<int64_t>(tpr) * np < packs && tpr < kRowBlock) tpr *= 2;
  if (static_cast<int64_t>(tpr) * np < packs) np = 4;
  if (static_cast<int64_t>(tpr) * np < packs) return g;
  const int64_t per_block = kRowBlock / tpr;
  const int64_t groups = (rows + per_block - 1) / per_block;
  g.np = np;
  g.tpr = tpr;
  g.blocks = static_cast<unsigned>(groups < 1 ? 1 : (groups > max_blocks ? max_blocks : groups));
  return g;
}

// Where the staged forward keeps the norm parameters: shared memory, or (StagedKind::reg) registers as
// S, or as packs of the row dtype (bf16 / f16 rows whose parameters are bf16 / f16 or absent: half the
// registers, so 4096-wide rows, 4 packs per thread, do not spill).
enum class NormParamsAt : int { smem = 0, reg = 1, reg_narrow = 2 };

// Launch shape of a staged kernel: packs per thread (1..4; 0: the kernel does not apply), threads per row,
// stages, dynamic shared memory and grid (one wave of resident blocks, at most one block per row group).
struct StagedGrid {
  int np = 0, tpr = 0, stages = 0;
  NormParamsAt pm = NormParamsAt::smem;  // where the kernel keeps the parameters (StagedKind::reg: registers)
  std::size_t smem = 0;
  unsigned blocks = 0;
  bool cluster_kernel = false;  // the cluster backward kernel (kCl; Note [Norm backward, clusters])
  unsigned cluster = 1;  // blocks per thread block cluster (the cluster backward; blocks is a multiple of it)
  int64_t wave = 0;      // blocks resident at once on the device (occupancy x SMs)
};

// StagedKind::reg keeps the forward's parameters in registers: as packs of the row dtype when the rows are
// bf16 / f16 and the given parameters too, else as S; for up to kRegNp packs per thread (every staged row:
// ptxas, sm_90a, shows no spills under the kernels' two-blocks-per-SM bound of 128 registers; the counts are
// in Note [Norm kernels]). Lower it to keep wider rows' parameters in shared memory if a register count ever
// spills.
constexpr int kRegNp = 4;

// Which staged kernel runs (Note [Norm kernels]): smem keeps the parameters in shared memory (forward and
// backward), reg the forward's in registers, cluster (the backward) adds the partial sums across a thread
// block cluster.
enum class StagedKind { smem, reg, cluster };
// Whose shared-memory layout staged_grid sizes.
enum class StagedPass { forward, backward };

// rows_norm_staged_fwd.cu. staged_grid: the launch shape of a staged kernel, kernels[np - 1] its instantiation
// for np packs per thread (0 packs: the staged kernels do not apply); pick_cluster: the cluster backward's
// cluster size.
StagedGrid staged_grid(int64_t rows, int64_t len, int vec, std::size_t acc, StagedPass pass, int reg_np,
                       std::initializer_list<const void*> ptrs, const void* const (&kernels)[4]);
void pick_cluster(StagedGrid& g, const void* kernel);
// The staged forward (StagedKind smem or reg) and its launch.
StagedGrid norm_fwd_staged_grid(const NormArgs& a, StagedKind kind);
void launch_norm_staged(const NormArgs& a, const StagedGrid& sg, cudaStream_t stream);

// rows_norm_staged_bwd.cu: the staged backward (StagedKind smem or cluster) and its launch.
StagedGrid norm_bwd_staged_grid(const NormBackwardArgs& a, StagedKind kind);
void launch_norm_backward_staged(const NormBackwardArgs& a, const StagedGrid& sg, cudaStream_t stream);

// rows_norm_cached.cu: the register-resident forward (false when the rows do not fit it: nothing launched), the
// backward's launch shape (np 0: it does not apply) and launch.
bool launch_norm_cached(const NormArgs& a, cudaStream_t stream);
BwdGrid norm_bwd_grid(const NormBackwardArgs& a);
void launch_norm_backward_cached(const NormBackwardArgs& a, const BwdGrid& bg, cudaStream_t stream);

}  // namespace ht::kernels::rk
