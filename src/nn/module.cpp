// Module registration, traversal, mode, device/dtype moves and state dicts.
#include "hadatrain/nn/module.h"

#include <fmt/ranges.h>

#include <set>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/ops/copy.h"

namespace ht::nn {
namespace {
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
void check_name(const std::string& name, const std::string& type) {
  HT_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "{}: invalid member name '{}' (non-empty, no dots)", type, name);
}
}  // namespace

Tensor Module::forward(const Tensor&) {
  HT_FAIL("{} has no single-input forward; call its own forward method", type_name());
}

void Module::register_parameter(const std::string& name, Tensor* slot) {
  check_name(name, type_name());
  HT_ASSERT(slot && slot->defined(), "{}: parameter '{}' registered undefined", type_name(), name);
  if (!slot->requires_grad()) slot->set_requires_grad(true);
  params_.emplace_back(name, slot);
}

void Module::register_buffer(const std::string& name, Tensor* slot) {
  check_name(name, type_name());
  buffers_.emplace_back(name, slot);
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name, type_name());
  HT_ASSERT(m != nullptr, "{}: child '{}' is null", type_name(), name);
  children_.emplace_back(name, std::move(m));
}

Tensor Module::materialise(const Tensor& param, DType dtype) const {
  return materialise(param, dtype, WeightLayout::as_is);
}

Tensor Module::materialise(const Tensor& param, DType dtype, WeightLayout layout) const {
  if (const auto store = store_.lock()) return store->materialise(param, dtype, layout);
  return cast_master(param, dtype, layout);
}

Tensor Module::materialise(const Tensor& param) const {
  return param.defined() ? materialise(param, param.dtype()) : param;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters(const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [n, t] : params_) out.emplace_back(join(prefix, n), t);
  for (auto& [n, c] : children_)
    for (auto& p : c->named_parameters(join(prefix, n))) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffers(const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [n, t] : buffers_)
    if (t->defined()) out.emplace_back(join(prefix, n), t);
  for (auto& [n, c] : children_)
    for (auto& p : c->named_buffers(join(prefix, n))) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (auto& [n, c] : children_)
    for (auto& p : c->named_modules(join(prefix, n))) out.push_back(p);
  return out;
}

std::vector<Tensor*> Module::parameters() {
  std::vector<Tensor*> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (Tensor* t : parameters()) n += t->numel();
  return n;
}

void Module::set_mode(Mode m) {
  mode_ = m;
  for (auto& [n, c] : children_) c->set_mode(m);
}

void Module::to(Device device) {
  NoGradGuard ng;
  for (auto& [n, t] : params_) {
    if (t->device() == device) continue;
    const bool trainable = t->requires_grad();  // a frozen slot stays frozen (Note [Frozen parameters])
    *t = to_device(*t, device).detach();
    t->set_requires_grad(trainable);
  }
  for (auto& [n, t] : buffers_)
    if (t->defined() && t->device() != device) *t = to_device(*t, device);
  for (auto& [n, c] : children_) c->to(device);
}

void Module::to(DType dtype) {
  HT_CHECK(is_floating(dtype), "{}.to: parameters must stay floating, asked for {}", type_name(), dtype_name(dtype));
  NoGradGuard ng;
  for (auto& [n, t] : params_) {
    if (t->dtype() == dtype) continue;
    const bool trainable = t->requires_grad();  // a frozen slot stays frozen (Note [Frozen parameters])
    *t = to_dtype(*t, dtype).detach();
    t->set_requires_grad(trainable);
  }
  for (auto& [n, c] : children_) c->to(dtype);
}

void Module::zero_grad() {
  for (Tensor* t : parameters()) t->zero_grad();
}

std::map<std::string, Tensor> Module::state_dict() {
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : named_parameters()) out[n] = t->detach();
  for (auto& [n, t] : named_buffers()) out[n] = t->detach();
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, StrictLoad strict) {
  NoGradGuard ng;
  std::set<std::string> seen;
  std::vector<std::string> missing;
  auto load = [&](const std::string& name, Tensor* slot) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
      return;
    }
    seen.insert(name);
    HT_CHECK(it->second.shape() == slot->shape(), "load_state_dict: '{}' has shape {} in the state, {} in the model",
             name, to_string(it->second.shape()), to_string(slot->shape()));
    copy_(slot->detach(), it->second);
  };
  for (auto& [n, t] : named_parameters()) load(n, t);
  for (auto& [n, t] : named_buffers()) load(n, t);
  if (strict == StrictLoad::no) return;
  std::vector<std::string> unexpected;
  for (auto& [n, t] : state)
    if (!seen.count(n)) unexpected.push_back(n);
  HT_CHECK(missing.empty() && unexpected.empty(),
           "load_state_dict into {}: missing keys [{}], unexpected keys [{}]", type_name(),
           fmt::join(missing, ", "), fmt::join(unexpected, ", "));
}

}  // namespace ht::nn
