// Per-tensor autograd state, and AccumulateGrad: the one place where gradients are added to a leaf's .grad.
#pragma once
#include <memory>
#include <vector>

#include "hadatrain/autograd/node.h"

namespace ht {

class AccumulateGrad;

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<AccumulateGrad> grad_accumulator;  // leaves: created lazily, owned by graph edges
  std::vector<GradHook> hooks;
  std::vector<PostAccumulateHook> post_hooks;
};

// Receives the total gradient of a leaf for one backward pass: runs the leaf's hooks, then adds the
// result into leaf.grad (Note [Gradient accumulation]) and runs the post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  Tensor leaf() const { return Tensor(leaf_); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

}  // namespace ht
