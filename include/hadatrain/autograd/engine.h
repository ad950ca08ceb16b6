// The backward engine: an iterative (non-recursive) walk of the graph in dependency order.
#pragma once
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht {

// Backpropagates from `roots` with the given output gradients (undefined = ones for one-element roots).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, BackwardOptions opts);

// Gradients of `outputs` with respect to `inputs`, returned instead of accumulated into .grad
// (undefined where an input is unreachable). Leaves' .grad are left untouched.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, BackwardOptions opts = {});

}  // namespace ht
