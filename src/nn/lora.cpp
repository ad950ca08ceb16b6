// LoRA layers (nn/lora.h): the frozen base product plus the scaled low-rank adapter product, merging, and the
// LinearFactory that builds them in place of targeted Linear layers.
#include "hadatrain/nn/lora.h"

#include <fmt/ranges.h>

#include <set>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/nn/init.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::nn {

void LoraConfig::validate() const {
  HT_CHECK(rank > 0, "lora: rank must be positive, got {}", rank);
  HT_CHECK(alpha > 0.0, "lora: alpha must be positive, got {}", alpha);
  HT_CHECK(dropout >= 0.0 && dropout < 1.0, "lora: dropout must be in [0, 1), got {}", dropout);
  HT_CHECK(!target_modules.empty(), "lora: target_modules is empty; name the layers to adapt (e.g. q_proj, v_proj)");
}

LoraLinear::LoraLinear(const Linear& base, const LoraConfig& c, Generator& gen, std::shared_ptr<Generator> dgen)
    : Linear(base.weight, base.bias) {
  grad_pipeline = base.grad_pipeline;
  add_adapters(c, gen, std::move(dgen));
}

LoraLinear::LoraLinear(int64_t in, int64_t out, const LoraConfig& c, Generator& gen, std::shared_ptr<Generator> dgen)
    : Linear(empty({out, in}), Tensor()) {
  add_adapters(c, gen, std::move(dgen));
}

void LoraLinear::add_adapters(const LoraConfig& c, Generator& gen, std::shared_ptr<Generator> dgen) {
  c.validate();
  HT_CHECK(c.dropout == 0.0 || dgen != nullptr, "lora: dropout {} needs a dropout generator", c.dropout);
  // The base is frozen (Note [Frozen parameters] in optim/param_rules.h): no gradient, no optimiser state.
  weight.set_requires_grad(false);
  if (bias.defined()) bias.set_requires_grad(false);
  const TensorOptions o{weight.dtype(), weight.device()};
  // A (r, in): kaiming_uniform(a = sqrt(5)) as torch.nn.Linear's default; B (out, r): zeros.
  Tensor a = empty({c.rank, in_features}, o);
  init::default_linear_weight_(a, gen);
  lora_A = register_module("lora_A", std::make_shared<Linear>(a, Tensor()));
  lora_B = register_module("lora_B", std::make_shared<Linear>(zeros({out_features, c.rank}, o), Tensor()));
  scaling_ = c.alpha / static_cast<double>(c.rank);
  dropout_ = c.dropout;
  dropout_gen_ = std::move(dgen);
}

Tensor LoraLinear::forward(const Tensor& x) {
  Tensor y = Linear::forward(x);  // (..., out): the frozen base product, through the layer's pipeline
  if (merged_) return y;
  const Tensor xd = is_training() && dropout_ > 0.0 ? ht::dropout(x, dropout_, *dropout_gen_) : x;
  return add(y, mul(lora_B->forward(lora_A->forward(xd)), scaling_));  // (..., r) inside
}

void LoraLinear::merge() {
  HT_CHECK(!merged_, "lora: layer is already merged");
  NoGradGuard ng;
  // W (out, in) += scaling * B (out, r) A (r, in), computed in f32 at least (f64 for f64 weights).
  const DType cd = weight.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor delta = mul(matmul(to_dtype(lora_B->weight.detach(), cd), to_dtype(lora_A->weight.detach(), cd)),
                           scaling_);
  copy_(weight.detach(), add(to_dtype(weight.detach(), cd), delta));
  merged_ = true;
}

bool lora_target_matches(const std::string& name, const std::string& pattern) {
  if (name == pattern) return true;
  return name.size() > pattern.size() && name.compare(name.size() - pattern.size(), pattern.size(), pattern) == 0 &&
         name[name.size() - pattern.size() - 1] == '.';
}

LoraFactory::LoraFactory(LoraConfig c, std::shared_ptr<Generator> gen, std::shared_ptr<Generator> dgen)
    : config_(std::move(c)), gen_(std::move(gen)), dropout_gen_(std::move(dgen)), used_(config_.target_modules.size()) {
  config_.validate();
  HT_CHECK(gen_ != nullptr, "lora: the factory needs a generator for the adapters' init");
}

LinearFactory LoraFactory::factory() {
  return [this](const std::string& name, int64_t in, int64_t out) -> std::shared_ptr<Linear> {
    bool hit = false;
    for (std::size_t i = 0; i < config_.target_modules.size(); ++i)
      if (lora_target_matches(name, config_.target_modules[i])) hit = used_[i] = true;
    if (!hit) return std::make_shared<Linear>(empty({out, in}), Tensor());
    wrapped_.push_back(name);
    return std::make_shared<LoraLinear>(in, out, config_, *gen_, dropout_gen_);
  };
}

void LoraFactory::check_targets() const {
  std::vector<std::string> unused;
  for (std::size_t i = 0; i < used_.size(); ++i)
    if (!used_[i]) unused.push_back(config_.target_modules[i]);
  HT_CHECK(unused.empty(), "lora: target_modules [{}] selected no layer (a pattern matches a full module name or "
           "its last dotted parts, e.g. q_proj or self_attn.q_proj)", fmt::join(unused, ", "));
}

std::vector<std::pair<std::string, LoraLinear*>> lora_layers(Module& root) {
  std::vector<std::pair<std::string, LoraLinear*>> out;
  for (auto& [name, m] : root.named_modules())
    if (auto* l = dynamic_cast<LoraLinear*>(m)) out.emplace_back(name, l);
  return out;
}

int64_t merge_lora(Module& root) {
  int64_t n = 0;
  for (auto& [name, l] : lora_layers(root))
    if (!l->merged()) {
      l->merge();
      ++n;
    }
  return n;
}

int64_t freeze_non_lora(Module& root) {
  std::set<const Tensor*> adapters;
  for (auto& [name, l] : lora_layers(root)) {
    adapters.insert(&l->lora_A->weight);
    adapters.insert(&l->lora_B->weight);
  }
  int64_t n = 0;
  for (auto& [name, t] : root.named_parameters())
    if (!adapters.count(t) && t->requires_grad()) {
      t->set_requires_grad(false);
      ++n;
    }
  return n;
}

FrozenStore store_frozen_in(Module& root, DType dtype) {
  FrozenStore r;
  NoGradGuard ng;
  for (auto& [name, t] : root.named_parameters()) {
    if (!t->defined() || t->requires_grad() || t->dim() < 2 || !is_floating(t->dtype()) || t->dtype() == dtype)
      continue;
    r.bytes_before += static_cast<int64_t>(t->nbytes());
    *t = to_dtype(t->detach(), dtype);  // a new leaf that does not require grad, in the same slot
    r.bytes_after += static_cast<int64_t>(t->nbytes());
    ++r.params;
  }
  return r;
}

bool is_lora_adapter_name(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::map<std::string, Tensor> lora_state_dict(Module& root) {
  std::map<std::string, Tensor> out;
  for (auto& [name, l] : lora_layers(root)) {
    out[name + ".lora_A.weight"] = l->lora_A->weight.detach();
    out[name + ".lora_B.weight"] = l->lora_B->weight.detach();
  }
  return out;
}

}  // namespace ht::nn
