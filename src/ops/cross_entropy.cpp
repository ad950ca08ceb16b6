// cross_entropy(logits (N, C), target (N)) with ignore_index, label smoothing and none / mean / sum
// reduction, with PyTorch's F.cross_entropy semantics:
//   lse_i  = log sum_c exp(logits_ic)
//   loss_i = (1 - ls) * (lse_i - logits_{i,t_i}) + ls * (lse_i - mean_c logits_ic)   (-log p = lse - logit)
//   loss_i = 0 for rows whose target is ignore_index; mean divides by the number of other rows (NaN when
//   every row is ignored, as PyTorch gives).
// The loss is f32 (f64 for f64 logits). Fused backward, one Node and one pass over the logits (it becomes one
// kernel on the GPU):
//   g_ic = scale_i * (softmax_ic - q_ic),   q_ic = (1 - ls) * [c == t_i] + ls / C   (the target distribution)
//   scale_i = g_i (none), g (sum), g / count (mean); 0 for ignored rows.
// The forward saves the logits, the targets and lse (N), so the backward needs no second reduction.
#include <cmath>
#include <utility>
#include <vector>

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/rows_glue.h"
#endif

namespace ht {
namespace {

// g_logits (N, C) in the logits dtype. g: (N) for Reduction::none, () otherwise. lse (N).
// count: the number of counted rows, an f64 scalar on the logits' device.
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const CrossEntropyOptions& opts, const Tensor& count) {
  const int64_t n = logits.size(0), c = logits.size(1);
  if (logits.is_cuda()) {
#ifdef HADATRAIN_CUDA
    return cuda_ops::cross_entropy_backward(g, logits, target, lse, opts, count);  // one fused kernel
#else
    no_cuda_kernel("cross_entropy_backward");
#endif
  }
  Tensor gx = empty(logits.shape(), {logits.dtype(), logits.device()});  // (N, C)
  const std::vector<double> gv = g.to_vector<double>();        // (N) or (1)
  const std::vector<int64_t> tv = target.to_vector<int64_t>();  // (N)
  const std::vector<double> lv = lse.to_vector<double>();       // (N)
  const double ls = opts.label_smoothing;
  const double inv_count = 1.0 / count.item();
  const int64_t s0 = logits.stride(0), s1 = logits.stride(1);
  visit_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(logits);
    T* pg = cpu::ptr<T>(gx);
    for (int64_t i = 0; i < n; ++i) {
      const auto iu = static_cast<std::size_t>(i);
      const int64_t t = tv[iu];
      T* row = pg + i * c;
      if (t == opts.ignore_index) {
        for (int64_t k = 0; k < c; ++k) row[k] = cpu::convert<T>(0.0);
        continue;
      }
      double scale = 0.0;
      switch (opts.reduction) {
        case Reduction::none: scale = gv[iu]; break;
        case Reduction::sum: scale = gv[0]; break;
        case Reduction::mean: scale = gv[0] * inv_count; break;
      }
      for (int64_t k = 0; k < c; ++k) {
        const double p = std::exp(cpu::to_double(px[i * s0 + k * s1]) - lv[iu]);
        const double q = (k == t ? 1.0 - ls : 0.0) + ls / static_cast<double>(c);
        row[k] = cpu::convert<T>(scale * (p - q));
      }
    }
  });
  return gx;
}

class CrossEntropyBackward final : public Node {
 public:
  CrossEntropyBackward(const CrossEntropyOptions& opts, Tensor count) : opts_(opts), count_(std::move(count)) {}
  std::string name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!needs_input_grad(0)) return {Tensor()};
    return {cross_entropy_backward(grads[0], saved(0), saved(1), saved(2), opts_, count_)};
  }

 private:
  CrossEntropyOptions opts_;
  Tensor count_;  // () f64 on the logits' device
};

