// HLA projection on CUDA against the CPU reference, bit for bit (include/hadatrain/grad/hla.h: both sides
// convert to f32 and run the same butterfly with round-to-nearest adds): L in {16, 64, 196 (n 4), 784 (n 16),
// 1024, 197 (n 1), 2048 (n > 1024, large shared memory)}, odd B and C, f32 / bf16 / f16 / f64 / fp8 inputs,
// both layouts, non-contiguous inputs, every rank kind, poisoned CUDA allocations; the reported max |out|.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include "hadatrain/grad/hla.h"

using namespace ht;
using grad::HlaLayout;
using grad::HlaPlan;
using grad::HlaRank;

namespace {

HlaRank pct_rank(double pct) {
  HlaRank r;
  r.pct = pct;
  return r;
}
HlaRank full_rank() {
  HlaRank r;
  r.kind = HlaRank::Kind::full;
  return r;
}
HlaRank rows_rank(int64_t rows) {
  HlaRank r;
  r.kind = HlaRank::Kind::rows;
  r.rows = rows;
  return r;
}

// CUDA and CPU projections of the same values in both layouts; "" when the bits agree.
std::string check_project(const Tensor& x_cpu, const HlaPlan& plan) {
  test::PoisonGuard poison;
  const Tensor x_gpu = x_cpu.to(test::kCuda);
  for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
    Tensor max_cpu, max_gpu;  // max |projection|, reported by the projection (HLQ's 8-bit quantiser uses it)
    const Tensor expected = grad::hla_project(x_cpu, plan, layout, &max_cpu);
    const Tensor actual = grad::hla_project(x_gpu, plan, layout, &max_gpu);
    if (actual.device() != test::kCuda) return "result not on CUDA";
    const std::string err = test::compare_bits(actual, expected);
    if (!err.empty()) return std::string(layout == HlaLayout::rows ? "rows: " : "channels: ") + err;
    const std::string merr = test::compare_bits(max_gpu, max_cpu);
    if (!merr.empty()) return "absmax: " + merr;
  }
  return "";
}

}  // namespace

TEST_CASE("hla_project on CUDA equals the CPU bit for bit", "[gpu][hla]") {
  uint64_t seed = 1;
  for (int64_t L : {16, 64, 196, 784, 1024, 197}) {
    for (int64_t C : {37, 67}) {
      for (DType dt : {DType::bf16, DType::f32}) {
        const Tensor x = test::random_input({3, L, C}, seed++, dt, -4, 4);  // (B, L, C)
        for (const HlaRank& rank : {pct_rank(50), pct_rank(10), full_rank()}) {
          const HlaPlan plan = grad::hla_plan(L, rank);
          INFO(dtype_name(dt) << " C " << C << " " << plan.describe());
          CHECK(check_project(x, plan) == "");
        }
      }
    }
  }
}

TEST_CASE("hla_project on CUDA reads non-contiguous inputs and every floating dtype", "[gpu][hla]") {
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8e4m3}) {
    for (int64_t L : {64, 784}) {
      INFO(dtype_name(dt) << " L " << L);
      // (B, C, L) transposed to (B, L, C): channels are strided, L contiguous.
      const Tensor xt = test::random_input({5, 37, L}, seed++, dt, -3, 3).transpose(1, 2);
      REQUIRE_FALSE(xt.is_contiguous());
      CHECK(check_project(xt, grad::hla_plan(L, pct_rank(50))) == "");
      // A slice along C: row stride larger than C.
      const Tensor xs = slice(test::random_input({3, L, 70}, seed++, dt, -3, 3), 2, 1, 68, 1);
      CHECK(check_project(xs, grad::hla_plan(L, rows_rank(7))) == "");
    }
  }
}

TEST_CASE("hla_project on CUDA handles blocks beyond 1024, wide tiles and tiny channel counts", "[gpu][hla]") {
  // n = 2048: eight channels per CTA, 73 KiB of shared memory; full rank keeps all 2048 rows.
  const Tensor x = test::random_input({1, 2048, 19}, 7, DType::bf16, -2, 2);
  CHECK(check_project(x, grad::hla_plan(2048, pct_rank(50))) == "");
  CHECK(check_project(x, grad::hla_plan(2048, full_rank())) == "");
  // n = 8192 (one or two channels per CTA), C = 1.
  const Tensor y = test::random_input({1, 8192, 3}, 8, DType::f32, -2, 2);
  CHECK(check_project(y, grad::hla_plan(8192, pct_rank(25))) == "");
  const Tensor z = test::random_input({3, 96, 1}, 9, DType::f32, -2, 2);
  CHECK(check_project(z, grad::hla_plan(96, pct_rank(50))) == "");
  // Small blocks take wide channel tiles (n 4: 256 channels per CTA, n 16: 128): several tiles plus a partial one.
  const Tensor w4 = test::random_input({3, 196, 601}, 10, DType::bf16, -2, 2);
  CHECK(check_project(w4, grad::hla_plan(196, pct_rank(50))) == "");
  const Tensor w16 = test::random_input({3, 48, 333}, 11, DType::f32, -2, 2);
  CHECK(check_project(w16, grad::hla_plan(48, full_rank())) == "");
  // Empty batch: nothing to write, right shape.
  const Tensor e = grad::hla_project(zeros({0, 64, 5}, {DType::f32, test::kCuda}), grad::hla_plan(64, pct_rank(50)));
  CHECK(e.shape() == Shape{0, 36, 5});
}
