// Inverted dropout: out[i] = keep(i) ? x[i] / (1 - p) : 0, where element i (row-major index over x's
// shape) is kept when uniform_from_word(philox_word(seed, stream, i)) >= p (Note [Philox stream layout]).
// Every call draws one fresh stream from the generator (Generator::draw: the counter's next id, or the step's next
// draw on a step-keyed generator, Note [Step-keyed streams]), also when p = 0 (then x is returned unchanged), so
// the streams later layers get do not depend on earlier layers' p.
//
// The mask is never stored: backward recomputes it from (seed, stream) and applies the same keep/scale to
// the incoming gradient (dropout is linear in x with a fixed mask). This saves one byte per element per
// layer and lets the CUDA kernel reuse one function for forward and backward.
//
// Keep test: uniform_from_word(w) is exactly k / 2^24 with k = w >> 8, so `u >= p` evaluated in double is
// exact, and a kernel may use the equivalent integer test k >= ceil(p * 2^24) to draw identical masks.
#include <cmath>

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/dropout_rope_glue.h"
#endif

namespace ht {
namespace {

struct DropoutMask {
  double p = 0;
  uint64_t seed = 0;
  uint64_t stream = 0;
  const int64_t* step_word = nullptr;  // CUDA only: the step added to stream when the kernel runs

  bool keep(int64_t i) const {
    const float u = uniform_from_word(philox_word(seed, stream, static_cast<uint64_t>(i)));
    return static_cast<double>(u) >= p;
  }
};

// out = mask(x) * 1/(1-p), for x of any layout; the mask index is the row-major position in x's shape.
Tensor apply_mask(const Tensor& x, const DropoutMask& m) {
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::dropout(out, x, m.p, m.seed, m.stream, m.step_word);
    return out;
#else
    no_cuda_kernel("dropout");
#endif
  }
  HT_CHECK(m.step_word == nullptr, "dropout: a CPU tensor {} with a generator keyed by a device step (the run's "
           "model is on CUDA)", x.describe());
  visit_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A scale = static_cast<A>(1.0 / (1.0 - m.p));
    const T zero = cpu::convert<T>(A(0));
    T* o = cpu::ptr<T>(out);
    const T* in = cpu::ptr<T>(x);
    int64_t i = 0;  // row-major element index (for_each_offset visits in row-major order)
    cpu::for_each_offset<2>(x.shape(), {out.strides(), x.strides()}, [&](const std::array<int64_t, 2>& off) {
      o[off[0]] = m.keep(i) ? cpu::convert<T>(cpu::convert<A>(in[off[1]]) * scale) : zero;
      ++i;
    });
  });
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, Generator& gen) {
  HT_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got {} (p = 1 would drop everything; use zeros)",
           p);
  check_floating("dropout", {&x});
  const RandomDraw d = gen.draw();  // Note [Step-keyed streams]
  const DropoutMask mask{p, d.seed, d.stream, d.step_word};
  if (p == 0.0) return x;
  Tensor out = apply_mask(x.detach(), mask);
  record("DropoutBackward", {&x}, out, [mask](FunctionNode&, std::vector<Tensor>&& g) {
    return std::vector<Tensor>{apply_mask(g[0], mask)};  // same mask and scale, recomputed
  });
  return out;
}

}  // namespace ht
