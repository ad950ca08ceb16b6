// layer_norm over the last dim (size D), as PyTorch defines it:
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps),   var biased (divides by D)
// weight and bias (D) are each optional (undefined). The CPU reference computes mean and var in double (two
// passes) and saves mean and rstd, shape (..., 1), f32 (f64 for f64 input), for the backward:
//   xhat = (x - mean) * rstd,   gh = g * weight
//   gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))          (means over the last dim)
//   gweight = sum over rows of g * xhat,   gbias = sum over rows of g
// CUDA: forward and backward are row kernels (cuda/kernels/rows_norm*.cu); the parameter gradients are a column
// reduction with per-split partial sums added in a fixed order (deterministic).
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/lines.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/rows_glue.h"
#endif

namespace ht {
namespace {

void check_affine(const Tensor& p, const char* what, const Tensor& x) {
  if (!p.defined()) return;
  HT_CHECK(p.dim() == 1 && p.size(0) == x.shape().back(),
           "layer_norm: expected {} of shape ({}) to match the last dim of x {}, got {}", what, x.shape().back(),
           x.describe(), p.describe());
  check_floating("layer_norm", {&p});
}

// out = layer_norm(x) with its statistics (mu, rstd): the forward's computation, defined below.
std::array<Tensor, 3> layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

// On CUDA, g_x is added into x's gradient gathered so far (the residual stream's other branch) by the backward
// kernel itself (Note [Gradients accumulated in place]).
class LayerNormBackward final : public AccumulatingNode {
 public:
  LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps)
      : AccumulatingNode(x.is_cuda()),
        bias_(bias.defined() ? bias.detach() : Tensor()),
        eps_(eps),
        rebuildable_(x.requires_grad() || !weight.defined()),
        d_(x.shape().back()),
        x_dtype_(x.dtype()),
        w_dtype_(weight.defined() ? weight.dtype() : x.dtype()),
        b_dtype_(bias.defined() ? bias.dtype() : x.dtype()) {}
  std::string name() const override { return "LayerNormBackward"; }
  // saved: x (0), weight (1, may be undefined), mean (2), rstd (3)

  // Note [Rebuilt inputs]: the output is the forward again on the kept x with the same weight, bias and eps: the
  // same kernel (CUDA) or loop (CPU) on the same input, the same bits. Needs the weight, which the node keeps
  // whenever x needs a gradient (always inside a network).
  bool can_recompute_output() const override { return rebuildable_; }
  Tensor recompute_output() const override {
    return rebuildable_ ? layer_norm_forward(saved(0), saved(1), bias_, eps_)[0] : Tensor();
  }

 private:
  std::vector<Tensor> run(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) override {
    const Tensor& mu = saved(2);    // (..., 1)
    const Tensor& rstd = saved(3);  // (..., 1)
    if (mu.is_cuda()) {
#ifdef HADATRAIN_CUDA
      const Tensor& x = saved(0);
      const bool acc = needs_input_grad(0) && !into.empty() &&
                       usable_grad_buffer(into[0], x.shape(), x.dtype(), x.device());
      const cuda_ops::NormGrads r = cuda_ops::norm_backward(
          kernels::NormKind::layer, grads[0], x, saved(1), mu, rstd,
          {needs_input_grad(0), needs_input_grad(1), needs_input_grad(2), w_dtype_, b_dtype_},
          acc ? into[0] : Tensor());
      return {r.gx, r.gw.defined() ? to_dtype(r.gw, w_dtype_) : Tensor(),
              r.gb.defined() ? to_dtype(r.gb, b_dtype_) : Tensor()};
#endif
    }
    const DType cd = mu.dtype();
    const Tensor g = to_dtype(grads[0], cd);
    const Tensor xhat = mul(sub(to_dtype(saved(0), cd), mu), rstd);  // (..., D)
    Tensor gx, gw, gb;
    if (needs_input_grad(0)) {
      const Tensor& w = saved(1);
      const Tensor gh = w.defined() ? mul(g, to_dtype(w, cd)) : g;
      const Tensor centred = sub(sub(gh, mean(gh, {-1}, KeepDim::yes)), mul(xhat, mean(mul(gh, xhat), {-1}, KeepDim::yes)));
      gx = to_dtype(mul(rstd, centred), x_dtype_);
    }
    if (needs_input_grad(1)) gw = to_dtype(sum_to(mul(g, xhat), {d_}), w_dtype_);
    if (needs_input_grad(2)) gb = to_dtype(sum_to(g, {d_}), b_dtype_);
    return {gx, gw, gb};
  }

