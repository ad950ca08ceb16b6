// HLQ's quantised backward products on CUDA against the f64 oracle built on the CPU from the quantiser's own codes
// and scales (support/hlq_oracle.h; the CPU and CUDA quantisers produce the same codes, Note [Bit-identical
// quantisation]). The CPU test (tests/cpu/test_hlq_oracle.cpp) runs the same cases: a scale bug shared by both
// backends fails both.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/hlq_oracle.h"

using namespace ht;

TEST_CASE("hlq's g_x and g_w equal the f64 oracle of the quantiser's codes and scales (CUDA)",
          "[gpu][grad][hlq][oracle]") {
  for (const test::OracleCase& c : test::hlq_oracle_cases()) {
    INFO(c.name);
    const test::OracleRun r = test::run_oracle_case(c, test::kCuda);
    CHECK(r.quantiser == "");
    CHECK(r.g_x == "");
    CHECK(r.g_w == "");
    CHECK(r.sensitivity == "");
  }
}
