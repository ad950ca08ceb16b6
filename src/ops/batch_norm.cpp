// Batch normalisation of x (N, C, ...) per channel, over every dim but dim 1 (M = N * spatial elements).
//   train: y = (x - mean_B) / sqrt(var_B + eps) * weight + bias with the batch mean and biased variance;
//          running stats are updated in place, running = (1 - m) * running + m * batch, where the running
//          variance takes the UNBIASED batch variance (var_B * M / (M - 1)), as PyTorch does.
//   eval:  the same map with running_mean / running_var instead of batch statistics (an affine map of x).
//   activation relu (BatchNormOptions::activation): y = relu(batch_norm(x)) exactly, rounding included (the
//          CPU rounds the affine map to x's dtype, then applies relu); its backward first masks g by (y > 0).
//   batch_norm_add_relu: relu(batch_norm(x) + residual) exactly (the add rounds as add does); the residual's
//          gradient is the masked g.
// Statistics accumulate in double on the CPU. One backward Node serves both modes; it is written with ops
// from the saved x, mean and invstd (see BatchNormBackward::apply for the formulas). The CPU saves the fused
// output (detached) for the ReLU mask; the CUDA kernels recompute the mask from x with the forward's
// arithmetic instead (no extra tensor saved), so the CUDA node saves the bias. The node can give its output again
// (Note [Rebuilt inputs]): the CPU's kept fused output, or on CUDA the forward's normalisation pass once more on the
// kept x, statistics, weight, bias and residual (cuda_ops::batch_norm_apply: the same kernel, the same bits).
#include <cmath>
#include <vector>

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/conv_pool_bn_glue.h"
#endif

namespace ht {
namespace {

struct BnGeom {
  int64_t C = 0;
  int64_t M = 0;     // elements per channel: N * prod(spatial dims)
  Dims reduce_dims;  // every dim but 1
  Shape stat_shape;  // (1, C, 1, ...): per-channel values broadcast against x
};

BnGeom bn_geom(const Tensor& x) {
  BnGeom g;
  g.C = x.size(1);
  g.M = g.C > 0 ? x.numel() / g.C : 0;
  for (int d = 0; d < x.dim(); ++d) {
    g.stat_shape.push_back(d == 1 ? g.C : 1);
    if (d != 1) g.reduce_dims.push_back(d);
  }
  return g;
}

void check_channel_tensor(const Tensor& t, const char* what, const Tensor& x, int64_t C) {
  if (!t.defined()) return;
  HT_CHECK(t.dim() == 1 && t.size(0) == C, "batch_norm: {} must have shape ({}) to match x {}, got {}", what, C,
           x.describe(), t.describe());
  HT_CHECK(is_floating(t.dtype()), "batch_norm: {} must be floating, got {}", what, t.describe());
}

// Calls f(offset_in_x, offset_in_out, channel) for every element of x; out is contiguous with x's shape.
// Elements are visited in row-major order of x, so per-channel sums add in the same order either way.
template <class F>
void for_each_channel_element(const Tensor& x, const Tensor& out, F&& f) {
  if (x.is_contiguous() && out.is_contiguous()) {  // (N, C, inner): plain loops, no offset bookkeeping
    const int64_t N = x.size(0), C = x.size(1), inner = N * C > 0 ? x.numel() / (N * C) : 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t base = (n * C + c) * inner;
        for (int64_t i = 0; i < inner; ++i) f(base + i, base + i, c);
      }
    return;
  }
  Strides chan;
  chan.resize(x.dim());
  chan[1] = 1;  // the "offset" of this operand is the channel index
  cpu::for_each_offset<3>(x.shape(), {x.strides(), out.strides(), chan},
                          [&](const std::array<int64_t, 3>& o) { f(o[0], o[1], o[2]); });
}

// Backward of batch_norm. With x_hat = (x - mean) * invstd and g_hat = g * weight (g without affine):
//   train: dx = invstd / M * (M * g_hat - sum(g_hat) - x_hat * sum(g_hat * x_hat))   (mean, invstd from the batch)
//   eval:  dx = g_hat * invstd                                                        (running stats are constants)
//   dweight = sum(g * x_hat), dbias = sum(g), sums over every dim but 1.
class BatchNormBackward final : public Node {
 public:
  BatchNormBackward(const BatchNormOptions& opts, BnGeom g, DType x_dt, DType w_dt, DType b_dt, bool residual)
      : mode_(opts.mode), act_(opts.activation), g_(std::move(g)), x_dt_(x_dt), w_dt_(w_dt), b_dt_(b_dt),
        residual_(residual) {}
  std::string name() const override {
    const bool relu = act_ == BatchNormActivation::relu;
    const std::string kind = residual_ ? "BatchNormAddRelu" : (relu ? "BatchNormRelu" : "BatchNorm");
    return kind + (mode_ == BatchNormMode::train ? "Backward" : "EvalBackward");
  }
  std::size_t residual_slot = static_cast<std::size_t>(-1);  // CUDA with a residual: for the mask

  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t x_slot = kNone, weight_slot = kNone, bias_slot = kNone, mean_slot = kNone, invstd_slot = kNone;
  std::size_t y_slot = kNone;  // CPU with a fused activation: the output (detached), for the mask
  bool rebuildable = false;    // every tensor recompute_output needs is kept (set by record_backward)

