// An exponential moving average of a model's trained weights (config section `ema`). Internal to src/train.
//
// Note [Weight EMA]
// The average covers the parameters that train (requires_grad) and the floating-point buffers (a batch norm's
// running statistics), each held in its tensor's dtype on its device. An update after optimiser step s (steps
// counted from 1) runs when s % every_steps == 0: the first update after a (re)start copies the weights, every
// later one computes average = decay * average + (1 - decay) * weights (mul_ then add_, on the run's stream, after
// the step's device work; a step graph's replay writes the weights in place, so the average reads them there).
// Integer buffers (a batch norm's step count) are copied. Frozen parameters never change, so their average is
// themselves and is not stored. With restart_during_warmup every update during the schedule's warm-up restarts
// the average (the next update copies again), as torchvision's reference scripts do with --model-ema: it follows
// the weights until warm-up ends. The average starts as the weights at construction, and the first update copies
// them again (torchvision's count of averaged models starts at 0). Evaluation of the average swaps it into the
// model for the pass (with_average: the weights are copied aside and back, so every holder of the weight tensors,
// optimiser and step graph included, keeps its storage). A checkpoint holds the average as ema.safetensors (the
// model's own tensor names, so the file loads as a state dict) and the update count in state.json; a resume
// restores both and continues exactly.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hadatrain/nn/module.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {

class WeightEma {
 public:
  // Averages `model`'s trained parameters and buffers as they are now (on their device): call after the
  // weights are final for step 0 (initialised, loaded, broadcast).
  WeightEma(nn::Module& model, const EmaSection& cfg);

  // After optimiser step `step` (the count of steps done): updates when step % every_steps == 0. `in_warmup`:
  // the schedule's warm-up has not ended at this step.
  void after_step(int64_t step, bool in_warmup);

  // The average restarted from the weights as they are now (a resume from a checkpoint without one).
  void restart();

  // Updates since the average last (re)started: 0 means the next update copies the weights.
  int64_t updates() const { return updates_; }
  // The average by the model's tensor names (shared storage, for a checkpoint).
  std::map<std::string, Tensor> tensors() const;
  // Restores a checkpoint's average: `t` must hold exactly this average's names and shapes (ht::Error naming
  // the first that differs, and `where`).
  void load(const std::map<std::string, Tensor>& t, int64_t updates, const std::string& where);

  // Runs `fn` with the average in the model in place of its weights (copied aside and back, also when fn
  // throws) and returns its result.
  template <class F>
  auto with_average(F&& fn) {
    const std::vector<Tensor> saved = swap_in();
    try {
      auto r = fn();
      restore(saved);
      return r;
    } catch (...) {
      restore(saved);
      throw;
    }
  }

 private:
  struct Entry {
    std::string name;
    Tensor* weight;  // the model's slot
    Tensor average;
  };
  void copy_weights();
  std::vector<Tensor> swap_in();                    // the weights copied aside; the average copied in
  void restore(const std::vector<Tensor>& saved);  // the weights copied back

  EmaSection cfg_;
  std::vector<Entry> entries_;
  int64_t updates_ = 0;
};

}  // namespace ht::train
