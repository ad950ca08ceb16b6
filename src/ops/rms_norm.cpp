// rms_norm over the last dim (size D), as in LLaMA / PyTorch's F.rms_norm:
//   y = x * rstd * weight,   rstd = 1 / sqrt(mean(x^2) + eps)
// weight (D) is optional (undefined). The CPU reference computes mean(x^2) in double and saves rstd,
// shape (..., 1), f32 (f64 for f64 input), for the backward:
//   xhat = x * rstd,   gh = g * weight
//   gx = rstd * (gh - xhat * mean(gh * xhat))          (mean over the last dim)
//   gweight = sum over rows of g * xhat
// CUDA: forward and backward are row kernels (cuda/kernels/rows_norm*.cu); the weight gradient is a column reduction
// with per-split partial sums added in a fixed order (deterministic).
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

// On CUDA, g_x is added into x's gradient gathered so far (the residual stream's other branch) by the backward
// kernel itself (Note [Gradients accumulated in place]).
class RmsNormBackward final : public AccumulatingNode {
 public:
  RmsNormBackward(const Tensor& x, const Tensor& weight)
      : AccumulatingNode(x.is_cuda()),
        d_(x.shape().back()),
        x_dtype_(x.dtype()),
        w_dtype_(weight.defined() ? weight.dtype() : x.dtype()) {}
  std::string name() const override { return "RmsNormBackward"; }
  // saved: x (0), weight (1, may be undefined), rstd (2)

 private:
  std::vector<Tensor> run(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) override {
    const Tensor& rstd = saved(2);  // (..., 1)
    if (rstd.is_cuda()) {
#ifdef HADATRAIN_CUDA
      const Tensor& x = saved(0);
      const bool acc = needs_input_grad(0) && !into.empty() &&
                       usable_grad_buffer(into[0], x.shape(), x.dtype(), x.device());
      const cuda_ops::NormGrads r =
          cuda_ops::norm_backward(kernels::NormKind::rms, grads[0], x, saved(1), Tensor(), rstd,
                                  {needs_input_grad(0), needs_input_grad(1), false, w_dtype_, x_dtype_},
                                  acc ? into[0] : Tensor());
      return {r.gx, r.gw.defined() ? to_dtype(r.gw, w_dtype_) : Tensor()};
#endif
    }
    const DType cd = rstd.dtype();
    const Tensor g = to_dtype(grads[0], cd);
    const Tensor xhat = mul(to_dtype(saved(0), cd), rstd);  // (..., D)
    Tensor gx, gw;
    if (needs_input_grad(0)) {
      const Tensor& w = saved(1);
      const Tensor gh = w.defined() ? mul(g, to_dtype(w, cd)) : g;
      gx = to_dtype(mul(rstd, sub(gh, mul(xhat, mean(mul(gh, xhat), {-1}, KeepDim::yes)))), x_dtype_);
    }
    if (needs_input_grad(1)) gw = to_dtype(sum_to(mul(g, xhat), {d_}), w_dtype_);
    return {gx, gw};
  }

  int64_t d_;
  DType x_dtype_, w_dtype_;
};

// The CPU reference: fills out and rstd.
void rms_norm_cpu(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight, double eps) {
  const int last = x.dim() - 1;
  const int64_t d = x.shape().back();
  const std::vector<double> w =
      weight.defined() ? weight.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(d), 1.0);
  const int64_t sx = x.stride(last), so = out.stride(last);
  visit_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* px = cpu::ptr<T>(x);
    T* po = cpu::ptr<T>(out);
    S* pr = cpu::ptr<S>(rstd);
    cpu::for_each_line<3>(x.shape(), last, {x.strides(), out.strides(), rstd.strides()},
                          [&](const std::array<int64_t, 3>& base) {
                            double ss = 0.0;
                            for (int64_t j = 0; j < d; ++j) {
                              const double v = cpu::to_double(px[base[0] + j * sx]);
                              ss += v * v;
                            }
                            const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
                            for (int64_t j = 0; j < d; ++j)
                              po[base[1] + j * so] = cpu::convert<T>(cpu::to_double(px[base[0] + j * sx]) * r *
                                                                     w[static_cast<std::size_t>(j)]);
                            pr[base[2]] = static_cast<S>(r);
                          });
  });
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const Device dev = common_device("rms_norm", {&x, &weight});
  check_floating("rms_norm", {&x, &weight});
  HT_CHECK(x.dim() >= 1 && x.shape().back() > 0, "rms_norm: expected x of shape (..., D) with D > 0, got {}",
           x.describe());
  HT_CHECK(!weight.defined() || (weight.dim() == 1 && weight.size(0) == x.shape().back()),
           "rms_norm: expected weight of shape ({}) to match the last dim of x {}, got {}", x.shape().back(),
           x.describe(), weight.describe());
  HT_CHECK(eps >= 0.0, "rms_norm: eps must be >= 0, got {}", eps);
  const int last = x.dim() - 1;
  const DType stat_dt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty(x.shape(), {x.dtype(), dev});
  Tensor rstd = empty(cpu::keepdim_shape(x.shape(), last), {stat_dt, dev});  // (..., 1)
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::norm(kernels::NormKind::rms, {out, Tensor(), rstd}, x, weight, Tensor(), eps);
#else
    no_cuda_kernel("rms_norm");
#endif
  } else {
    rms_norm_cpu(out, rstd, x, weight, eps);
  }

  if (needs_grad({&x, &weight})) {
    auto node = std::make_shared<RmsNormBackward>(x, weight);
    node->save(x);
    node->save(x.requires_grad() ? weight : Tensor());  // only gx needs the weight
    node->save(rstd);
    connect(node, {&x, &weight}, {&out});
  }
  return out;
}

}  // namespace ht
