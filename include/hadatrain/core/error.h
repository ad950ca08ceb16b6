// Errors. User-triggerable problems (bad shapes, dtypes, config values, files) throw through HT_CHECK;
// broken internal invariants throw through HT_ASSERT. Library code never calls exit() or abort().
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ht {

// A problem the user can fix (input shapes, dtypes, config, files).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken invariant inside hadatrain: a bug to report.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg);
[[noreturn]] void throw_assert_failure(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace ht

// HT_CHECK(cond, "format {}", args...): throws ht::Error naming the failed condition and the message.
#define HT_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::ht::throw_check_failure(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// HT_ASSERT(cond, "format {}", args...): throws ht::InternalError (a hadatrain bug).
#define HT_ASSERT(cond, ...)                                                          \
  do {                                                                                \
    if (!(cond)) [[unlikely]]                                                         \
      ::ht::throw_assert_failure(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define HT_FAIL(...) ::ht::throw_check_failure(__FILE__, __LINE__, nullptr, ::fmt::format(__VA_ARGS__))
