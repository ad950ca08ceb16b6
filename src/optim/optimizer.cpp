// Optimizer base: the parameter store it steps over, global-norm clipping.
#include <algorithm>
#include <cmath>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"

namespace ht::optim {

Optimizer::Optimizer(std::shared_ptr<nn::ParameterStore> store, std::vector<std::string> state_slots)
    : store_(std::move(store)) {
  HT_CHECK(store_ != nullptr, "optimizer: the parameter store is null");
  for (const auto& p : store_->params()) {
    HT_CHECK(p.param->is_leaf(), "optimizer: parameter '{}' is not a leaf tensor", p.name);
    // A frozen parameter gets no gradient and is never stepped, so it may be held in a compute dtype
    // (Note [Frozen base in the compute dtype], nn/lora.h).
    HT_CHECK(!p.param->requires_grad() || p.param->dtype() == DType::f32 || p.param->dtype() == DType::f64,
             "optimizer: parameter '{}' is {}; master weights must be f32 or f64", p.name, p.param->describe());
  }
  store_->define_state(std::move(state_slots));
}

void Optimizer::begin_step(double lr) {
  for (const auto& p : store_->params())
    if (p.param->requires_grad()) mark_written(*p.param);
  stage(lr);
}

void Optimizer::load_state_tensors(const std::map<std::string, Tensor>& state, int64_t steps) {
  store_->load_state_tensors(state);
  steps_ = steps;
}

std::vector<int> Optimizer::cuda_devices() const {
  std::vector<int> out;
  for (const auto& p : store_->params())
    if (p.param->is_cuda() && std::find(out.begin(), out.end(), p.param->device().index) == out.end())
      out.push_back(p.param->device().index);
  std::sort(out.begin(), out.end());
  return out;
}

double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm) {
  HT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got {}", max_norm);
  NoGradGuard ng;
  // Squared norms are summed on each gradient's device (f64, in parameter order) and read back once per
  // device, so CUDA gradients cost one host synchronisation, not one per parameter.
  std::vector<std::pair<Device, Tensor>> partial;
  for (const auto& p : params) {
    const Tensor& g = p.param->grad();
    if (!g.defined()) continue;
    const Tensor sq = to_dtype(sum(mul(g, g)), DType::f64);
    auto it = std::find_if(partial.begin(), partial.end(), [&](const auto& e) { return e.first == g.device(); });
    if (it == partial.end()) partial.emplace_back(g.device(), sq);
    else it->second = add(it->second, sq);
  }
  double total = 0;
  for (const auto& [dev, sq] : partial) total += sq.item();
  total = std::sqrt(total);
  if (total > max_norm && std::isfinite(total)) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& p : params)
      if (p.param->grad().defined()) mul_(p.param->grad(), scale);
  }
  return total;
}

Tensor clip_grad_norm_on_device(const std::vector<ParamRef>& params, double max_norm) {
  HT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got {}", max_norm);
  NoGradGuard ng;
  Tensor sq;  // () f64: the sum of squares, in parameter order
  for (const auto& p : params) {
    const Tensor& g = p.param->grad();
    if (!g.defined()) continue;
    const Tensor s = to_dtype(sum(mul(g, g)), DType::f64);
    sq = sq.defined() ? add(sq, s.to(sq.device())) : s;
  }
  if (!sq.defined()) return Tensor();
  const Tensor total = sqrt(sq);
  // Scale only when the norm is above max_norm and finite (as clip_grad_norm): NaN and inf compare false.
  const Tensor one = full({}, 1.0, {DType::f64, total.device()});
  const Tensor clip = full({}, max_norm, {DType::f64, total.device()});
  const Tensor scale = where(gt(total, max_norm), where(lt(total, INFINITY), div(clip, add(total, 1e-6)), one), one);
  for (const auto& p : params) {
    const Tensor& g = p.param->grad();
    if (!g.defined()) continue;
    copy_(g, mul(g, to_dtype(scale.to(g.device()), g.dtype())));
  }
  return total;
}

}  // namespace ht::optim
