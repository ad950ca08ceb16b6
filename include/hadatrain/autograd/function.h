// Helpers ops use to record history: check whether any input needs a gradient, and connect a backward
// Node between inputs and outputs. Typical op:
//
//   Tensor out = ...forward...;
//   if (needs_grad({&a, &b})) {
//     auto node = std::make_shared<MulBackward>();
//     node->sa = node->save(a); ...
//     connect(node, {&a, &b}, {&out});
//   }
#pragma once
#include <initializer_list>
#include <memory>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/autograd/node.h"

namespace ht {

// True when grad mode is on and any of the defined inputs requires a gradient.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);
// The edge along which t's gradient flows (its grad_fn, or its leaf accumulator); invalid if t needs none.
Edge gradient_edge(const Tensor& t);
// Points node's next edges at the inputs and makes `node` the grad_fn of each output (output_nr = position).
void connect(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
             std::initializer_list<Tensor*> outputs);
void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs);

}  // namespace ht

#include <functional>
#include <string>

namespace ht {

// A backward node given as a function, for ops with no Node class of their own: the function captures the
// metadata it needs (shapes, dtypes), and the tensors it needs (where's condition, swiglu's inputs) go through
// Node::save inside the op and are read with saved().
class FunctionNode final : public Node {
 public:
  using Fn = std::function<std::vector<Tensor>(FunctionNode& self, std::vector<Tensor>&& grads)>;
  // Rebuilds the single output from the saved tensors (Node::recompute_output), bit for bit.
  using Rebuild = std::function<Tensor(const FunctionNode& self)>;
  FunctionNode(std::string name, Fn fn, Rebuild rebuild = nullptr)
      : name_(std::move(name)), fn_(std::move(fn)), rebuild_(std::move(rebuild)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return fn_(*this, std::move(grads)); }
  Tensor recompute_output() const override { return rebuild_ ? rebuild_(*this) : Tensor(); }
  bool can_recompute_output() const override { return rebuild_ != nullptr; }

 private:
  std::string name_;
  Fn fn_;
  Rebuild rebuild_;
};

// Records a FunctionNode between `inputs` and a single output `out` when any input needs a gradient.
inline void record(const char* name, std::initializer_list<const Tensor*> inputs, Tensor& out,
                   FunctionNode::Fn fn) {
  if (!needs_grad(inputs)) return;
  connect(std::make_shared<FunctionNode>(name, std::move(fn)), inputs, {&out});
}

}  // namespace ht