// The CPU reference: fills lse and out, returns the number of counted rows.
int64_t cross_entropy_cpu(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& target,
                          const CrossEntropyOptions& opts) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const DType loss_dt = lse.dtype();
  const std::vector<int64_t> tv = target.to_vector<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tv[static_cast<std::size_t>(i)];
    if (t == opts.ignore_index) continue;
    HT_CHECK(t >= 0 && t < c,
             "cross_entropy: target[{}] = {} is out of range for {} classes (expected 0..{}, or ignore_index {})", i,
             t, c, c - 1, opts.ignore_index);
    ++count;
  }

  const double ls = opts.label_smoothing;
  std::vector<double> loss(static_cast<std::size_t>(n), 0.0), lse_v(static_cast<std::size_t>(n), 0.0);
  const int64_t s0 = logits.stride(0), s1 = logits.stride(1);
  visit_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(logits);
    for (int64_t i = 0; i < n; ++i) {
      const auto iu = static_cast<std::size_t>(i);
      double m = -INFINITY, total = 0.0;
      for (int64_t k = 0; k < c; ++k) {
        const double v = cpu::to_double(px[i * s0 + k * s1]);
        m = std::max(m, v);
        total += v;
      }
      double s = 0.0;
      for (int64_t k = 0; k < c; ++k) s += std::exp(cpu::to_double(px[i * s0 + k * s1]) - m);
      lse_v[iu] = m + std::log(s);
      const int64_t t = tv[iu];
      if (t == opts.ignore_index) continue;
      const double nll = lse_v[iu] - cpu::to_double(px[i * s0 + t * s1]);
      const double smooth = lse_v[iu] - total / static_cast<double>(c);
      // Without smoothing the smooth term is skipped, so a -inf logit off the target gives a finite loss.
      loss[iu] = (1.0 - ls) * nll + (ls > 0.0 ? ls * smooth : 0.0);
    }
  });

  visit_floating(loss_dt, "cross_entropy", [&](auto tag) {
    using L = typename decltype(tag)::type;
    L* pl = cpu::ptr<L>(lse);
    for (int64_t i = 0; i < n; ++i) pl[i] = cpu::convert<L>(lse_v[static_cast<std::size_t>(i)]);
    L* po = cpu::ptr<L>(out);
    if (opts.reduction == Reduction::none) {
      for (int64_t i = 0; i < n; ++i) po[i] = cpu::convert<L>(loss[static_cast<std::size_t>(i)]);
      return;
    }
    double total = 0.0;
    for (double v : loss) total += v;
    po[0] = cpu::convert<L>(opts.reduction == Reduction::mean ? total / static_cast<double>(count) : total);
  });
  return count;
}

void check_inputs(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts) {
  common_device("cross_entropy", {&logits, &target});
  check_floating("cross_entropy", {&logits});
  HT_CHECK(logits.dim() == 2, "cross_entropy: expected logits of shape (N, C), got {}", logits.describe());
  HT_CHECK(logits.size(1) > 0, "cross_entropy: logits {} have no classes (C = 0)", logits.describe());
  HT_CHECK(target.dtype() == DType::i32 || target.dtype() == DType::i64,
           "cross_entropy: expected integer class ids (i32 or i64) as target, got {}", target.describe());
  HT_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
           "cross_entropy: expected target of shape ({}) to match logits {}, got {}", logits.size(0),
           logits.describe(), target.describe());
  HT_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0,
           "cross_entropy: label_smoothing must be in [0, 1], got {}", opts.label_smoothing);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts) {
  check_inputs(logits, target, opts);
  const int64_t n = logits.size(0);
  const DType loss_dt = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor lse = empty({n}, {loss_dt, logits.device()});  // (N)
  Tensor out = empty(opts.reduction == Reduction::none ? Shape{n} : Shape{}, {loss_dt, logits.device()});
  Tensor count;  // () f64: the rows mean divides by
  if (logits.is_cuda()) {
#ifdef HADATRAIN_CUDA
    count = cuda_ops::cross_entropy(out, lse, logits, target, opts);  // targets checked on the device
#else
    no_cuda_kernel("cross_entropy");
#endif
  } else {
    count = full({}, static_cast<double>(cross_entropy_cpu(out, lse, logits, target, opts)), {DType::f64});
  }

  if (needs_grad({&logits})) {
    auto node = std::make_shared<CrossEntropyBackward>(opts, count);
    node->save(logits);
    node->save(target);
    node->save(lse);
    connect(node, {&logits}, {&out});
  }
  return out;
}

void check_deferred_targets(Device device) {
  if (!device.is_cuda()) return;
#ifdef HADATRAIN_CUDA
  cuda_ops::check_deferred_targets(device.index);
#endif
}

}  // namespace ht
