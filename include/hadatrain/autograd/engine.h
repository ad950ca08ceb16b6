// The backward engine: an iterative (non-recursive) walk of the graph in dependency order.
#pragma once
#include <cstdint>
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht {

// Backpropagates from `roots` with the given output gradients (undefined = ones for one-element roots).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, BackwardOptions opts);

// Gradients of `outputs` with respect to `inputs`, returned instead of accumulated into .grad
// (undefined where an input is unreachable). Leaves' .grad are left untouched.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, BackwardOptions opts = {});

// How many gradients, since the process started, a node added into the buffer the engine offered it instead of
// the engine summing them (Note [Gradients accumulated in place] in autograd/node.h): lets tests and benchmarks
// see that the path ran.
int64_t grads_accumulated_in_place();

}  // namespace ht
