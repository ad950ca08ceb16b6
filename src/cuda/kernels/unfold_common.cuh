// Internals shared by the unfold and fold kernels (the interface is unfold.cuh): the block size and the
// shared-memory cap of the staged kernels of both families, and the launch counters the GPU tests read
// (LaunchCounter). cuda/kernels/unfold.cu holds the unfold kernels (gather, staged, vec; Notes [Unfold, staged
// kernel], [Unfold, vec kernel]) and launch_unfold2d; cuda/kernels/unfold_fold.cu the fold kernels (gather,
// tiles, tiles with halo; Notes [Fold, tiles kernel], [Fold, tiles2]) and launch_fold2d. Included by .cu files
// only.
#pragma once
#include <atomic>
#include <cstdint>

namespace ht::kernels::uf {

// Threads per block of the staged and vec unfold kernels and of the tiles fold kernel.
inline constexpr int kFoldThreads = 256;
inline constexpr int64_t kFoldSmemMax = 48 * 1024;  // no opt-in; leaves room for several blocks per SM

// Launches of one kernel path in this process (the GPU tests read it to see which kernel ran).
class LaunchCounter {
 public:
  void add() { n_.fetch_add(1, std::memory_order_relaxed); }
  int64_t get() const { return n_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> n_{0};
};

}  // namespace ht::kernels::uf