  bool can_recompute_output() const override { return rebuildable; }
  Tensor recompute_output() const override {
    if (!rebuildable) return Tensor();
    if (y_slot != kNone) return saved(y_slot);
#ifdef HADATRAIN_CUDA
    const Tensor& x = saved(x_slot);
    auto kept = [&](std::size_t slot) { return slot == kNone ? Tensor() : saved(slot); };
    Tensor out = empty(x.shape(), {x.dtype(), x.device()});
    cuda_ops::batch_norm_apply(
        x, {{saved(mean_slot), saved(invstd_slot)}, kept(weight_slot), kept(bias_slot), act_, kept(residual_slot)},
        out);
    return out;
#else
    return Tensor();
#endif
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return std::vector<Tensor>(residual_ ? 4 : 3);
#ifdef HADATRAIN_CUDA
    if (grads[0].is_cuda()) return cuda_backward(grads[0]);
#endif
    // (N, C, ...): relu's backward first, exactly as relu's own node computes it (g * (y > 0)).
    const Tensor g = y_slot == kNone ? grads[0] : mul(grads[0], to_dtype(gt(saved(y_slot), 0.0), grads[0].dtype()));
    const bool train = mode_ == BatchNormMode::train;
    const Tensor invstd = reshape(saved(invstd_slot), g_.stat_shape);  // (1, C, 1, ...)
    Tensor x_hat;  // (N, C, ...), only when a formula needs it
    if (needs_input_grad(1) || (train && needs_input_grad(0)))
      x_hat = mul(sub(saved(x_slot), reshape(saved(mean_slot), g_.stat_shape)), invstd);

    Tensor gx, gw, gb;
    if (needs_input_grad(0)) {
      const Tensor g_hat = weight_slot == kNone ? g : mul(g, reshape(saved(weight_slot), g_.stat_shape));
      if (train) {
        const double inv_m = 1.0 / static_cast<double>(g_.M);
        const Tensor mean_g = mul(sum(g_hat, g_.reduce_dims, KeepDim::yes), inv_m);              // (1, C, 1, ...)
        const Tensor mean_gx = mul(sum(mul(g_hat, x_hat), g_.reduce_dims, KeepDim::yes), inv_m);  // (1, C, 1, ...)
        gx = mul(sub(sub(g_hat, mean_g), mul(x_hat, mean_gx)), invstd);
      } else {
        gx = mul(g_hat, invstd);
      }
      gx = to_dtype(gx, x_dt_);
    }
    if (needs_input_grad(1)) gw = to_dtype(reshape(sum(mul(g, x_hat), g_.reduce_dims), {g_.C}), w_dt_);
    if (needs_input_grad(2)) gb = to_dtype(reshape(sum(g, g_.reduce_dims), {g_.C}), b_dt_);
    if (residual_) return {gx, gw, gb, needs_input_grad(3) ? g : Tensor()};  // add's backward: g' itself
    return {gx, gw, gb};
  }

