// Builds the messages of HT_CHECK / HT_ASSERT failures.
#include "hadatrain/core/error.h"

#include <cstring>

namespace ht {
namespace {
const char* basename_of(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace

void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg) {
  (void)cond;
  throw Error(fmt::format("{} [{}:{}]", msg, basename_of(file), line));
}

void throw_assert_failure(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(fmt::format("internal error: assertion `{}` failed at {}:{}: {} (this is a hadatrain bug)",
                                  cond, basename_of(file), line, msg));
}
}  // namespace ht
