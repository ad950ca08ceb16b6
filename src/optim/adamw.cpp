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
  AdamW(std::vector<ParamRef> params, const AdamWOptions& o) : Optimizer(std::move(params)), o_(o) {
    HT_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got {} {}",
             o.beta1, o.beta2);
    HT_CHECK(o.eps > 0 && o.weight_decay >= 0, "AdamW: eps must be > 0 and weight_decay >= 0");
    m_.resize(params_.size());
    v_.resize(params_.size());
  }
  std::string name() const override { return "adamw"; }

  void begin_step(double lr) override {
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
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = *params_[i].param;
      const Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (!m_[i].defined()) {
        m_[i] = zeros_like(p);
        v_[i] = zeros_like(p);
      }
      if (p.is_cuda()) {
#ifdef HADATRAIN_CUDA
        on_cuda.push_back({p, g, m_[i], v_[i], params_[i].decay ? o_.weight_decay : 0.0});
        continue;
#else
        no_cuda_kernel("adamw step");
#endif
      }
      const double decay = params_[i].decay ? 1.0 - lr * o_.weight_decay : 1.0;
      const Tensor gc = g.contiguous();
      visit_floating(p.dtype(), "adamw", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          T* pp = p.data<T>();
          T* mp = m_[i].data<T>();
          T* vp = v_[i].data<T>();
          const T* gp = gc.data<T>();
          for (int64_t k = 0; k < p.numel(); ++k) {
            const double gk = gp[k];
            const double m = o_.beta1 * mp[k] + (1 - o_.beta1) * gk;
            const double v = o_.beta2 * vp[k] + (1 - o_.beta2) * gk * gk;
            mp[k] = static_cast<T>(m);
            vp[k] = static_cast<T>(v);
            pp[k] = static_cast<T>(pp[k] * decay - lr * (m / bc1) / (std::sqrt(v / bc2) + o_.eps));
          }
        }
      });
    }
#ifdef HADATRAIN_CUDA
    cuda_step::adamw(on_cuda, hyper_);
#endif
  }

  std::map<std::string, Tensor> state_tensors() const override {
    std::map<std::string, Tensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!m_[i].defined()) continue;
      out[params_[i].name + ".exp_avg"] = m_[i];
      out[params_[i].name + ".exp_avg_sq"] = v_[i];
    }
    return out;
  }

  void load_state_tensors(const std::map<std::string, Tensor>& state, int64_t steps) override {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto a = state.find(params_[i].name + ".exp_avg"), b = state.find(params_[i].name + ".exp_avg_sq");
      HT_CHECK((a == state.end()) == (b == state.end()), "AdamW state for '{}' has only one of exp_avg/exp_avg_sq",
               params_[i].name);
      const Device dev = params_[i].param->device();
      const DType dt = params_[i].param->dtype();
      m_[i] = a == state.end() ? Tensor() : a->second.to(dev).to(dt).clone();
      v_[i] = b == state.end() ? Tensor() : b->second.to(dev).to(dt).clone();
    }
    steps_ = steps;
  }

 private:
  AdamWOptions o_;
  std::vector<Tensor> m_, v_;
  double lr_ = 0.0, bc1_ = 1.0, bc2_ = 1.0;  // staged by begin_step
#ifdef HADATRAIN_CUDA
  cuda_step::DeviceHyper hyper_;
#endif
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamRef> params, const AdamWOptions& o) {
  return std::make_unique<AdamW>(std::move(params), o);
}

}  // namespace ht::optim
