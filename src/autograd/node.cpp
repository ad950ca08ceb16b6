// Node: saved tensors, their release, and iterative destruction of long graphs.
#include "hadatrain/autograd/node.h"

#include "hadatrain/autograd/meta.h"

namespace ht {

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
  for (auto& t : saved_)
    if (t.defined()) t_pending_tensors.push_back(t.release());
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
  saved_.emplace_back(t.defined() ? t.detach() : Tensor());
  return saved_.size() - 1;
}

const Tensor& Node::saved(std::size_t slot) const {
  HT_CHECK(!released_,
           "{}: trying to run backward through the graph a second time (its saved tensors were freed after the "
           "first backward); pass BackwardOptions{{.retain_graph = true}} to the first backward call",
           name());
  HT_ASSERT(slot < saved_.size(), "{}: no saved tensor in slot {}", name(), slot);
  return saved_[slot].get();
}

void Node::release_saved() {
  saved_.clear();
  released_ = true;
}

std::size_t Node::saved_bytes() const {
  std::size_t n = 0;
  for (const auto& t : saved_)
    if (t.defined()) n += t.get().nbytes();
  return n;
}

}  // namespace ht
