// Internals shared by the unfold and fold kernels (the interface is unfold.h): the block size and the
// shared-memory cap of the staged kernels of both families. kernels/unfold.cu holds the unfold kernels
// (variants old, staged, vec; Notes [Unfold, staged kernel], [Unfold, vec kernel]) and launch_unfold2d;
// kernels/unfold_fold.cu the fold kernels (variants old, tiles, tiles2; Notes [Fold, tiles kernel],
// [Fold, tiles2]) and launch_fold2d. Included by .cu files only.
#pragma once
#include <cstdint>

namespace ht::kernels::uf {

// Threads per block of the staged and vec unfold kernels and of the tiles fold kernel.
inline constexpr int kFoldThreads = 256;
inline constexpr int64_t kFoldSmemMax = 48 * 1024;  // no opt-in; leaves room for several blocks per SM

}  // namespace ht::kernels::uf
