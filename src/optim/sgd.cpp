// SGD with momentum, dampening, Nesterov and coupled weight decay — torch.optim.SGD semantics:
//   g = grad + wd * p;  buf = g (first step) or momentum * buf + (1 - dampening) * g;
//   d = nesterov ? g + momentum * buf : buf;  p -= lr * d.
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/optim_glue.h"
#endif

namespace ht::optim {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(std::shared_ptr<nn::ParameterStore> store, const SgdOptions& o)
      : Optimizer(std::move(store), {"momentum_buffer"}), o_(o) {
    HT_CHECK(o.momentum >= 0 && o.momentum < 1, "SGD: momentum must be in [0, 1), got {}", o.momentum);
    HT_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be >= 0, got {}", o.weight_decay);
    HT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD: Nesterov needs momentum > 0 and dampening 0");
  }
  std::string name() const override { return "sgd"; }

  void stage(double lr) override {
    lr_ = lr;
    ++steps_;
#ifdef HADATRAIN_CUDA
    for (int d : cuda_devices()) hyper_.stage(d, kernels::SgdHyper{lr, o_.momentum, o_.dampening, o_.nesterov ? 1 : 0});
#endif
  }

  void apply() override {
    const double lr = lr_;
#ifdef HADATRAIN_CUDA
    std::vector<cuda_step::SgdItem> on_cuda;  // one fused launch per (device, dtype) after the loop
#endif
    const std::vector<ParamRef>& params = store_->params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      Tensor& p = *params[i].param;
      const Tensor& g = p.grad();
      if (!g.defined()) continue;
      Tensor& buf = store_->state(i, kMomentum);
      const bool first = !buf.defined();
      if (o_.momentum > 0 && first) buf = zeros_like(p);
      const double wd = params[i].decay ? o_.weight_decay : 0.0;
      if (p.is_cuda()) {
#ifdef HADATRAIN_CUDA
        on_cuda.push_back({p, g, o_.momentum > 0 ? buf : Tensor(), wd, first, params[i].lr_scale});
        continue;
#else
        no_cuda_kernel("sgd step");
#endif
      }
      const double lr_i = lr * params[i].lr_scale;  // exactly lr when lr_scale is 1
      const Tensor gc = g.contiguous();
      HT_CHECK(p.is_contiguous(), "SGD: parameter '{}' must be contiguous", params[i].name);
      visit_floating(p.dtype(), "sgd", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          T* pp = p.data<T>();
          const T* gp = gc.data<T>();
          T* bp = o_.momentum > 0 ? buf.data<T>() : nullptr;
          const int64_t n = p.numel();
          for (int64_t k = 0; k < n; ++k) {
            double d = static_cast<double>(gp[k]) + wd * static_cast<double>(pp[k]);
            if (bp) {
              const double b = first ? d : o_.momentum * bp[k] + (1.0 - o_.dampening) * d;
              bp[k] = static_cast<T>(b);
              d = o_.nesterov ? d + o_.momentum * b : b;
            }
            pp[k] = static_cast<T>(pp[k] - lr_i * d);
          }
        }
      });
    }
#ifdef HADATRAIN_CUDA
    cuda_step::sgd(on_cuda, hyper_);
#endif
  }

 private:
  static constexpr std::size_t kMomentum = 0;  // the state slot
  SgdOptions o_;
  double lr_ = 0.0;  // staged by begin_step
#ifdef HADATRAIN_CUDA
  cuda_step::DeviceHyper hyper_;
#endif
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::shared_ptr<nn::ParameterStore> store, const SgdOptions& o) {
  return std::make_unique<Sgd>(std::move(store), o);
}

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamRef> params, const SgdOptions& o) {
  return make_sgd(std::make_shared<nn::ParameterStore>(std::move(params)), o);
}

}  // namespace ht::optim
