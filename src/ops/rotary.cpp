// Rotary position embedding (RoPE) on x (B, H, T, D): each pair of channels (i0, i1) of position
// t = offset + index along dim 2 is rotated by angle (offset + t) * inv_freq[j], inv_freq[j] = theta^(-2j/D):
//   out[i0] = x[i0] cos - x[i1] sin,   out[i1] = x[i1] cos + x[i0] sin.
// RopeStyle::rotate_half (Hugging Face) pairs (j, j + D/2); RopeStyle::interleaved (llama2.c, Meta) pairs
// (2j, 2j + 1). RopeParams::scaling rescales inv_freq (Llama 3's "llama3" rope type, rope_inv_freq). Angles,
// cos and sin are computed in double. The rotation is orthogonal, so the backward
// is the same rotation by the negative angle; nothing is saved. The forward output is contiguous (B, H, T, D);
// the gradient of x is laid out like x was when x is a permutation of a dense layout, so that the gradient of
// the usual transpose(1, 2) view of a (B, T, H*D) projection reaches the projection without a copy.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "cuda/kernels/rope_freq.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/dropout_rope_glue.h"
#endif

namespace ht {
namespace {

kernels::RopeFreqArgs freq_args(const RopeParams& p, int64_t head_dim) {
  kernels::RopeFreqArgs a;
  a.theta = p.theta;
  a.head_dim = head_dim;
  if (p.scaling.type == RopeScalingType::llama3) {
    a.llama3 = 1;
    a.factor = p.scaling.factor;
    a.low_freq_factor = p.scaling.low_freq_factor;
    a.high_freq_factor = p.scaling.high_freq_factor;
    a.original_max_position_embeddings = static_cast<double>(p.scaling.original_max_position_embeddings);
  }
  return a;
}

enum class Direction { forward, inverse };  // inverse rotates by the negative angle (the backward)

// An uninitialised tensor of `shape` with the strides `like` when they are a permutation of a dense layout of
// that shape (every element once, no gaps), contiguous otherwise.
Tensor empty_in_layout(const Shape& shape, const Strides& like, const TensorOptions& o) {
  const int n = shape.size();
  std::vector<int> order(static_cast<std::size_t>(n));  // dims from the largest stride to the smallest
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return like[a] > like[b]; });
  int64_t expect = 1;
  bool dense = like.size() == n;
  for (int i = n - 1; i >= 0 && dense; --i) {
    const int d = order[static_cast<std::size_t>(i)];
    dense = like[d] == expect;
    expect *= shape[d];
  }
  if (!dense) return empty(shape, o);
  Shape stored = shape;
  Dims back = shape;
  for (int i = 0; i < n; ++i) {
    const int d = order[static_cast<std::size_t>(i)];
    stored[i] = shape[d];
    back[d] = i;
  }
  return empty(stored, o).permute(back);
}

// out = R(direction * angle) x, for x and out of any layouts (out written through its strides).
Tensor rotate(const Tensor& x, const RopeParams& p, Direction dir, Tensor out) {
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::rope(out, x, {freq_args(p, x.size(3)), p.position_offset, p.style == RopeStyle::interleaved,
                            dir == Direction::forward ? 1.0 : -1.0});
    return out;
#else
    no_cuda_kernel("rotary_embedding");
#endif
  }
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), half = D / 2;
  const double sign = dir == Direction::forward ? 1.0 : -1.0;
  std::vector<double> cos_t(static_cast<std::size_t>(T * half)), sin_t(cos_t.size());  // (T, D/2)
  const std::vector<double> inv_freq = rope_inv_freq(p, D);
  for (int64_t j = 0; j < half; ++j) {
    for (int64_t t = 0; t < T; ++t) {
      const double angle = static_cast<double>(p.position_offset + t) * inv_freq[static_cast<std::size_t>(j)];
      cos_t[static_cast<std::size_t>(t * half + j)] = std::cos(angle);
      sin_t[static_cast<std::size_t>(t * half + j)] = sign * std::sin(angle);
    }
  }
  const bool interleaved = p.style == RopeStyle::interleaved;
  const Strides& xs = x.strides();
  const Strides& os = out.strides();
  visit_floating(x.dtype(), "rotary_embedding", [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const Elem* in = cpu::ptr<Elem>(x);
    Elem* o = cpu::ptr<Elem>(out);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const Elem* row = in + b * xs[0] + h * xs[1] + t * xs[2];
          Elem* orow = o + b * os[0] + h * os[1] + t * os[2];
          for (int64_t j = 0; j < half; ++j) {
            const int64_t i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
            const double x0 = cpu::to_double(row[i0 * xs[3]]), x1 = cpu::to_double(row[i1 * xs[3]]);
            const double c = cos_t[static_cast<std::size_t>(t * half + j)];
            const double s = sin_t[static_cast<std::size_t>(t * half + j)];
            orow[i0 * os[3]] = cpu::convert<Elem>(x0 * c - x1 * s);
            orow[i1 * os[3]] = cpu::convert<Elem>(x1 * c + x0 * s);
          }
        }
  });
  return out;
}

// The rotation as an op: the result has the layout `result_like` gives (empty_in_layout), or is contiguous.
Tensor rotary(const Tensor& x, const RopeParams& p, Direction dir, const Strides* result_like) {
  const TensorOptions o{x.dtype(), x.device()};
  Tensor out = rotate(x.detach(), p, dir,
                      result_like != nullptr ? empty_in_layout(x.shape(), *result_like, o) : empty(x.shape(), o));
  const Direction back = dir == Direction::forward ? Direction::inverse : Direction::forward;
  record("RotaryEmbeddingBackward", {&x}, out,
         [p, back, x_strides = x.strides()](FunctionNode&, std::vector<Tensor>&& g) {
           return std::vector<Tensor>{rotary(g[0], p, back, &x_strides)};
         });
  return out;
}

}  // namespace

std::vector<double> rope_inv_freq(const RopeParams& p, int64_t head_dim) {
  const kernels::RopeFreqArgs a = freq_args(p, head_dim);
  std::vector<double> inv(static_cast<std::size_t>(head_dim / 2));
  for (int64_t j = 0; j < head_dim / 2; ++j) inv[static_cast<std::size_t>(j)] = kernels::rope_inv_freq_at(a, j);
  return inv;
}

Tensor rotary_embedding(const Tensor& x, const RopeParams& p) {
  HT_CHECK(x.dim() == 4, "rotary_embedding: expected x of shape (B, H, T, D), got {}", x.describe());
  HT_CHECK(x.size(3) % 2 == 0, "rotary_embedding: the head dim D must be even to form rotation pairs, got {}",
           x.describe());
  HT_CHECK(p.theta > 0.0 && std::isfinite(p.theta), "rotary_embedding: theta must be positive and finite, got {}",
           p.theta);
  HT_CHECK(p.position_offset >= 0, "rotary_embedding: position_offset must be >= 0, got {}", p.position_offset);
  if (p.scaling.type == RopeScalingType::llama3) {
    const RopeScaling& s = p.scaling;
    HT_CHECK(s.factor > 0.0 && s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor &&
                 s.original_max_position_embeddings > 0,
             "rotary_embedding: llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
             "original_max_position_embeddings > 0, got factor {}, low {}, high {}, original max {}",
             s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings);
  }
  check_floating("rotary_embedding", {&x});
  return rotary(x, p, Direction::forward, nullptr);
}

}  // namespace ht
