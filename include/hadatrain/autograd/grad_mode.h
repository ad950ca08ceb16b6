// Grad mode: a thread-local switch that decides whether ops record autograd history. RAII-guarded.
#pragma once

namespace ht {

bool grad_enabled();

class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// Disables history recording in a scope (inference, optimiser steps, backward formulas).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace ht
