// Module: the base of every layer and model. A module owns named parameters (trainable tensors), buffers
// (state such as batch-norm running statistics) and child modules; names compose with dots
// ("layers.3.attn.qkv.weight"), as in PyTorch, so state dicts can be compared with torchvision/timm.
//
// Note [Parameter slots]
// Parameters and buffers are Tensor members of the derived class, registered by address
// (register_parameter("weight", &weight_)). Moving a module to another device or dtype rebinds those members,
// so derived classes always read their own members and never keep a second copy. Modules are held by
// shared_ptr and never moved after construction, so the addresses stay valid. A forward reads a parameter
// through materialise(), never the member directly (Note [Materialising parameters] in
// nn/parameter_store.h): the store a module is attached to decides what the layer computes with.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht::nn {

// How a layer will read a weight. channels_last: a 4-d convolution weight (O, C, KH, KW) that an NHWC convolution
// reads as (O, KH, KW, C); a materialise policy that makes a copy anyway (a cast) may lay that copy out so (same
// shape, the strides of to_dtype_in_order(.., {0, 2, 3, 1})) and spare the layer its own transpose. A hint: any
// layout is correct, since the layer lays the weight out itself when it must.
enum class WeightLayout { as_is, channels_last };

enum class Mode { train, eval };
enum class StrictLoad { yes, no };

class ParameterStore;

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  virtual std::string type_name() const = 0;
  // Single-input forward. Modules with other signatures expose their own call and throw here.
  virtual Tensor forward(const Tensor& x);

  // Parameters/buffers/modules of this module and its children, depth first, in registration order.
  std::vector<std::pair<std::string, Tensor*>> named_parameters(const std::string& prefix = "");
  std::vector<std::pair<std::string, Tensor*>> named_buffers(const std::string& prefix = "");
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  std::vector<Tensor*> parameters();
  int64_t num_parameters();

  void set_mode(Mode m);  // recursive
  void train() { set_mode(Mode::train); }
  void eval() { set_mode(Mode::eval); }
  bool is_training() const { return mode_ == Mode::train; }

  // Moves every parameter and buffer (recursive). Parameters stay leaves; each keeps its requires_grad (a
  // frozen one stays frozen, optim/param_rules.h).
  void to(Device device);
  // Converts floating parameters (not buffers) to dtype.
  void to(DType dtype);
  void zero_grad();

  // Parameters and buffers by full name (shared storage, detached).
  std::map<std::string, Tensor> state_dict();
  // Copies values in (converting dtype/device as needed). With StrictLoad::yes, missing or unexpected names
  // and shape mismatches are errors that list the names.
  void load_state_dict(const std::map<std::string, Tensor>& state, StrictLoad strict = StrictLoad::yes);

 protected:
  // Registers a member tensor (Note [Parameter slots]); parameters are made leaves requiring grad.
  void register_parameter(const std::string& name, Tensor* slot);
  void register_buffer(const std::string& name, Tensor* slot);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  // A parameter slot of this module as the layer computes with it, in `dtype` (Note [Materialising
  // parameters]): through the attached store's policy, or cast_master's rule without a store.
  Tensor materialise(const Tensor& param, DType dtype) const;
  // The same with a layout hint for the copy a cast makes (WeightLayout: NHWC convolutions ask for channels_last).
  Tensor materialise(const Tensor& param, DType dtype, WeightLayout layout) const;
  // The same in the parameter's own (master) dtype: for layers that compute with the master, e.g. norms.
  Tensor materialise(const Tensor& param) const;

 private:
  friend class ParameterStore;  // attaches itself (store_)
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  Mode mode_ = Mode::train;
  std::weak_ptr<ParameterStore> store_;  // Note [Parameter store ownership]
};

using ModulePtr = std::shared_ptr<Module>;

}  // namespace ht::nn
