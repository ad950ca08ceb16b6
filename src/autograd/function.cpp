// Recording history: gradient edges of inputs and connecting a node to its outputs.
#include "hadatrain/autograd/function.h"

#include "hadatrain/autograd/meta.h"

namespace ht {

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  AutogradMeta* m = t.autograd_meta_if_any();
  if (m == nullptr) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  auto acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

namespace {
void set_history(Tensor& out, const std::shared_ptr<Node>& node, uint32_t nr) {
  AutogradMeta& m = out.autograd_meta();
  m.requires_grad = true;
  m.grad_fn = node;
  m.output_nr = nr;
}
}  // namespace

void connect(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
             std::initializer_list<Tensor*> outputs) {
  auto& edges = node->mutable_next_edges();
  edges.clear();
  for (const Tensor* t : inputs) edges.push_back(t ? gradient_edge(*t) : Edge{});
  node->set_num_outputs(static_cast<uint32_t>(outputs.size()));
  uint32_t nr = 0;
  for (Tensor* o : outputs) set_history(*o, node, nr++);
}

void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
  auto& edges = node->mutable_next_edges();
  edges.clear();
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  node->set_num_outputs(static_cast<uint32_t>(outputs.size()));
  uint32_t nr = 0;
  for (Tensor& o : outputs) set_history(o, node, nr++);
}

}  // namespace ht
