// Activation checkpointing (autograd/checkpoint.h, Note [Checkpointed recompute]): the forward without
// history, and the backward node that runs the function again and backpropagates through the rebuilt graph.
#include "hadatrain/autograd/checkpoint.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/core/error.h"
#include "hadatrain/tensor/dtype.h"

namespace ht {
namespace {

// Sets each generator to its recorded state, and puts back the states it found when it goes.
class RewoundGenerators {
 public:
  RewoundGenerators(const std::vector<Generator*>& gens, const std::vector<uint64_t>& states) : gens_(gens) {
    for (std::size_t i = 0; i < gens_.size(); ++i) {
      found_.push_back(gens_[i]->state());
      gens_[i]->set_state(states[i]);
    }
  }
  ~RewoundGenerators() {
    for (std::size_t i = 0; i < gens_.size(); ++i) gens_[i]->set_state(found_[i]);
  }
  RewoundGenerators(const RewoundGenerators&) = delete;
  RewoundGenerators& operator=(const RewoundGenerators&) = delete;

 private:
  std::vector<Generator*> gens_;
  std::vector<uint64_t> found_;
};

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(CheckpointFn fn, std::vector<Generator*> gens, std::vector<uint64_t> states,
                     std::vector<std::size_t> floating_outputs)
      : fn_(std::move(fn)), gens_(std::move(gens)), states_(std::move(states)), outputs_(std::move(floating_outputs)) {}

  std::string name() const override { return "CheckpointBackward"; }

  void keep_inputs(const std::vector<Tensor>& inputs) {
    for (const Tensor& t : inputs) slots_.push_back(t.defined() ? save(t) : kNoSlot);
  }

  // grads: one per floating output of the forward (outputs_[j] is that output's position in fn's result).
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i] == kNoSlot) {
        inputs.emplace_back();
        continue;
      }
      Tensor x = saved(slots_[i]).detach();
      if (needs_input_grad(i)) x.set_requires_grad(true);
      inputs.push_back(std::move(x));
    }
    std::vector<Tensor> outs;
    {
      RewoundGenerators rewound(gens_, states_);
      GradModeGuard grad_on(true);
      outs = fn_(inputs);
    }
    std::vector<Tensor> roots, root_grads;
    for (std::size_t j = 0; j < outputs_.size(); ++j) {
      HT_CHECK(outputs_[j] < outs.size(),
               "checkpoint: the recomputed function returned {} outputs, the forward returned more", outs.size());
      const Tensor& o = outs[outputs_[j]];
      if (!grads[j].defined() || !o.requires_grad()) continue;
      roots.push_back(o);
      root_grads.push_back(grads[j]);
    }
    if (!roots.empty()) run_backward(roots, root_grads, BackwardOptions{});
    std::vector<Tensor> gin(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (needs_input_grad(i)) gin[i] = inputs[i].grad();
    return gin;
  }

  void release_saved() override {
    Node::release_saved();
    fn_ = nullptr;  // what the function captured (modules, tables) is not kept past the backward
  }

 private:
  static constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);
  CheckpointFn fn_;
  std::vector<Generator*> gens_;
  std::vector<uint64_t> states_;
  std::vector<std::size_t> outputs_;
  std::vector<std::size_t> slots_;
};

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  HT_CHECK(fn != nullptr, "checkpoint: no function given");
  if (!grad_enabled()) return fn(inputs);
  std::vector<uint64_t> states;
  for (Generator* g : options.generators) {
    HT_CHECK(g != nullptr, "checkpoint: CheckpointOptions::generators holds a null generator");
    states.push_back(g->state());
  }
  std::vector<Tensor> outs;
  {
    GradModeGuard no_grad(false);
    outs = fn(inputs);
  }
  // Detached: an output that is one of the inputs must not have its history replaced below.
  std::vector<Tensor> floating;
  std::vector<std::size_t> positions;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].defined()) continue;
    outs[i] = outs[i].detach();
    if (!is_floating(outs[i].dtype())) continue;
    positions.push_back(i);
    floating.push_back(outs[i]);
  }
  if (floating.empty()) return outs;
  auto node = std::make_shared<CheckpointBackward>(fn, options.generators, std::move(states), positions);
  node->keep_inputs(inputs);
  connect(node, inputs, floating);
  for (std::size_t j = 0; j < positions.size(); ++j) outs[positions[j]] = floating[j];
  return outs;
}

}  // namespace ht
