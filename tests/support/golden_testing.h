// Golden tests against PyTorch (tests/cpu/test_golden*.cpp): a model whose parameters are filled by the closed
// formula of tools/golden/make_fixtures.py, run in float64 on the fixture's batch, against the fixture's logits,
// loss, batch-norm running statistics, and every parameter's gradient norm and 32 sampled gradient elements.
#pragma once
#include <string>

#include "hadatrain/nn/module.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::test {

// The value formula_values() of tools/golden/make_fixtures.py gives parameter `name` of `shape`, as f64.
Tensor golden_formula_values(const std::string& name, const Shape& shape);

// Fills `model` (converted to f64) by the formula, runs it in training mode on the fixture's x and labels with
// cross-entropy (label smoothing as the script used), and checks everything the fixture holds (Catch CHECKs).
// The fixture path is relative to the repository root (the tests' working directory). grad_atol: the absolute
// tolerance of the sampled gradient elements (beside a relative 1e-7), the float64 rounding floor of gradients that
// cancel to almost nothing: about 1e-11 through a ResNet-50 (its stem's bn1.bias gradient is ~1e-11, the sum of
// terms near 1e-3), far below 1e-12 in the small models.
void check_against_golden(nn::Module& model, const std::string& fixture, double label_smoothing,
                          double grad_atol = 1e-12);

}  // namespace ht::test
