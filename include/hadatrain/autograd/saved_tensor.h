// A tensor kept for backward, counted on its storage (StorageImpl::graph_saves) while it is kept.
//
// Note [Shared saved inputs]
// An op's backward often keeps a tensor that a later product takes as its input: the packed attention keeps
// its output o, which is the input of the attention's output projection. A gradient pipeline that would store
// a compressed copy of that input (HLQ's ACBP) adds memory instead of saving it: the full tensor stays alive
// for the other op anyway. Every tensor kept for backward (Node::save, and the pipelines' own saved states) is
// a SavedTensor, which counts itself on its storage while it lives; kept_for_backward(t) tells a pipeline's
// forward that t's memory is already kept, so it can keep a reference instead and compress in backward (the
// same bits: the compression of x is deterministic). The count only sees tensors kept *before* the check: an
// op that keeps the input later in the forward (a ResNet block's residual, kept by the block's last batch
// norm after conv1 read it) is not seen.
//
// Note [Rebuilt inputs]
// The other case: the input is not kept, but the op that produced it keeps what it needs to produce it again.
// A ViT's fc2 reads gelu(z), and the gelu node keeps z for its own backward; the gelu output itself is freed after
// fc2's forward (qkv and fc1 likewise read LayerNorm outputs, whose node keeps its input, weight and statistics).
// Node::recompute_output() returns such an op's output again, bit for bit (the same forward on the same kept
// input; FunctionNode's Rebuild, set by the unary ops, LayerNormBackward, the CUDA BatchNormBackward through the
// forward's normalisation pass, and a reshape of any of those). nn::Linear and nn::Conv2d hand the node to their
// product (grad::ProductInfo::rebuild) when their input is that node's only output; HLQ with acbp_rebuild keeps the
// node instead of a compressed copy and, in backward, rebuilds the input and compresses it as the forward would have
// (same bits). The node's kept tensors are released only after its own backward, which runs after the
// consuming layer's (the op runs before the layer in the forward), so they are there when the layer needs them.
//
// Note [Recomputed outputs]
// The other direction: an op that keeps its input for its own backward, when that input is a product's output. A
// ViT's gelu keeps its input z = fc1(x) (4·D per token, the largest tensor a block keeps) and the packed attention
// keeps qkv(x) (3·D per token); with HLQ the products themselves keep nothing (Note [Rebuilt inputs]), so these are
// most of what a block keeps. A Linear whose pipeline spec sets recompute_output offers its output: its product node
// keeps what runs the forward product again (the input, by reference when another op keeps it, else its rebuild; the
// weight and the bias, which it keeps anyway) and says so (Node::offers_rebuild, passed on by a reshape). Node::save
// then keeps that node instead of the tensor, and Node::saved rebuilds the tensor on its first read and keeps it
// until the reading node's backward: the gelu's output, rebuilt for fc2's backward, and the gelu's own backward
// share one rebuild of z. The price is one forward GEMM per layer in backward (and the rebuild of its input); the
// bits are the forward's (the same GEMM on the same operands). The product's node is released only after its own
// backward, which runs after every op that read its output.
// The saving holds when the product's input is kept or rebuilt from kept tensors (a ViT's fc1 and qkv read LayerNorm
// outputs, and a LayerNorm keeps its input). In a chain of such layers (Linear -> gelu -> Linear -> gelu ..., every
// Linear recomputing) the first read rebuilds the whole chain, and each gelu keeps its rebuilt input until its own
// backward: the memory comes back, and the time is spent anyway. Hence it is a per-layer option, not a default.
#pragma once
#include <utility>

#include "hadatrain/tensor/tensor.h"

namespace ht {

class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(Tensor t) : t_(std::move(t)) { count(+1); }
  SavedTensor(const SavedTensor&) = delete;
  SavedTensor& operator=(const SavedTensor&) = delete;
  SavedTensor(SavedTensor&& o) noexcept : t_(std::move(o.t_)) { o.t_ = Tensor(); }
  SavedTensor& operator=(SavedTensor&& o) noexcept {
    if (this != &o) {
      reset();
      t_ = std::move(o.t_);
      o.t_ = Tensor();
    }
    return *this;
  }
  ~SavedTensor() { reset(); }

  const Tensor& get() const { return t_; }
  bool defined() const { return t_.defined(); }
  // Stops counting and hands the tensor over (the caller decides when it dies).
  Tensor release() {
    count(-1);
    Tensor t = std::move(t_);
    t_ = Tensor();
    return t;
  }
  void reset() { release(); }

 private:
  void count(int32_t d) const {
    if (t_.defined() && t_.storage()) t_.storage()->graph_saves.fetch_add(d, std::memory_order_relaxed);
  }
  Tensor t_;
};

// True when a tensor kept for backward holds t's storage now (Note [Shared saved inputs]).
inline bool kept_for_backward(const Tensor& t) {
  return t.defined() && t.storage() && t.storage()->graph_saves.load(std::memory_order_relaxed) > 0;
}

}  // namespace ht
