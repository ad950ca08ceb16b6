// One include for Catch2 2.x (Debian 12) and 3.x (newer systems).
// HasSubstr(s) is the string-contains matcher under both (Catch2 3 renamed Contains to ContainsSubstring and
// reuses Contains for ranges, so tests never spell either directly).
#pragma once
#include <string>
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define HT_CATCH3 1
using Catch::Approx;
inline Catch::Matchers::StringContainsMatcher HasSubstr(const std::string& s) {
  return Catch::Matchers::ContainsSubstring(s);
}
#else
#include <catch2/catch.hpp>
using Catch::Detail::Approx;
inline Catch::Matchers::StdString::ContainsMatcher HasSubstr(const std::string& s) {
  return Catch::Matchers::Contains(s);
}
#endif
