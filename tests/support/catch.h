// One include for Catch2 2.x (Debian 12) and 3.x (newer systems).
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define HT_CATCH3 1
using Catch::Approx;
#else
#include <catch2/catch.hpp>
using Catch::Detail::Approx;
#endif
