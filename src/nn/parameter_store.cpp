// ParameterStore: the parameter list, materialise policy, optimiser state slots and checkpoint state of a
// model (Note [Parameter store ownership], Note [Materialising parameters]).
#include "hadatrain/nn/parameter_store.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/copy.h"

namespace ht::nn {

std::vector<ParamRef> make_param_refs(const std::vector<std::pair<std::string, Tensor*>>& named,
                                      const std::vector<std::string>& no_decay_names) {
  std::vector<ParamRef> out;
  for (const auto& [name, t] : named) {
    const std::string leaf = name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
    const bool listed = std::find(no_decay_names.begin(), no_decay_names.end(), leaf) != no_decay_names.end() ||
                        std::find(no_decay_names.begin(), no_decay_names.end(), name) != no_decay_names.end();
    out.push_back({name, t, t->dim() >= 2 && !listed});
  }
  return out;
}

Tensor cast_master(const Tensor& master, DType dtype, WeightLayout layout) {
  if (!master.defined() || master.dtype() == dtype) return master;
  if (layout == WeightLayout::channels_last && master.dim() == 4) return to_dtype_in_order(master, dtype, {0, 2, 3, 1});
  return master.to(dtype);
}

ParameterStore::ParameterStore(std::vector<ParamRef> params)
    : params_(std::move(params)), policy_(std::make_shared<CastPolicy>()) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    HT_CHECK(p.param != nullptr && p.param->defined(), "parameter store: parameter '{}' is undefined", p.name);
    HT_CHECK(names.insert(p.name).second, "parameter store: the name '{}' is given twice", p.name);
    HT_CHECK(by_slot_.emplace(p.param, i).second, "parameter store: '{}' is the same tensor slot as '{}'", p.name,
             params_[by_slot_.at(p.param)].name);
  }
  state_.resize(params_.size());
}

std::shared_ptr<ParameterStore> ParameterStore::attach(Module& root) {
  return attach(root, make_param_refs(root.named_parameters()));
}

std::shared_ptr<ParameterStore> ParameterStore::attach(Module& root, std::vector<ParamRef> params) {
  const auto named = root.named_parameters();
  HT_CHECK(named.size() == params.size(), "parameter store: {} has {} parameters, {} were given", root.type_name(),
           named.size(), params.size());
  for (std::size_t i = 0; i < named.size(); ++i)
    HT_CHECK(named[i].first == params[i].name && named[i].second == params[i].param,
             "parameter store: parameter {} of {} is '{}', the list given has '{}' there", i, root.type_name(),
             named[i].first, params[i].name);
  const auto modules = root.named_modules();
  for (const auto& [name, m] : modules)
    HT_CHECK(m->store_.expired(), "parameter store: module '{}' ({}) already belongs to another live parameter store",
             name.empty() ? "<root>" : name, m->type_name());
  auto store = std::make_shared<ParameterStore>(std::move(params));
  store->root_ = &root;
  for (const auto& [name, m] : modules) m->store_ = store;
  return store;
}

std::size_t ParameterStore::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return i;
  HT_FAIL("parameter store: no parameter named '{}' (it holds {} parameters)", name, params_.size());
}

Tensor ParameterStore::materialise(const Tensor& slot, DType dtype, WeightLayout layout) {
  if (!slot.defined()) return slot;
  const auto it = by_slot_.find(&slot);
  HT_CHECK(it != by_slot_.end(),
           "parameter store: asked to materialise {}, which is not one of its parameters (was it registered after "
           "the store was attached?)",
           slot.describe());
  return policy_->materialise({params_[it->second], it->second, dtype, layout});
}

void ParameterStore::set_policy(std::shared_ptr<MaterialisePolicy> policy) {
  HT_CHECK(policy != nullptr, "parameter store: the materialise policy must not be null");
  policy_ = std::move(policy);
}

void ParameterStore::zero_grad() {
  for (auto& p : params_) p.param->zero_grad();
}

void ParameterStore::define_state(std::vector<std::string> slot_names) {
  state_names_ = std::move(slot_names);
  for (auto& s : state_) s.assign(state_names_.size(), Tensor());
}

Tensor& ParameterStore::state(std::size_t param, std::size_t slot) {
  HT_ASSERT(param < state_.size() && slot < state_names_.size(), "parameter store: state ({}, {}) out of range",
            param, slot);
  return state_[param][slot];
}

std::map<std::string, Tensor> ParameterStore::state_tensors() const {
  std::map<std::string, Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t k = 0; k < state_names_.size(); ++k)
      if (state_[i][k].defined()) out[params_[i].name + "." + state_names_[k]] = state_[i][k];
  return out;
}

void ParameterStore::load_state_tensors(const std::map<std::string, Tensor>& state) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = *params_[i].param;
    std::vector<std::string> found, absent;
    for (const auto& slot : state_names_)
      (state.count(params_[i].name + "." + slot) ? found : absent).push_back(slot);
    HT_CHECK(found.empty() || absent.empty(), "optimizer state for '{}' has {} but not {}", params_[i].name,
             fmt::join(found, "/"), fmt::join(absent, "/"));
    for (std::size_t k = 0; k < state_names_.size(); ++k) {
      const auto it = state.find(params_[i].name + "." + state_names_[k]);
      state_[i][k] = it == state.end() ? Tensor() : it->second.to(p.device()).to(p.dtype()).clone();
    }
  }
}

std::map<std::string, Tensor> ParameterStore::state_dict() const {
  if (root_ != nullptr) return root_->state_dict();
  std::map<std::string, Tensor> out;
  for (const auto& p : params_) out[p.name] = p.param->detach();
  return out;
}

void ParameterStore::load_state_dict(const std::map<std::string, Tensor>& state, StrictLoad strict) {
  if (root_ != nullptr) return root_->load_state_dict(state, strict);
  NoGradGuard ng;
  std::vector<std::string> missing;
  for (const auto& p : params_) {
    const auto it = state.find(p.name);
    if (it == state.end()) {
      missing.push_back(p.name);
      continue;
    }
    HT_CHECK(it->second.shape() == p.param->shape(), "parameter store: '{}' has shape {} in the state, {} here",
             p.name, to_string(it->second.shape()), to_string(p.param->shape()));
    copy_(p.param->detach(), it->second);
  }
  if (strict == StrictLoad::no) return;
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : state)
    if (std::none_of(params_.begin(), params_.end(), [&](const ParamRef& p) { return p.name == name; }))
      unexpected.push_back(name);
  HT_CHECK(missing.empty() && unexpected.empty(), "parameter store: missing keys [{}], unexpected keys [{}]",
           fmt::join(missing, ", "), fmt::join(unexpected, ", "));
}

}  // namespace ht::nn
