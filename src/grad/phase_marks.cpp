// Phase marks (grad/phase_marks.h, Note [Phase marks]).
#include "hadatrain/grad/phase_marks.h"

#include <atomic>

namespace ht::grad {
namespace {

std::atomic<PhaseHook> g_hook{nullptr};
std::atomic<void*> g_context{nullptr};

}  // namespace

void set_phase_hook(PhaseHook hook, void* context) {
  g_context.store(context, std::memory_order_relaxed);
  g_hook.store(hook, std::memory_order_release);
}

void mark_phase(const char* name) {
  const PhaseHook hook = g_hook.load(std::memory_order_acquire);
  if (hook != nullptr) hook(name, g_context.load(std::memory_order_relaxed));
}

bool phases_marked() { return g_hook.load(std::memory_order_acquire) != nullptr; }

}  // namespace ht::grad
