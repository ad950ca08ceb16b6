// Lists of names in messages: the first few, then how many more, so that an error about thousands of tensors or
// files stays one readable line ("a, b, c and 97 more").
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace ht {

// The first `shown` of `names` joined by ", " (each between `quote`s), then " and N more" for the rest.
inline std::string first_names(const std::vector<std::string>& names, std::size_t shown, const char* quote = "") {
  std::string out;
  for (std::size_t i = 0; i < std::min(shown, names.size()); ++i)
    out += fmt::format("{}{}{}{}", i ? ", " : "", quote, names[i], quote);
  if (names.size() > shown) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

}  // namespace ht
