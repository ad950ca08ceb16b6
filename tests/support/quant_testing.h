// Helpers shared by the CPU quantiser tests (test_grad_quant.cpp, test_grad_quant_outputs.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "hadatrain/grad/quant.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::test {

// The values of t as doubles, row-major.
inline std::vector<double> values_of(const Tensor& t) { return t.to_vector<double>(); }

// A QuantSpec from its main fields (the others default).
inline grad::QuantSpec spec_of(int bits, grad::Granularity g, grad::ScaleRule rule, grad::Rounding r,
                               int64_t block = 1, grad::Noise noise = {}) {
  grad::QuantSpec s;
  s.bits = bits;
  s.granularity = g;
  s.scale_rule = rule;
  s.rounding = r;
  s.hadamard_block = block;
  s.noise = noise;
  return s;
}

}  // namespace ht::test
