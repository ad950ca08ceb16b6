// One include for Catch2 2.x (Debian 12) and 3.x (newer systems).
// Catch2 3 renamed the string matcher Contains to ContainsSubstring (its Contains matches ranges); the
// non-template overloads below restore the 2.x spelling for strings, and win overload resolution over the
// range template for string literals and std::string arguments.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define HT_CATCH3 1
#include <string>
namespace Catch::Matchers {
inline StringContainsMatcher Contains(const std::string& s, CaseSensitive cs = CaseSensitive::Yes) {
  return ContainsSubstring(s, cs);
}
inline StringContainsMatcher Contains(const char* s, CaseSensitive cs = CaseSensitive::Yes) {
  return ContainsSubstring(s, cs);
}
}  // namespace Catch::Matchers
using Catch::Approx;
#else
#include <catch2/catch.hpp>
using Catch::Detail::Approx;
#endif
