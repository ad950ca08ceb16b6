// LoRA (Hu et al. 2021) on Linear layers, as peft's LoraLayer: y = x Wᵀ + (alpha / r) · B(A(dropout(x))) with
// A (r, in) kaiming-uniform (torch.nn.Linear's default), B (out, r) zeros, so a fresh adapter changes nothing.
// The base weight stays a parameter under its own name (a state dict is the base checkpoint plus the
// adapters) but is frozen: it does not require grad, so it gets no gradient and no optimiser state.
// Adapters are named like peft's: "<layer>.lora_A.weight", "<layer>.lora_B.weight".
// Layers are chosen by target-module patterns: a pattern selects a Linear whose full name equals it or ends
// with "." + pattern ("q_proj" selects "model.layers.0.self_attn.q_proj").
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/nn/layers.h"

namespace ht::nn {

struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16.0;   // scaling = alpha / rank
  double dropout = 0.0;  // on the adapter's input, in train mode
  std::vector<std::string> target_modules{"q_proj", "v_proj"};
  void validate() const;  // rank > 0, 0 <= dropout < 1, at least one target
};

class LoraLinear : public Linear {
 public:
  // Takes over `base`'s weight (and bias), frozen; adapters from `gen`, dropout draws from `dropout_gen`.
  LoraLinear(const Linear& base, const LoraConfig& c, Generator& gen, std::shared_ptr<Generator> dropout_gen);
  // Plain shapes, no base to take over: the base weight is uninitialised (a caller loads it next).
  LoraLinear(int64_t in, int64_t out, const LoraConfig& c, Generator& gen, std::shared_ptr<Generator> dropout_gen);
  std::string type_name() const override { return "LoraLinear"; }
  Tensor forward(const Tensor& x) override;  // (..., in) -> (..., out)
  // W += scaling · B A (in W's dtype, under no grad); afterwards forward is the base product alone.
  void merge();
  bool merged() const { return merged_; }
  double scaling() const { return scaling_; }
  std::shared_ptr<Linear> lora_A, lora_B;

 private:
  void add_adapters(const LoraConfig& c, Generator& gen, std::shared_ptr<Generator> dropout_gen);
  double scaling_ = 1.0;
  double dropout_ = 0.0;
  std::shared_ptr<Generator> dropout_gen_;
  bool merged_ = false;
};

// A LinearFactory (nn/layers.h) that makes LoraLinear layers for the targeted names and plain Linear
// layers (uninitialised when `init` is none, else torch.nn.Linear's init from gen) for the others. Build the
// model with it, then call check_targets() to make sure every pattern selected a layer.
class LoraFactory {
 public:
  LoraFactory(LoraConfig c, std::shared_ptr<Generator> gen, std::shared_ptr<Generator> dropout_gen);
  LinearFactory factory();
  // Throws naming the patterns that selected no layer.
  void check_targets() const;
  const std::vector<std::string>& wrapped() const { return wrapped_; }  // full names of the LoRA layers

 private:
  LoraConfig config_;
  std::shared_ptr<Generator> gen_, dropout_gen_;
  std::vector<std::string> wrapped_;
  std::vector<bool> used_;
};

// Whether `name` (a module's full name) is selected by `pattern` (equal, or ends with "." + pattern).
bool lora_target_matches(const std::string& name, const std::string& pattern);
// The LoRA layers below root with their full names.
std::vector<std::pair<std::string, LoraLinear*>> lora_layers(Module& root);
// Merges every LoRA layer below root (LoraLinear::merge); returns how many it merged.
int64_t merge_lora(Module& root);
// Freezes every parameter below root that is not a LoRA adapter (embeddings, norms, untargeted layers), as
// peft does: only the adapters train. Returns the number of parameters it froze.
int64_t freeze_non_lora(Module& root);
// Whether `name` is an adapter's parameter: "<layer>.lora_A.weight" or "<layer>.lora_B.weight".
bool is_lora_adapter_name(const std::string& name);
// Only the adapter tensors ("....lora_A.weight", "....lora_B.weight"), shared storage, detached.
std::map<std::string, Tensor> lora_state_dict(Module& root);

// Note [Frozen base in the compute dtype]
// A frozen parameter gets no gradient and no optimiser update, so it needs no f32 master copy: with a bf16
// forward, an f32 master would only be cast to bf16 again in every step (the same values each time) and
// take twice the memory. store_frozen_in rounds every frozen (requires_grad false) floating parameter of two
// or more dims below root to `dtype` once, in place of its master, so that materialise(param, dtype) returns
// it without a cast (nn/parameter_store.h, cast_master). The forward sees the same values as before (the
// cast is the same round to nearest even), so losses and adapter gradients do not change, bit for bit.
// Only matrices: they are what a model reads in the compute dtype (an LLaMA's Linear weights and its
// embedding table, whose looked-up rows are cast); 1-dim parameters (norm scales, biases) stay in their
// dtype, as norms compute with their master-dtype scale. Checkpoints then hold the frozen matrices in
// `dtype`; loading copies convert, so they load into f32 slots (generation, evaluation, merging) exactly.
struct FrozenStore {
  int64_t params = 0;       // parameters converted
  int64_t bytes_before = 0;  // their bytes before and after
  int64_t bytes_after = 0;
};
FrozenStore store_frozen_in(Module& root, DType dtype);

}  // namespace ht::nn