 private:
#ifdef HADATRAIN_CUDA
  // The same formulas in fused kernels (cuda/kernels/batchnorm*.cu), in double.
  std::vector<Tensor> cuda_backward(const Tensor& g) {
    cuda_ops::BnBackwardArgs a;
    a.mode = mode_;
    if (x_slot != kNone) {
      a.x = saved(x_slot);
      a.mean = saved(mean_slot);
    }
    a.invstd = saved(invstd_slot);
    if (weight_slot != kNone) a.weight = saved(weight_slot);
    if (bias_slot != kNone) a.bias = saved(bias_slot);
    if (residual_slot != kNone) a.residual = saved(residual_slot);
    a.activation = act_;
    a.x_dtype = x_dt_;
    a.weight_dtype = w_dt_;
    a.bias_dtype = b_dt_;
    a.x_shape = g.shape();
    const cuda_ops::BnGrads r = cuda_ops::batch_norm_backward(
        g, a, {needs_input_grad(0), needs_input_grad(1), needs_input_grad(2), residual_ && needs_input_grad(3)});
    if (residual_) return {r.gx, r.gw, r.gb, r.gr};
    return {r.gx, r.gw, r.gb};
  }
#endif

  BatchNormMode mode_;
  BatchNormActivation act_;
  BnGeom g_;
  DType x_dt_, w_dt_, b_dt_;
  bool residual_;  // a fourth input (batch_norm_add_relu)
};

}  // namespace

namespace {

// batch_norm with an optional residual (undefined: none) added before the activation.
Tensor batch_norm_impl(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, const BatchNormOptions& opts) {
  const char* op = residual.defined() ? "batch_norm_add_relu" : "batch_norm";
  const Device dev = common_device(op, {&x, &residual, &weight, &bias, &running_mean, &running_var});
  HT_CHECK(x.dim() >= 2, "{}: expected x of shape (N, C, ...) with at least 2 dims, got {}", op, x.describe());
  check_floating(op, {&x});
  if (residual.defined()) {
    HT_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype(),
             "batch_norm_add_relu: residual must have x's shape and dtype, got x {} and residual {}", x.describe(),
             residual.describe());
    HT_CHECK(opts.activation == BatchNormActivation::relu, "batch_norm_add_relu: expected activation relu");
  }
  const BnGeom geom = bn_geom(x);
  const int64_t C = geom.C, M = geom.M;
  check_channel_tensor(weight, "weight", x, C);
  check_channel_tensor(bias, "bias", x, C);
  check_channel_tensor(running_mean, "running_mean", x, C);
  check_channel_tensor(running_var, "running_var", x, C);
  HT_CHECK(running_mean.defined() == running_var.defined(),
           "batch_norm: pass both running_mean and running_var or neither (got running_mean {}, running_var {})",
           running_mean.defined() ? "defined" : "undefined", running_var.defined() ? "defined" : "undefined");
  const bool train = opts.mode == BatchNormMode::train;
  const bool has_running = running_mean.defined();
  HT_CHECK(train || has_running,
           "batch_norm: eval mode normalises with running_mean and running_var, but they are undefined; pass "
           "them or use BatchNormMode::train");
  HT_CHECK(opts.eps > 0, "batch_norm: eps must be positive, got {}", opts.eps);
  if (train) {
    HT_CHECK(M > 1, "batch_norm: train mode needs more than 1 value per channel, got x {} ({} per channel)",
             x.describe(), M);
    HT_CHECK(opts.momentum >= 0 && opts.momentum <= 1, "batch_norm: momentum must be in [0, 1], got {}",
             opts.momentum);
  }
  if (has_running) {
    HT_CHECK(!running_mean.requires_grad() && !running_var.requires_grad(),
             "batch_norm: running_mean and running_var are buffers updated in place and must not require grad");
  }
  const Tensor& counter = opts.num_batches_tracked;
  if (train && counter.defined()) {
    HT_CHECK(counter.dtype() == DType::i64 && counter.numel() == 1 && counter.is_contiguous() &&
                 counter.device() == dev,
             "batch_norm: num_batches_tracked must be one i64 element on {}, got {}", to_string(dev),
             counter.describe());
    if (!x.is_cuda()) {
      NoGradGuard no_grad;
      copy_(counter, add(counter, 1.0));
    }
  }

