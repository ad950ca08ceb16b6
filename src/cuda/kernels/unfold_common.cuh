// Internals shared by the unfold and fold kernels (the interface is unfold.cuh): the block size and the
// shared-memory cap of the staged kernels of both families, and the run-time variant state of both
// (VariantChoice, LaunchCounter). cuda/kernels/unfold.cu holds the unfold kernels (variants old, staged, vec; Notes
// [Unfold, staged kernel], [Unfold, vec kernel]) and launch_unfold2d; cuda/kernels/unfold_fold.cu the fold kernels
// (variants old, tiles, tiles2; Notes [Fold, tiles kernel], [Fold, tiles2]) and launch_fold2d. Included by .cu
// files only.
#pragma once
#include <atomic>
#include <cstdint>

namespace ht::kernels::uf {

// Threads per block of the staged and vec unfold kernels and of the tiles fold kernel.
inline constexpr int kFoldThreads = 256;
inline constexpr int64_t kFoldSmemMax = 48 * 1024;  // no opt-in; leaves room for several blocks per SM

// A kernel family's variant (unfold_variant, fold_variant in unfold.cuh): the one set() stored
// (set_*_variant) when it names one of the family's Count variants, else the environment's, which `env` reads
// once per process (env_variant in cuda/kernels/variant.h). set(0) goes back to the environment.
template <int Count>
class VariantChoice {
 public:
  constexpr explicit VariantChoice(int (*env)()) : env_(env) {}
  int get() const {
    const int o = override_.load(std::memory_order_relaxed);
    return o >= 1 && o <= Count ? o : env_();
  }
  void set(int variant) { override_.store(variant, std::memory_order_relaxed); }

 private:
  std::atomic<int> override_{0};
  int (*env_)();
};

// Launches of one kernel path in this process (the GPU tests read it to see which variant ran).
class LaunchCounter {
 public:
  void add() { n_.fetch_add(1, std::memory_order_relaxed); }
  int64_t get() const { return n_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> n_{0};
};

}  // namespace ht::kernels::uf
