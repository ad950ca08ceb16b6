// Which parameters train and at what learning rate, by name pattern: freezing (fine-tuning only the last
// stage and the head) and per-pattern learning-rate multipliers (a larger rate for a fresh head). Patterns
// are the gradient pipelines' globs over the full dotted name (grad::glob_match: `*` matches any run of
// characters, dots included; `?` one character).
//
// Note [Frozen parameters]
// A frozen parameter is a module slot that does not require grad. Autograd then builds no edge to it, so it
// never receives a gradient; the optimisers step only parameters that have a gradient and create their state
// on the first step that sees one, so a frozen parameter has no optimiser state and checkpoints hold none
// for it. Module::to keeps a slot's requires_grad, so freezing survives moving the model; LoRA's frozen base
// weights use the same mechanism (requires_grad false on the slot). Batch-norm running statistics are
// buffers, not parameters: a frozen stage in train mode still updates them (as in PyTorch).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/nn/parameter_store.h"

namespace ht::optim {

// Freeze patterns, read in order, the last one that matches a name decides (as in .gitignore): "pattern"
// freezes what it matches, "!pattern" makes it trainable again. ["*", "!layer4.*", "!fc.*"] trains only
// layer4 and fc. A name no pattern matches stays trainable.
struct FreezeRules {
  std::vector<std::string> patterns;
  bool frozen(const std::string& name) const;
};

// (pattern, multiplier) pairs; the first pattern that matches a parameter's name gives its lr_scale (the
// grad_pipeline overrides' rule), parameters matched by none keep 1.
using LrMultipliers = std::vector<std::pair<std::string, double>>;

// What apply_param_rules did, for the run log.
struct ParamRulesReport {
  int64_t frozen_params = 0, frozen_elements = 0;
  int64_t trainable_params = 0, trainable_elements = 0;
  std::vector<std::pair<std::string, double>> scaled;  // parameter name, lr_scale != 1
};

// Sets lr_scale on each ParamRef, and requires_grad on every slot: false for the frozen ones (their gradient,
// if any, is dropped), true for the others. The rules are the one place that decides what trains, so another
// freezing mechanism states itself as patterns placed before the user's (LoRA: "*", "!*.lora_A.*",
// "!*.lora_B.*" in make_optimizer). Errors: a pattern that matches no parameter (a typo would silently
// train everything), naming the pattern and a few parameter names; every parameter frozen.
ParamRulesReport apply_param_rules(std::vector<nn::ParamRef>& params, const FreezeRules& freeze,
                                   const LrMultipliers& lr_multipliers);

}  // namespace ht::optim
