// cuda/kernels/variant.h: the environment switch between kernel variants (names, numbers, unset and unknown values).
#include <cstdlib>

#include "cuda/kernels/variant.h"
#include "support/catch.h"

using ht::kernels::env_variant;

TEST_CASE("env_variant reads a variant by name or number, with separate unset and unknown results", "[kernels]") {
  const char* var = "HADATRAIN_TEST_KERNEL_VARIANT";
  auto read = [&] { return env_variant(var, {{"old", 1}, {"staged", 2}, {"tuned", 2}, {"reg", 3}}, 0, 7); };
  ::unsetenv(var);
  CHECK(read() == 0);
  ::setenv(var, "", 1);
  CHECK(read() == 0);
  ::setenv(var, "reg", 1);
  CHECK(read() == 3);
  ::setenv(var, "tuned", 1);
  CHECK(read() == 2);
  ::setenv(var, "1", 1);
  CHECK(read() == 1);
  ::setenv(var, "3", 1);
  CHECK(read() == 3);
  ::setenv(var, "4", 1);  // a number no variant has
  CHECK(read() == 7);
  ::setenv(var, "Reg", 1);  // names are case-sensitive
  CHECK(read() == 7);
  ::setenv(var, "01", 1);
  CHECK(read() == 7);
  ::unsetenv(var);
}
