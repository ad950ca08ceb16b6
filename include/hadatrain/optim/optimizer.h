// Optimisers (SGD, AdamW) over the fp32 master parameters of a parameter store, global-norm gradient
// clipping, and learning rate schedules. Each step is one fused pass per parameter (a multi-tensor kernel on
// the GPU). An optimiser steps over what its store holds and keeps its per-parameter state (momentum,
// moments) in the store's state slots, so checkpoints read and write it through the store.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::optim {

using nn::make_param_refs;  // the default weight-decay selection
using nn::ParamRef;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // Updates every parameter that has a gradient with learning rate `lr`: begin_step(lr), then apply().
  void step(double lr) {
    begin_step(lr);
    apply();
  }
  // The host half of a step: raises the storage version of every parameter that requires grad (Note [Storage
  // versions] in tensor/allocator.h: apply() updates them in place, also when a step graph replays it, where no
  // host code runs but this half does), then counts the step and stages its hyper-parameters (learning rate, bias
  // corrections) where apply() reads them; for CUDA parameters a small device buffer written in stream order.
  void begin_step(double lr);
  // The device half: updates every parameter that has a gradient with the staged hyper-parameters. It
  // passes no per-step host value to the device, so a step graph may record it (cuda/graph.h); momentum
  // and moment buffers are created on the first apply() that sees a parameter's gradient.
  virtual void apply() = 0;
  void zero_grad() { store_->zero_grad(); }
  int64_t steps() const { return steps_; }
  // State for checkpoints: the store's state tensors by "<param name>.<slot>", plus the step counter.
  std::map<std::string, Tensor> state_tensors() const { return store_->state_tensors(); }
  void load_state_tensors(const std::map<std::string, Tensor>& state, int64_t steps);
  const std::vector<ParamRef>& params() const { return store_->params(); }
  nn::ParameterStore& store() const { return *store_; }

 protected:
  // begin_step's own part for each optimiser: count the step, stage the hyper-parameters.
  virtual void stage(double lr) = 0;
  // Takes the store's parameters (each a leaf in f32 or f64) and names the optimiser's state slots in it.
  Optimizer(std::shared_ptr<nn::ParameterStore> store, std::vector<std::string> state_slots);
  // Indices of the CUDA devices that hold parameters (ascending).
  std::vector<int> cuda_devices() const;
  std::shared_ptr<nn::ParameterStore> store_;
  int64_t steps_ = 0;
};

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // coupled (added to the gradient), as torch.optim.SGD
  bool nesterov = false;
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p *= 1 - lr * wd
};

// Over a store (usually nn::ParameterStore::attach(model)), or over plain named tensors in a store of their own.
std::unique_ptr<Optimizer> make_sgd(std::shared_ptr<nn::ParameterStore> store, const SgdOptions& o);
std::unique_ptr<Optimizer> make_sgd(std::vector<ParamRef> params, const SgdOptions& o);
std::unique_ptr<Optimizer> make_adamw(std::shared_ptr<nn::ParameterStore> store, const AdamWOptions& o);
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamRef> params, const AdamWOptions& o);

// Scales all gradients so their global L2 norm is at most max_norm; returns the norm before clipping.
double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm);
// The same without reading anything on the host: the norm is summed, compared and applied on the device of
// the first gradient (others' partial sums are copied there), so a step graph can record it. Returns the
// norm before clipping as an f64 scalar on that device (undefined when no parameter has a gradient).
Tensor clip_grad_norm_on_device(const std::vector<ParamRef>& params, double max_norm);

}  // namespace ht::optim
