// Activation checkpointing: run a function (a transformer block) forward without keeping anything for
// backward, and run it again in backward to rebuild what its backward needs. Memory for a model's
// activations drops to the blocks' inputs, at the price of a second forward of each checkpointed block.
//
//   std::vector<Tensor> out = checkpoint([&](const std::vector<Tensor>& in) { return {block.forward(in[0])}; },
//                                        {x}, {.generators = {dropout_gen.get()}});
//
// Note [Checkpointed recompute]
// The forward runs with grad mode off, so no op inside records a node or keeps a tensor; the outputs get one
// CheckpointBackward node whose edges are the inputs'. Its backward runs the function again with grad mode on
// over detached copies of the saved inputs, then backpropagates the incoming gradients through that rebuilt
// graph: parameters used inside get their gradients accumulated into .grad as usual (their AccumulateGrad
// runs inside this node's backward), and the inputs' gradients are returned along the node's edges. Because
// parameter gradients are accumulated there and not captured, ht::grad() cannot ask for the gradient of a
// parameter used inside a checkpointed function; backward() (training) is what it is for.
// Random ops must draw the same numbers both times. Every random op draws a fresh stream from a Generator
// and its bits are a pure function of (seed, stream, element) (Note [Philox stream layout]), so rewinding the
// generators named in CheckpointOptions to their state at the forward makes the recompute draw the same
// streams, hence the same dropout masks, bit for bit; their state is put back afterwards. Gradient pipelines'
// stochastic rounding is keyed by (seed, layer, step, element) and needs nothing. The function must be
// deterministic otherwise (the same kernels on the same inputs give the same bits).
#pragma once
#include <functional>
#include <vector>

#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/tensor.h"

namespace ht {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

struct CheckpointOptions {
  // The generators the function draws from (dropout's): rewound for the recompute. Each must outlive the
  // backward pass.
  std::vector<Generator*> generators;
};

// fn(inputs), recomputed in backward instead of kept (Note [Checkpointed recompute]). With grad mode off it
// is simply fn(inputs). Outputs that are not floating point carry no history.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options = {});

}  // namespace ht
