// Learning-rate schedules (PyTorch semantics: StepLR, MultiStepLR, cosine annealing, cosine annealing with warm
// restarts) with linear warm-up.
#include "hadatrain/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "hadatrain/core/error.h"

namespace ht::optim {

double learning_rate(const ScheduleConfig& s, int64_t step) {
  HT_CHECK(step >= 0, "learning_rate: negative step {}", step);
  if (step < s.warmup_steps) {
    const double f = s.warmup_start_factor + (1.0 - s.warmup_start_factor) * static_cast<double>(step) /
                                                 static_cast<double>(s.warmup_steps);
    return s.base_lr * f;
  }
  switch (s.kind) {
    case ScheduleKind::constant: return s.base_lr;
    case ScheduleKind::step: {
      HT_CHECK(s.step_size > 0, "step schedule: step_size must be positive, got {}", s.step_size);
      return s.base_lr * std::pow(s.gamma, static_cast<double>(step / s.step_size));
    }
    case ScheduleKind::multistep: {
      const auto passed = std::count_if(s.milestones.begin(), s.milestones.end(), [&](int64_t m) { return step >= m; });
      return s.base_lr * std::pow(s.gamma, static_cast<double>(passed));
    }
    case ScheduleKind::cosine: {
      const int64_t span = s.total_steps - s.warmup_steps;
      HT_CHECK(span > 0, "cosine schedule: total_steps {} must exceed warmup_steps {}", s.total_steps, s.warmup_steps);
      const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(span));
      return s.min_lr + (s.base_lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
    case ScheduleKind::cosine_restarts: {
      // PyTorch's CosineAnnealingWarmRestarts (SGDR) from the end of the warm-up, in steps: cycle i lasts
      // restart_steps * restart_mult^i steps, each a half cosine from base_lr to min_lr, then back to base_lr.
      HT_CHECK(s.restart_steps > 0 && s.restart_mult >= 1, "cosine_restarts schedule: restart_steps {} must be "
               "positive and restart_mult {} at least 1", s.restart_steps, s.restart_mult);
      int64_t cur = step - s.warmup_steps, len = s.restart_steps;
      if (s.restart_mult == 1) {
        cur %= len;
      } else {
        while (cur >= len) {
          cur -= len;
          len *= s.restart_mult;
        }
      }
      const double t = static_cast<double>(cur) / static_cast<double>(len);
      return s.min_lr + (s.base_lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
  }
  return s.base_lr;
}

}  // namespace ht::optim
