// HLQ's quantised backward products on the CPU against an f64 oracle built from the quantiser's own codes and
// scales (support/hlq_oracle.h): g_x from the 4-bit Hadamard-rotated g_y and W, g_w from HLA's projected 8-bit
// g̃ and x̃. The codes and scales are first checked against the data (absmax / SAWB from the definition, each code
// in its rounding interval), so a scale bug in the quantiser or in a pipeline's product fails here.
#include "support/catch.h"
#include "support/hlq_oracle.h"

using namespace ht;

TEST_CASE("hlq's g_x and g_w equal the f64 oracle of the quantiser's codes and scales (CPU)", "[grad][hlq][oracle]") {
  for (const test::OracleCase& c : test::hlq_oracle_cases()) {
    INFO(c.name);
    const test::OracleRun r = test::run_oracle_case(c, Device::cpu());
    CHECK(r.quantiser == "");
    CHECK(r.g_x == "");
    CHECK(r.g_w == "");
    CHECK(r.sensitivity == "");
    // The oracle is a 4-bit estimate of g_y·W (docs/gradient_pipelines.md: relative error below 0.35 on random
    // data) and an 8-bit one of the projected g_w (SAWB clips x̃ near 2.4σ, hlq.md §7 #11, and 4-bit ACBP keeps
    // 15 levels: 0.06 to 0.15 on these cases): it really quantised, and it estimates the right products.
    CHECK(r.gx_error > 0.01);
    CHECK(r.gx_error < 0.35);
    CHECK(r.gw_error > 1e-3);
    CHECK(r.gw_error < 0.25);
  }
}
