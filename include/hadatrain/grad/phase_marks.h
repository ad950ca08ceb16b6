// Phase marks: named boundaries inside a gradient pipeline's forward and backward (HLQ's quantisers, products,
// projections; a conv product's fold), for a profiler that times them (bench_train with HT_BENCH_PHASES=1 records a
// CUDA event at every mark and sums the time between consecutive marks per phase name).
//
// Note [Phase marks]
// mark_phase(name) ends the phase in progress and starts `name`; mark_phase(nullptr) ends it and returns the time
// after it to the rest of the step. Names are string literals (the profiler keeps the pointers and groups by their
// text). Without a hook a mark is one relaxed atomic load and nothing else, so the marks stay in the code: they
// add no launches and no synchronisation, and a recorded step graph is the same with or without them (a profiler
// must not install a hook while a step graph is being recorded: CUDA events recorded then would become graph
// nodes).
#pragma once

namespace ht::grad {

using PhaseHook = void (*)(const char* name, void* context);

// Installs `hook` (nullptr removes it); `context` is passed to every call. One hook per process.
void set_phase_hook(PhaseHook hook, void* context);

// Calls the hook, if any, with `name`.
void mark_phase(const char* name);

// True while a hook is installed. A pipeline then queues all its work on one stream (no side branch: Note [Side
// branches] in tensor/side_branch.h), so that the time between two marks is the marked phase's alone.
bool phases_marked();

// Marks `name` on construction and the end of it (nullptr) on destruction. Phases are flat: a scope inside another
// phase ends that phase too.
class PhaseScope {
 public:
  explicit PhaseScope(const char* name) { mark_phase(name); }
  ~PhaseScope() { mark_phase(nullptr); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
};

}  // namespace ht::grad
