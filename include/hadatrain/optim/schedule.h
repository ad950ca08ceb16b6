// Learning-rate schedules as pure functions of the step (so resuming needs only the step counter).
#pragma once
#include <cstdint>
#include <vector>

namespace ht::optim {

enum class ScheduleKind { constant, step, multistep, cosine, cosine_restarts };

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::constant;
  double base_lr = 0.1;
  int64_t warmup_steps = 0;      // linear warm-up from warmup_start_factor * base_lr
  double warmup_start_factor = 0.0;
  int64_t total_steps = 0;       // cosine: decays to min_lr at total_steps
  double min_lr = 0.0;
  int64_t step_size = 0;         // step: multiply by gamma every step_size steps
  std::vector<int64_t> milestones;  // multistep: multiply by gamma at each milestone
  double gamma = 0.1;
  int64_t restart_steps = 0;  // cosine_restarts: the first cycle's length (PyTorch's T_0, in steps)
  int64_t restart_mult = 1;   // cosine_restarts: each cycle this many times the previous one (T_mult)
};

// The learning rate to use for optimiser step `step` (0-based).
double learning_rate(const ScheduleConfig& s, int64_t step);

}  // namespace ht::optim
