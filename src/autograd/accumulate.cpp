// AccumulateGrad and the autograd half of the Tensor API (requires_grad, grad, hooks, backward).
#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/meta.h"
#include "hadatrain/ops/elementwise.h"

namespace ht {

// Note [Gradient accumulation]
// AccumulateGrad::apply is the only code that writes a leaf's .grad. The first gradient is stored as
// is when nothing else references its memory (otherwise cloned, so that in-place optimiser updates of
// one leaf's .grad cannot change another's); later gradients are added out of place.
std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  HT_ASSERT(grads.size() == 1, "AccumulateGrad expects one gradient, got {}", grads.size());
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  AutogradMeta& m = *leaf_->autograd;
  for (auto& hook : m.hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = std::move(replaced);
  }
  HT_ASSERT(g.shape() == leaf_->shape, "gradient of shape {} arrived for a leaf of shape {}", to_string(g.shape()),
            to_string(leaf_->shape));
  if (g.dtype() != leaf_->dtype) g = g.to(leaf_->dtype);
  if (!m.grad.defined()) {
    const bool unique = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous();
    m.grad = unique ? g : g.clone();
  } else {
    m.grad = add(m.grad, g);
  }
  Tensor leaf(leaf_);
  for (auto& hook : m.post_hooks) hook(leaf);
  return {};
}

AutogradMeta& Tensor::autograd_meta() {
  auto& im = impl();
  if (!im.autograd) im.autograd = std::make_unique<AutogradMeta>();
  return *im.autograd;
}

bool Tensor::requires_grad() const {
  const AutogradMeta* m = autograd_meta_if_any();
  return m && m->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool r) {
  HT_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can be changed ({} has a grad_fn); use detach()",
           describe());
  HT_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating tensors can require gradients, got {}",
           describe());
  autograd_meta().requires_grad = r;
  return *this;
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = autograd_meta_if_any();
  return m == nullptr || m->grad_fn == nullptr;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const AutogradMeta* m = autograd_meta_if_any();
  return m ? m->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& g) {
  HT_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient {} does not match tensor {}", g.describe(),
           describe());
  autograd_meta().grad = g;
}

void Tensor::zero_grad() {
  if (AutogradMeta* m = autograd_meta_if_any()) m->grad = Tensor();
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> kNone;
  const AutogradMeta* m = autograd_meta_if_any();
  return m ? m->grad_fn : kNone;
}

uint32_t Tensor::output_nr() const {
  const AutogradMeta* m = autograd_meta_if_any();
  return m ? m->output_nr : 0;
}

void Tensor::backward(const Tensor& grad, BackwardOptions opts) const { run_backward({*this}, {grad}, opts); }

Tensor Tensor::detach() const {
  return make_view(*this, shape(), strides(), offset());
}

void Tensor::register_hook(GradHook hook) {
  HT_CHECK(is_leaf() && requires_grad(), "register_hook: only leaf tensors that require grad take hooks, got {}",
           describe());
  autograd_meta().hooks.push_back(std::move(hook));
}

void Tensor::register_post_accumulate_hook(PostAccumulateHook hook) {
  HT_CHECK(is_leaf() && requires_grad(),
           "register_post_accumulate_hook: only leaf tensors that require grad take hooks, got {}", describe());
  autograd_meta().post_hooks.push_back(std::move(hook));
}

}  // namespace ht
