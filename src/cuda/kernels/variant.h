// Environment switches between kernel variants (HADATRAIN_NORM_KERNEL, HADATRAIN_BN_CF_KERNEL, ...): one parser
// for every launcher, which caches its result in a function-local static (read once per process).
#pragma once
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace ht::kernels {

struct VariantName {
  const char* name;
  int variant;
};

// The variant the environment variable `var` names: one of `names`, by its name or by its number written in
// decimal; `unset` when the variable is absent or empty; `unknown` for any other value.
inline int env_variant(const char* var, std::initializer_list<VariantName> names, int unset, int unknown) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return unset;
  for (const VariantName& n : names)
    if (std::string(e) == n.name || std::string(e) == std::to_string(n.variant)) return n.variant;
  return unknown;
}

}  // namespace ht::kernels
