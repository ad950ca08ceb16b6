// Where a gradient pipeline's time goes inside a step (HT_BENCH_PHASES=1 in bench_train and bench_grad): a CUDA
// event on the current stream at every phase mark (grad/phase_marks.h, Note [Phase marks]), and per phase name the
// sum of the times from its mark to the next one. Time outside every phase (other layers, norms, attention, the
// optimiser) is "rest of the step". Eager steps only (events recorded during a step graph's capture would become
// graph nodes); each event costs a few microseconds of host time, so when the host issue time approaches the step
// time the device waits and the idle time is counted in whatever phase is open.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/cuda/context.h"
#include "hadatrain/grad/phase_marks.h"

namespace ht::bench {

class PhaseTimer {
 public:
  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer() {
    grad::set_phase_hook(nullptr, nullptr);
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }

  // True when HT_BENCH_PHASES is set to 1.
  static bool wanted() {
    const char* v = std::getenv("HT_BENCH_PHASES");
    return v != nullptr && std::string(v) == "1";
  }

  // Runs step() `reps` times with the marks recorded (after one untimed run that creates the events), and prints
  // the phases' mean time per step, largest first, with the share of the step (first to last event of each step),
  // on `out` (stdout unless given: a tool whose stdout carries result records prints them on stderr).
  template <class F>
  void run_and_print(const char* title, F&& step, int reps = 5, std::FILE* out = stdout) {
    grad::set_phase_hook(&PhaseTimer::hook, this);
    std::vector<std::pair<std::string, double>> sums;
    double total = 0.0;
    for (int r = 0; r <= reps; ++r) {
      cudaDeviceSynchronize();
      used_ = 0;
      record("rest of the step");
      step();
      record(nullptr);
      cudaDeviceSynchronize();
      if (r == 0) continue;  // warm-up: events created, one-off work done
      for (std::size_t i = 0; i + 1 < used_; ++i) {
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, pool_[i], pool_[i + 1]);
        const std::string name = names_[i] ? names_[i] : "rest of the step";
        auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& s) { return s.first == name; });
        if (it == sums.end()) sums.emplace_back(name, ms);
        else it->second += ms;
        total += ms;
      }
    }
    grad::set_phase_hook(nullptr, nullptr);
    std::sort(sums.begin(), sums.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    std::fprintf(out, "  %s: phase breakdown, eager step with marks, %.2f ms/step (mean of %d)\n", title, total / reps,
                 reps);
    for (const auto& [name, ms] : sums)
      std::fprintf(out, "    %-48s %8.3f ms %5.1f %%\n", name.c_str(), ms / reps, total > 0 ? 100.0 * ms / total : 0.0);
  }

 private:
  static void hook(const char* name, void* self) { static_cast<PhaseTimer*>(self)->record(name); }

  void record(const char* name) {
    if (used_ == pool_.size()) {
      cudaEvent_t e = nullptr;
      cudaEventCreate(&e);
      pool_.push_back(e);
      names_.push_back(nullptr);
    }
    names_[used_] = name;
    cudaEventRecord(pool_[used_], cuda::current_stream());
    ++used_;
  }

  std::vector<cudaEvent_t> pool_;
  std::vector<const char*> names_;  // the phase that starts at each event (nullptr: the rest of the step)
  std::size_t used_ = 0;
};

}  // namespace ht::bench
