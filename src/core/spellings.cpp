// Other spellings of option values (core/spellings.h).
#include "hadatrain/core/spellings.h"

namespace ht {

const Spellings& float_spellings() {  // Note [Float spellings]
  static const Spellings s = {{"f32", "fp32"}, {"f64", "fp64"}};
  return s;
}

const std::string& canonical_spelling(const std::string& value, const Spellings& spellings) {
  for (const auto& [alias, canonical] : spellings)
    if (value == alias) return canonical;
  return value;
}

std::string with_aliases(const std::string& name, const Spellings& spellings) {
  std::string aliases;
  for (const auto& [alias, canonical] : spellings)
    if (canonical == name) aliases += (aliases.empty() ? "" : ", ") + alias;
  return aliases.empty() ? name : name + " (or " + aliases + ")";
}

}  // namespace ht
