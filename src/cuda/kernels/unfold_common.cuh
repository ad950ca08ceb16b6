// Internals shared by the unfold and fold kernels (the interface is unfold.cuh): the block size and the
// shared-memory cap of the staged kernels of both families (the launch counters the GPU tests read are
// LaunchCounters, cuda/kernels/kernel_launch.cuh). cuda/kernels/unfold.cu holds the unfold kernels (gather, staged, vec; Notes [Unfold, staged
// kernel], [Unfold, vec kernel]) and launch_unfold2d; cuda/kernels/unfold_fold.cu the fold kernels (gather,
// tiles, tiles with halo; Notes [Fold, tiles kernel], [Fold, tiles2]) and launch_fold2d. Included by .cu files
// only.
#pragma once
#include <cstdint>

#include "cuda/kernels/kernel_launch.cuh"  // LaunchCounter

namespace ht::kernels::uf {

// Threads per block of the staged and vec unfold kernels and of the tiles fold kernel.
inline constexpr int kFoldThreads = 256;
inline constexpr int64_t kFoldSmemMax = 48 * 1024;  // no opt-in; leaves room for several blocks per SM


}  // namespace ht::kernels::uf