  Tensor out = empty(x.shape(), {x.dtype(), dev});  // (N, C, ...)

  const bool fused = opts.activation != BatchNormActivation::none;

  // Connects the backward node; mean_t / invstd_t are the statistics used, (C) in any floating dtype, never
  // views of the running stats (later in-place updates must not change them). CUDA: the f64 tensors of the
  // forward as they are (C values; no conversion launches); CPU: in stat_dt.
  auto record_backward = [&](const Tensor& mean_t, const Tensor& invstd_t) {
    if (!needs_grad({&x, &weight, &bias, &residual})) return;
    auto node = std::make_shared<BatchNormBackward>(opts, geom, x.dtype(),
                                                    weight.defined() ? weight.dtype() : x.dtype(),
                                                    bias.defined() ? bias.dtype() : x.dtype(), residual.defined());
    const DType stat_dt = x.is_cuda() ? mean_t.dtype() : (x.dtype() == DType::f64 ? DType::f64 : DType::f32);
    const bool x_grad = needs_grad({&x}), w_grad = needs_grad({&weight});
    const bool cuda_mask = fused && x.is_cuda();  // the CUDA backward recomputes the mask from x
    if (w_grad || (train && x_grad) || cuda_mask) {
      node->x_slot = node->save(x);
      node->mean_slot = node->save(to_dtype(mean_t, stat_dt));
    }
    node->invstd_slot = node->save(to_dtype(invstd_t, stat_dt));
    if (weight.defined() && (x_grad || cuda_mask)) node->weight_slot = node->save(weight);
    if (bias.defined() && x.is_cuda()) node->bias_slot = node->save(bias);  // the mask, and recompute_output
    if (residual.defined() && cuda_mask) node->residual_slot = node->save(residual.detach());
    if (fused && !x.is_cuda()) node->y_slot = node->save(out.detach());
    constexpr std::size_t none = BatchNormBackward::kNone;
    const auto kept_if = [](const Tensor& t, std::size_t slot) { return !t.defined() || slot != none; };
    node->rebuildable = x.is_cuda() ? node->x_slot != none && kept_if(weight, node->weight_slot) &&
                                          kept_if(bias, node->bias_slot) && kept_if(residual, node->residual_slot)
                                    : node->y_slot != none;
    if (residual.defined()) connect(node, {&x, &weight, &bias, &residual}, {&out});
    else connect(node, {&x, &weight, &bias}, {&out});
  };

  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    auto detached = [](const Tensor& t) { return t.defined() ? t.detach() : Tensor(); };
    const cuda_ops::BnStats st = cuda_ops::batch_norm_forward(x.detach(), detached(weight), detached(bias), running_mean,
                                                              running_var, opts, detached(residual), out);
    record_backward(st.mean, st.invstd);
    return out;
#else
    no_cuda_kernel(op);
#endif
  }

  // Per-channel statistics (C), in double.
  std::vector<double> mean(static_cast<std::size_t>(C), 0.0), invstd(static_cast<std::size_t>(C), 0.0);
  if (train) {
    std::vector<double> var(static_cast<std::size_t>(C), 0.0);
    visit_floating(x.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* px = cpu::ptr<T>(x);
      for_each_channel_element(x, out, [&](int64_t ix, int64_t, int64_t c) {
        mean[static_cast<std::size_t>(c)] += cpu::to_double(px[ix]);
      });
      for (double& m : mean) m /= static_cast<double>(M);
      for_each_channel_element(x, out, [&](int64_t ix, int64_t, int64_t c) {
        const double d = cpu::to_double(px[ix]) - mean[static_cast<std::size_t>(c)];
        var[static_cast<std::size_t>(c)] += d * d;
      });
    });
    for (std::size_t c = 0; c < var.size(); ++c) {
      var[c] /= static_cast<double>(M);  // biased: normalisation uses the population variance
      invstd[c] = 1.0 / std::sqrt(var[c] + opts.eps);
    }
    if (has_running) {
      NoGradGuard no_grad;
      const double m = opts.momentum, unbias = static_cast<double>(M) / static_cast<double>(M - 1);
      std::vector<double> rm = running_mean.to_vector<double>(), rv = running_var.to_vector<double>();
      for (std::size_t c = 0; c < rm.size(); ++c) {
        rm[c] = (1.0 - m) * rm[c] + m * mean[c];
        rv[c] = (1.0 - m) * rv[c] + m * var[c] * unbias;
      }
      copy_(running_mean, from_vector(rm, {C}, {DType::f64, dev}));
      copy_(running_var, from_vector(rv, {C}, {DType::f64, dev}));
    }
  } else {
    mean = running_mean.to_vector<double>();
    const std::vector<double> rv = running_var.to_vector<double>();
    for (std::size_t c = 0; c < rv.size(); ++c) {
      HT_CHECK(rv[c] + opts.eps > 0, "batch_norm: running_var[{}] + eps = {} is not positive", c, rv[c] + opts.eps);
      invstd[c] = 1.0 / std::sqrt(rv[c] + opts.eps);
    }
  }

  // y = act((x - mean) * invstd * weight + bias [+ residual]), each step rounded to T as the separate ops do
  const Tensor rc = residual.defined() ? contiguous(residual) : Tensor();  // offsets as in out
  const std::vector<double> w = weight.defined() ? weight.to_vector<double>() : std::vector<double>(mean.size(), 1.0);
  const std::vector<double> b = bias.defined() ? bias.to_vector<double>() : std::vector<double>(mean.size(), 0.0);
  visit_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;  // the add op's arithmetic type
    const T* px = cpu::ptr<T>(x);
    const T* pr = rc.defined() ? cpu::ptr<T>(rc) : nullptr;
    T* po = cpu::ptr<T>(out);
    for_each_channel_element(x, out, [&](int64_t ix, int64_t io, int64_t c) {
      const auto k = static_cast<std::size_t>(c);
      po[io] = cpu::convert<T>((cpu::to_double(px[ix]) - mean[k]) * invstd[k] * w[k] + b[k]);
      if (pr) po[io] = cpu::convert<T>(cpu::convert<A>(po[io]) + cpu::convert<A>(pr[io]));
      if (fused) {  // relu, as the relu op computes it: NaN propagates
        const double v = cpu::to_double(po[io]);
        if (!(v > 0 || v != v)) po[io] = cpu::convert<T>(0.0);
      }
    });
  });

  const DType stat_dt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  record_backward(from_vector(mean, {C}, {stat_dt, dev}), from_vector(invstd, {C}, {stat_dt, dev}));
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& opts) {
  return batch_norm_impl(x, Tensor(), weight, bias, running_mean, running_var, opts);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const BatchNormParams& p,
                           const BatchNormOptions& opts) {
  HT_CHECK(residual.defined(), "batch_norm_add_relu: residual is undefined");
  BatchNormOptions o = opts;
  o.activation = BatchNormActivation::relu;
  return batch_norm_impl(x, residual, p.weight, p.bias, p.running_mean, p.running_var, o);
}

}  // namespace ht