  Tensor bias_;  // the forward's bias (a D-sized parameter or its cast), for recompute_output
  double eps_;
  bool rebuildable_;  // saved(1) is the forward's weight (kept when x needs a gradient), or there is none
  int64_t d_;
  DType x_dtype_, w_dtype_, b_dtype_;
};

// The CPU reference: fills out, mu and rstd.
void layer_norm_cpu(const Tensor& out, const Tensor& mu, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, double eps) {
  const int last = x.dim() - 1;
  const int64_t d = x.shape().back();
  const std::vector<double> w = weight.defined() ? weight.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(d), 1.0);
  const std::vector<double> b = bias.defined() ? bias.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(d), 0.0);
  const int64_t sx = x.stride(last), so = out.stride(last);
  visit_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* px = cpu::ptr<T>(x);
    T* po = cpu::ptr<T>(out);
    S* pm = cpu::ptr<S>(mu);
    S* pr = cpu::ptr<S>(rstd);
    cpu::for_each_line<4>(x.shape(), last, {x.strides(), out.strides(), mu.strides(), rstd.strides()},
                          [&](const std::array<int64_t, 4>& base) {
                            double s = 0.0;
                            for (int64_t j = 0; j < d; ++j) s += cpu::to_double(px[base[0] + j * sx]);
                            const double m = s / static_cast<double>(d);
                            double ss = 0.0;
                            for (int64_t j = 0; j < d; ++j) {
                              const double c = cpu::to_double(px[base[0] + j * sx]) - m;
                              ss += c * c;
                            }
                            const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
                            for (int64_t j = 0; j < d; ++j) {
                              const auto ju = static_cast<std::size_t>(j);
                              const double xh = (cpu::to_double(px[base[0] + j * sx]) - m) * r;
                              po[base[1] + j * so] = cpu::convert<T>(xh * w[ju] + b[ju]);
                            }
                            pm[base[2]] = static_cast<S>(m);
                            pr[base[3]] = static_cast<S>(r);
                          });
  });
}

std::array<Tensor, 3> layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const Device dev = x.device();
  const int last = x.dim() - 1;
  const DType stat_dt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty(x.shape(), {x.dtype(), dev});
  Tensor mu = empty(cpu::keepdim_shape(x.shape(), last), {stat_dt, dev});    // (..., 1)
  Tensor rstd = empty(cpu::keepdim_shape(x.shape(), last), {stat_dt, dev});  // (..., 1)
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::norm(kernels::NormKind::layer, {out, mu, rstd}, x, weight, bias, eps);
#else
    no_cuda_kernel("layer_norm");
#endif
  } else {
    layer_norm_cpu(out, mu, rstd, x, weight, bias, eps);
  }
  return {out, mu, rstd};
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  (void)common_device("layer_norm", {&x, &weight, &bias});
  check_floating("layer_norm", {&x});
  HT_CHECK(x.dim() >= 1 && x.shape().back() > 0, "layer_norm: expected x of shape (..., D) with D > 0, got {}",
           x.describe());
  check_affine(weight, "weight", x);
  check_affine(bias, "bias", x);
  HT_CHECK(eps >= 0.0, "layer_norm: eps must be >= 0, got {}", eps);
  auto [out, mu, rstd] = layer_norm_forward(x, weight, bias, eps);
  if (needs_grad({&x, &weight, &bias})) {
    auto node = std::make_shared<LayerNormBackward>(x, weight, bias, eps);
    node->save(x);
    node->save(x.requires_grad() ? weight : Tensor());  // only gx needs the weight
    node->save(mu);
    node->save(rstd);
    connect(node, {&x, &weight, &bias}, {&out});
  }
  return out;
}

}  // namespace ht
