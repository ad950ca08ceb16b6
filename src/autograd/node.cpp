// Node: saved tensors, their release, and iterative destruction of long graphs.
#include "hadatrain/autograd/node.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/autograd/meta.h"
#include "hadatrain/core/error.h"

namespace ht {

bool usable_grad_buffer(const Tensor& buffer, const Shape& shape, DType dtype, Device device) {
  return buffer.defined() && buffer.is_contiguous() && buffer.shape() == shape && buffer.dtype() == dtype &&
         buffer.device() == device;
}

// Note [Iterative graph destruction]
// A graph is a chain of shared_ptr<Node>: destroying the last tensor of a 10,000-op chain would destroy
// node N, which destroys node N-1, and so on, recursing 10,000 frames deep. Instead, a node's destructor
// moves its edges (and the tensors it saved, whose own grad_fn chains could recurse the same way) onto a
// thread-local pending list, and only the outermost destructor drains that list in a loop.
namespace {
thread_local bool t_draining = false;
thread_local std::vector<std::shared_ptr<Node>> t_pending_nodes;
thread_local std::vector<Tensor> t_pending_tensors;
}  // namespace

Node::~Node() {
  for (auto& e : next_edges_)
    if (e.fn) t_pending_nodes.push_back(std::move(e.fn));
  for (auto& s : saved_) {
    if (s.t.defined()) t_pending_tensors.push_back(s.t.release());
    if (s.source) t_pending_nodes.push_back(std::move(s.source));
  }
  if (t_draining) return;
  t_draining = true;
  while (!t_pending_nodes.empty() || !t_pending_tensors.empty()) {
    if (!t_pending_nodes.empty()) {
      auto n = std::move(t_pending_nodes.back());
      t_pending_nodes.pop_back();
      n.reset();
    } else {
      auto t = std::move(t_pending_tensors.back());
      t_pending_tensors.pop_back();
    }
  }
  t_draining = false;
}

std::size_t Node::save(const Tensor& t) {
  Slot s;
  const std::shared_ptr<Node> fn = t.defined() ? t.grad_fn() : nullptr;
  if (fn && fn.get() != this && fn->offers_rebuild() && fn->rebuilds_output(t.output_nr())) {
    s.source = fn;  // Note [Recomputed outputs]
    s.shape = t.shape();
    s.dtype = t.dtype();
  } else {
    s.t = SavedTensor(t.defined() ? t.detach() : Tensor());
  }
  saved_.push_back(std::move(s));
  return saved_.size() - 1;
}

const Tensor& Node::saved(std::size_t slot) const {
  HT_CHECK(!released_,
           "{}: trying to run backward through the graph a second time (its saved tensors were freed after the "
           "first backward); pass BackwardOptions{{.retain_graph = true}} to the first backward call",
           name());
  HT_ASSERT(slot < saved_.size(), "{}: no saved tensor in slot {}", name(), slot);
  Slot& s = saved_[slot];
  if (s.source) {
    // Rebuilt once and kept until this node's backward releases it (the source's kept tensors are still there: it
    // ran before this node in the forward, so its backward runs after this node's).
    Tensor t;
    {
      NoGradGuard no_grad;
      t = s.source->recompute_output();
    }
    HT_ASSERT(t.defined() && t.shape() == s.shape && t.dtype() == s.dtype,
              "{}: {} rebuilt its output as {}, expected {} {}", name(), s.source->name(), t.describe(),
              to_string(s.shape), dtype_name(s.dtype));
    s.t = SavedTensor(t.detach());
    s.source.reset();
  }
  return s.t.get();
}

void Node::release_saved() {
  saved_.clear();
  released_ = true;
}

std::size_t Node::saved_bytes() const {
  std::size_t n = 0;
  for (const auto& s : saved_)
    if (s.t.defined()) n += s.t.get().nbytes();
  return n;
}

}  // namespace ht
