// ParameterStore: what sits between a model's modules and its optimiser. It holds every parameter by full
// dotted name ("blocks.3.mlp.fc1.weight") with its master copy, gradient, weight-decay flag and optimiser
// state, and it is where a layer gets a parameter in the dtype it computes in (materialise, Note
// [Materialising parameters]). The optimiser steps over the store's parameters and keeps its per-parameter
// state in the store's slots; checkpoints read and write the model and optimiser state through it.
//
// Note [Parameter store ownership]
// The master copy of a parameter is the tensor in its module's slot (Note [Parameter slots]); the store
// holds the slot's address, never a second handle, so Module::to(device), Module::to(dtype) and
// load_state_dict stay valid and the store always sees the module's current tensor. The gradient is that
// master leaf's .grad(), where autograd accumulates it. The store owns the list (names, order, decay), the
// optimiser state (one tensor per parameter and state slot, created by the optimiser on its first step)
// and the materialise policy. The parameters' modules must outlive the store, as they must outlive any
// optimiser built over them. Attaching a store to a model (attach) points every module of the model at it
// (a weak reference: a store that is gone leaves the modules on the default cast); a module belongs to at
// most one live store.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hadatrain/nn/module.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::nn {

// One parameter: its full name, its module slot (the master copy: a leaf whose .grad() is read and which
// the optimiser updates in place), whether weight decay applies to it and the factor its learning rate is
// multiplied by (optim.lr_multipliers). A frozen parameter is a slot that does not require grad: it gets no
// gradient, so the optimiser never steps it and never creates state for it (optim/param_rules.h).
struct ParamRef {
  std::string name;
  Tensor* param = nullptr;
  bool decay = true;
  double lr_scale = 1.0;
};

// The default weight-decay selection: parameters with 2+ dims (weights) decay; 1-dim ones (biases, norm
// scales) and those whose leaf or full name is in `no_decay_names` (e.g. pos_embed, cls_token) do not.
std::vector<ParamRef> make_param_refs(const std::vector<std::pair<std::string, Tensor*>>& named,
                                      const std::vector<std::string>& no_decay_names = {});

// Note [Materialising parameters]
// A layer never reads a parameter's master tensor for computation: it asks for it with
// Module::materialise(param, dtype), which goes to the store its module is attached to, and the store asks
// its MaterialisePolicy. That call is the one place where
//   - weights are cast to the compute dtype (the default policy, CastPolicy: the master itself when the
//     dtype matches; otherwise a differentiable cast, so a bf16 forward's gradient reaches the f32 master in
//     f32; a request's layout hint lays the cast copy out as the layer reads it, WeightLayout in nn/module.h);
//   - sharded weights are gathered (FSDP): a policy that holds the local shard in the slot all-gathers
//     the full tensor in the compute dtype, and its backward reduce-scatters the gradient into the shard;
//   - quantised weights are handed over with their scale (HALO, 8-bit all-gather): the FSDP policy that
//     gathers Hadamard-rotated int8/fp8 rows with one scale per weight attaches the codes to the tensor it
//     returns, where a HALO layer finds them (grad/pipeline_halo_weight.h).
// Every parameter read in a forward goes through it, also those used in the master dtype (norm scales:
// materialise(param) asks for the master dtype), so a policy sees each parameter of a step. Layers do not
// change when a policy does. A module without a store uses CastPolicy's rule directly.
struct MaterialiseRequest {
  const ParamRef& param;  // name, master slot, decay flag
  std::size_t index;      // position in the store (stable for the store's life)
  DType dtype;            // the dtype the layer computes in
  WeightLayout layout = WeightLayout::as_is;
};

class MaterialisePolicy {
 public:
  virtual ~MaterialisePolicy() = default;
  // The tensor the layer computes with: request.param in request.dtype, differentiable back to the master.
  virtual Tensor materialise(const MaterialiseRequest& request) = 0;
};

// CastPolicy's rule, also used by modules without a store: `master` itself when it is undefined or already in
// `dtype`, otherwise master.to(dtype) (a differentiable cast); with layout channels_last a 4-d master is cast
// into channels-last memory instead (to_dtype_in_order: one pass, as the plain cast).
Tensor cast_master(const Tensor& master, DType dtype, WeightLayout layout = WeightLayout::as_is);

class CastPolicy final : public MaterialisePolicy {
 public:
  Tensor materialise(const MaterialiseRequest& r) override {
    return cast_master(*r.param.param, r.dtype, r.layout);
  }
};

class ParameterStore {
 public:
  // A store over named tensors that belong to no module (tests, hand-built parameter lists).
  explicit ParameterStore(std::vector<ParamRef> params);
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // A store over every parameter of `root` (default weight-decay selection, make_param_refs), attached to
  // every module of it so that their materialise calls come here.
  static std::shared_ptr<ParameterStore> attach(Module& root);
  // The same with the caller's decay flags: `params` must name exactly root's parameters, in its order.
  static std::shared_ptr<ParameterStore> attach(Module& root, std::vector<ParamRef> params);

  const std::vector<ParamRef>& params() const { return params_; }
  std::size_t size() const { return params_.size(); }
  // The position of the parameter named `name`; an error naming it when the store does not hold it.
  std::size_t index_of(const std::string& name) const;

  // Note [Materialising parameters]. `slot` is the module member holding the master (an undefined tensor,
  // such as a missing bias, is returned as is).
  Tensor materialise(const Tensor& slot, DType dtype, WeightLayout layout = WeightLayout::as_is);
  void set_policy(std::shared_ptr<MaterialisePolicy> policy);
  MaterialisePolicy& policy() const { return *policy_; }

  void zero_grad();  // drops every parameter's gradient

  // Optimiser state: an optimiser names its per-parameter slots once (e.g. exp_avg, exp_avg_sq), which
  // clears any state held; state(i, k) is parameter i's tensor for slot k (undefined until the optimiser
  // creates it).
  void define_state(std::vector<std::string> slot_names);
  const std::vector<std::string>& state_names() const { return state_names_; }
  Tensor& state(std::size_t param, std::size_t slot);
  // State for checkpoints: every defined state tensor by "<param name>.<slot>" (shared storage).
  std::map<std::string, Tensor> state_tensors() const;
  // Loads state written by state_tensors: each tensor is converted to its parameter's device and dtype and
  // copied; a parameter with none of its slots in `state` gets none (created on the next step); one with
  // only some of them is an error naming it. Other keys are ignored.
  void load_state_tensors(const std::map<std::string, Tensor>& state);

  // Model state for checkpoints: for an attached store the root's state_dict (parameters and buffers),
  // otherwise the parameters by name (shared storage, detached).
  std::map<std::string, Tensor> state_dict() const;
  // Copies values in (Module::load_state_dict for an attached store; for a standalone one, every parameter
  // must be present with its shape unless strict is StrictLoad::no).
  void load_state_dict(const std::map<std::string, Tensor>& state, StrictLoad strict = StrictLoad::yes);

 private:
  std::vector<ParamRef> params_;
  std::unordered_map<const Tensor*, std::size_t> by_slot_;
  std::vector<std::string> state_names_;
  std::vector<std::vector<Tensor>> state_;  // [param][slot]
  std::shared_ptr<MaterialisePolicy> policy_;
  Module* root_ = nullptr;  // set by attach
};

}  // namespace ht::nn
