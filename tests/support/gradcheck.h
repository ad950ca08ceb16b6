// Finite-difference gradient check in fp64.
//
// gradcheck(f, inputs) forms L = sum(f(inputs) * R) with fixed random weights R (so every output element
// matters and errors cannot cancel), computes dL/dx for each input that requires grad with the autograd
// engine, and compares every element with the central difference (L(x + eps) - L(x - eps)) / (2 eps).
// Inputs must be contiguous f64 CPU tensors; build views inside f to test non-contiguous paths.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht::test {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-5;
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Empty string on success; otherwise which input and element disagree, with both values.
std::string gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

}  // namespace ht::test
