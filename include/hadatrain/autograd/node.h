// Autograd graph: a Node is the backward of one forward op; Edges point from a node to the nodes that
// produced its inputs. Saved tensors are stored detached (no history), so the graph has no cycles, and
// are released after the node runs unless retain_graph is set.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/tensor/tensor.h"

namespace ht {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;  // which gradient input of fn this edge feeds
  bool valid() const { return fn != nullptr; }
};

// True when `buffer`, a gradient buffer the engine offered (Node::apply_into), can take a kernel's result of this
// shape, dtype and device in place: defined, contiguous, and of that shape, dtype and device.
bool usable_grad_buffer(const Tensor& buffer, const Shape& shape, DType dtype, Device device);

class Node {
 public:
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  virtual ~Node();  // Note [Iterative graph destruction]

  virtual std::string name() const = 0;
  // Receives one gradient per forward output (undefined when an output received none) and returns one
  // gradient per next edge (undefined when an input needs none). Runs with grad mode off.
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Note [Gradients accumulated in place]
  // When an input's gradient has several contributions, the engine sums them as they arrive: the second one
  // costs a separate add that reads both and writes the sum (in a ResNet, one per residual block, a full pass
  // over the block's activations). A node whose kernel can add its result into an existing buffer (cuDNN's
  // backward data with beta = 1, the norm backward kernels; AccumulatingNode below) says so with
  // accepts_grad_buffers(); the engine then calls apply_into with
  // into[i] the gradient gathered so far for input i, where there is one that nothing else references
  // (undefined otherwise). A node that adds its gradient for input i into into[i] returns that same tensor as
  // its gradient i and the engine keeps it as the sum; any other return is summed as usual and into[i] must then
  // be left unchanged. The sum is the same; its rounding may differ (one rounding instead of two).
  virtual bool accepts_grad_buffers() const { return false; }
  virtual std::vector<Tensor> apply_into(std::vector<Tensor>&& grads, std::vector<Tensor>& /*into*/) {
    return apply(std::move(grads));
  }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  std::vector<Edge>& mutable_next_edges() { return next_edges_; }
  uint32_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(uint32_t n) { num_outputs_ = n; }
  // True when input i of the forward op needs a gradient (lets apply() skip work).
  bool needs_input_grad(std::size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }

  // Saves a tensor for backward (detached, counted on its storage: Note [Shared saved inputs]). Returns its slot.
  // When t is the output of a node that offers to rebuild it (offers_rebuild()), the slot keeps that node instead,
  // and saved() rebuilds t the first time it is read (Note [Recomputed outputs] in autograd/saved_tensor.h).
  std::size_t save(const Tensor& t);
  // A saved tensor; throws a clear error if the graph was already released by a backward pass.
  const Tensor& saved(std::size_t slot) const;
  virtual void release_saved();
  std::size_t saved_bytes() const;
  // The op's output rebuilt from what this node keeps, bit for bit the forward's (same kernels on the same
  // kept inputs), or undefined when the node cannot rebuild it (the default). Elementwise ops that keep their
  // input (gelu, silu, tanh, ...) and layer_norm can: a gradient pipeline then need not keep its own copy of that
  // output (Note [Rebuilt inputs] in autograd/saved_tensor.h). Throws like saved() once the node has run.
  virtual Tensor recompute_output() const { return Tensor(); }
  virtual bool can_recompute_output() const { return false; }
  // True when a tensor that is output `output_nr` of this node can be rebuilt by it: the node's only output, and
  // the node can rebuild it.
  bool rebuilds_output(uint32_t output_nr) const {
    return output_nr == 0 && num_outputs_ == 1 && can_recompute_output();
  }
  // True when an op that would keep this node's output for its own backward should keep the node instead and have
  // the output rebuilt when it reads it (Node::save): a product whose layer asks for it (recompute_output in its
  // pipeline spec), where rebuilding costs a forward GEMM and saves the output's memory (Note [Recomputed outputs]).
  // Implies can_recompute_output().
  virtual bool offers_rebuild() const { return false; }

 protected:
  std::vector<Edge> next_edges_;
  uint32_t num_outputs_ = 1;

 private:
  // A saved tensor, or (source set) the node that rebuilds it on its first read, with the shape and dtype it had.
  struct Slot {
    SavedTensor t;
    std::shared_ptr<Node> source;
    Shape shape;
    DType dtype = DType::f32;
  };
  mutable std::vector<Slot> saved_;  // saved() fills a rebuilt slot in
  bool released_ = false;
};

// A node whose backward on some device can add its input gradients into the engine's offered buffers (Note
// [Gradients accumulated in place]): apply() and apply_into() both land in run(), with no buffers or with the
// offer, and accepts_grad_buffers() is true when the node was made for a CUDA tensor (the kernels that accumulate
// are CUDA's; the CPU reference leaves the sum to the engine).
class AccumulatingNode : public Node {
 public:
  explicit AccumulatingNode(bool cuda) : cuda_(cuda) {}
  bool accepts_grad_buffers() const final { return cuda_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) final { return run(std::move(grads), {}); }
  std::vector<Tensor> apply_into(std::vector<Tensor>&& grads, std::vector<Tensor>& into) final {
    return run(std::move(grads), into);
  }

 protected:
  // into: empty, or one entry per next edge (undefined where nothing was offered).
  virtual std::vector<Tensor> run(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) = 0;

 private:
  bool cuda_;
};

}  // namespace ht
