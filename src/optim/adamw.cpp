// AdamW (Loshchilov & Hutter) — torch.optim.AdamW semantics:
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
#include <cmath>

#include "hadatrain/ops/dispatch.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/optim_glue.h"
#endif

namespace ht::optim {
namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(std::shared_ptr<nn::ParameterStore> store, const AdamWOptions& o)
      : Optimizer(std::move(store), {"exp_avg", "exp_avg_sq"}), o_(o) {
    HT_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got {} {}",
             o.beta1, o.beta2);
    HT_CHECK(o.eps > 0 && o.weight_decay >= 0, "AdamW: eps must be > 0 and weight_decay >= 0");
  }
  std::string name() const override { return "adamw"; }

  void stage(double lr) override {
    ++steps_;
    lr_ = lr;
    bc1_ = 1.0 - std::pow(o_.beta1, static_cast<double>(steps_));
    bc2_ = 1.0 - std::pow(o_.beta2, static_cast<double>(steps_));
#ifdef HADATRAIN_CUDA
    for (int d : cuda_devices()) hyper_.stage(d, kernels::AdamWHyper{lr, o_.beta1, o_.beta2, o_.eps, bc1_, bc2_});
#endif
  }

  void apply() override {
    const double lr = lr_, bc1 = bc1_, bc2 = bc2_;
#ifdef HADATRAIN_CUDA
    std::vector<cuda_step::AdamWItem> on_cuda;  // one fused launch per (device, dtype) after the loop
#endif
    const std::vector<ParamRef>& params = store_->params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      Tensor& p = *params[i].param;
      const Tensor& g = p.grad();
      if (!g.defined()) continue;
      Tensor& m_i = store_->state(i, kExpAvg);
      Tensor& v_i = store_->state(i, kExpAvgSq);
      if (!m_i.defined()) {
        m_i = zeros_like(p);
        v_i = zeros_like(p);
      }
      if (p.is_cuda()) {
#ifdef HADATRAIN_CUDA
        on_cuda.push_back({p, g, m_i, v_i, params[i].decay ? o_.weight_decay : 0.0, params[i].lr_scale});
        continue;
#else
        no_cuda_kernel("adamw step");
#endif
      }
      const double lr_i = lr * params[i].lr_scale;  // exactly lr when lr_scale is 1
      const double decay = params[i].decay ? 1.0 - lr_i * o_.weight_decay : 1.0;
      const Tensor gc = g.contiguous();
      visit_floating(p.dtype(), "adamw", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          T* pp = p.data<T>();
          T* mp = m_i.data<T>();
          T* vp = v_i.data<T>();
          const T* gp = gc.data<T>();
          for (int64_t k = 0; k < p.numel(); ++k) {
            const double gk = gp[k];
            const double m = o_.beta1 * mp[k] + (1 - o_.beta1) * gk;
            const double v = o_.beta2 * vp[k] + (1 - o_.beta2) * gk * gk;
            mp[k] = static_cast<T>(m);
            vp[k] = static_cast<T>(v);
            pp[k] = static_cast<T>(pp[k] * decay - lr_i * (m / bc1) / (std::sqrt(v / bc2) + o_.eps));
          }
        }
      });
    }
#ifdef HADATRAIN_CUDA
    cuda_step::adamw(on_cuda, hyper_);
#endif
  }

 private:
  static constexpr std::size_t kExpAvg = 0, kExpAvgSq = 1;  // the state slots
  AdamWOptions o_;
  double lr_ = 0.0, bc1_ = 1.0, bc2_ = 1.0;  // staged by begin_step
#ifdef HADATRAIN_CUDA
  cuda_step::DeviceHyper hyper_;
#endif
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(std::shared_ptr<nn::ParameterStore> store, const AdamWOptions& o) {
  return std::make_unique<AdamW>(std::move(store), o);
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamRef> params, const AdamWOptions& o) {
  return make_adamw(std::make_shared<nn::ParameterStore>(std::move(params)), o);
}

}  // namespace ht::optim
