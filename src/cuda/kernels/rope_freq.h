// The angular frequency of rotation pair j of rotary embeddings, shared by the CPU reference (src/ops/rotary.cpp)
// and the CUDA kernel (dropout_rope.cu), which computes it per thread so that no table is copied to the device
// (a host-to-device copy would synchronise the stream and could not be recorded into a step graph).
// inv_freq[j] = theta^(-2j / D), then Llama 3's "llama3" scaling when `llama3` is set (ops/nn_ops.h, RopeScaling).
#pragma once
#include <cmath>
#include <cstdint>

#include "hadatrain/tensor/scalar_types.h"  // HT_HD

namespace ht::kernels {

struct RopeFreqArgs {
  double theta = 10000.0;
  int64_t head_dim = 0;
  int32_t llama3 = 0;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 1.0, original_max_position_embeddings = 1.0;
};

HT_HD inline double rope_inv_freq_at(const RopeFreqArgs& a, int64_t j) {
  double f = pow(a.theta, -2.0 * static_cast<double>(j) / static_cast<double>(a.head_dim));
  if (a.llama3 != 0) {
    const double wavelen = 2.0 * 3.14159265358979323846 / f;
    const double orig = a.original_max_position_embeddings;
    if (wavelen > orig / a.low_freq_factor) {
      f = f / a.factor;
    } else if (wavelen >= orig / a.high_freq_factor) {  // medium frequencies: blend scaled and unscaled
      const double s = (orig / wavelen - a.low_freq_factor) / (a.high_freq_factor - a.low_freq_factor);
      f = (1.0 - s) * f / a.factor + s * f;
    }
  }
  return f;
}

}  // namespace ht::kernels
