// Freezing and learning-rate multipliers by name pattern (optim/param_rules.h, Note [Frozen parameters]).
#include "hadatrain/optim/param_rules.h"

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/grad/pipeline.h"

namespace ht::optim {
namespace {

std::string strip_bang(const std::string& p) { return !p.empty() && p[0] == '!' ? p.substr(1) : p; }

std::string some_names(const std::vector<nn::ParamRef>& params) {
  std::string out;
  for (std::size_t i = 0; i < params.size() && i < 6; ++i) out += (i ? ", " : "") + params[i].name;
  if (params.size() > 6) out += fmt::format(", ... ({} in all)", params.size());
  return out;
}

// `pattern` as the config wrote it (train.freeze's '!' kept) and the glob it matches with.
void check_matches(const std::string& what, const std::string& pattern, const std::string& glob,
                   const std::vector<nn::ParamRef>& params) {
  for (const auto& p : params)
    if (grad::glob_match(glob, p.name)) return;
  HT_FAIL("{}: the pattern '{}' matches no parameter (parameters: {})", what, pattern, some_names(params));
}

}  // namespace

bool FreezeRules::frozen(const std::string& name) const {
  bool out = false;
  for (const std::string& p : patterns)
    if (grad::glob_match(strip_bang(p), name)) out = p.empty() || p[0] != '!';
  return out;
}

ParamRulesReport apply_param_rules(std::vector<nn::ParamRef>& params, const FreezeRules& freeze,
                                   const LrMultipliers& lr_multipliers) {
  for (const std::string& p : freeze.patterns) {
    HT_CHECK(!strip_bang(p).empty(), "train.freeze: an empty pattern");
    check_matches("train.freeze", p, strip_bang(p), params);
  }
  for (const auto& [pattern, mult] : lr_multipliers) {
    HT_CHECK(mult >= 0, "optim.lr_multipliers: '{}' has multiplier {}; it must be >= 0", pattern, mult);
    check_matches("optim.lr_multipliers", pattern, pattern, params);
  }
  ParamRulesReport r;
  for (nn::ParamRef& p : params) {
    p.lr_scale = 1.0;
    for (const auto& [pattern, mult] : lr_multipliers)
      if (grad::glob_match(pattern, p.name)) {
        p.lr_scale = mult;
        break;
      }
    if (freeze.frozen(p.name)) {
      p.param->zero_grad();
      p.param->set_requires_grad(false);
      ++r.frozen_params;
      r.frozen_elements += p.param->numel();
    } else {
      if (!p.param->requires_grad()) p.param->set_requires_grad(true);
      ++r.trainable_params;
      r.trainable_elements += p.param->numel();
      if (p.lr_scale != 1.0) r.scaled.emplace_back(p.name, p.lr_scale);
    }
  }
  HT_CHECK(r.trainable_params > 0, "train.freeze: the patterns [{}] freeze all {} parameters; nothing would train",
           fmt::format("{}", fmt::join(freeze.patterns, ", ")), params.size());
  return r;
}

}  // namespace ht::optim
