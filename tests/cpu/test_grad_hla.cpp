// HLA (include/hadatrain/grad/hla.h, hlq.md §4): the plan rule against the rank table of hlq.md §4.6, the
// sequency ordering against the Walsh matrix built from the closed form, the triangle equivalence, the
// projector properties (Π² = Π, Πᵀ = Π), exactness at full rank, both layouts, the identity plan for odd L,
// the rejected ranks (reference bug #3), and hla_project_unfolded against hla_project(unfold2d(...)).
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "hadatrain/grad/hla.h"
#include "hadatrain/ops/ops.h"
#include "support/catch.h"
#include "support/testing.h"
#include "support/unfold_cases.h"

using namespace ht;
using grad::HlaLayout;
using grad::HlaPlan;
using grad::HlaRank;

namespace {

// H_n[k][t] = (−1)^popcount(k AND t).
int hadamard(int64_t k, int64_t t) {
  return (__builtin_popcountll(static_cast<unsigned long long>(k & t)) % 2) ? -1 : 1;
}

int sign_changes(int64_t k, int64_t n) {
  int changes = 0;
  for (int64_t t = 1; t < n; ++t) changes += hadamard(k, t) != hadamard(k, t - 1);
  return changes;
}

// The projection written from the definition: out[b][p·r + i][c] = Σ_t H_n[rows[i]][t]·x[b][p·n + t][c], in
// double, from the f32 values of x.
std::vector<double> naive_project(const Tensor& x, const HlaPlan& plan) {
  const int64_t B = x.size(0), L = x.size(1), C = x.size(2), n = plan.block, r = plan.kept(), P = L / n;
  const auto xv = x.to(DType::f32).contiguous().to_vector<double>();
  std::vector<double> out(static_cast<std::size_t>(B * P * r * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t i = 0; i < r; ++i)
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0;
          for (int64_t t = 0; t < n; ++t)
            acc += hadamard(plan.rows[static_cast<std::size_t>(i)], t) *
                   xv[static_cast<std::size_t>((b * L + p * n + t) * C + c)];
          out[static_cast<std::size_t>((b * P * r + p * r + i) * C + c)] = acc;
        }
  return out;
}

// (n, n) identity as a (1, n, n) f64 tensor.
Tensor eye3(int64_t n) {
  std::vector<double> v(static_cast<std::size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i * n + i)] = 1.0;
  return from_vector(v, {1, n, n});
}

}  // namespace

TEST_CASE("hla_block_for is the largest power of two dividing L", "[hla]") {
  CHECK(grad::hla_block_for(1024) == 1024);
  CHECK(grad::hla_block_for(3136) == 64);
  CHECK(grad::hla_block_for(784) == 16);
  CHECK(grad::hla_block_for(12544) == 256);
  CHECK(grad::hla_block_for(196) == 4);
  CHECK(grad::hla_block_for(197) == 1);
  CHECK(grad::hla_block_for(49) == 1);
  CHECK(grad::hla_block_for(4096) == 4096);
  CHECK_THROWS_WITH(grad::hla_block_for(0), HasSubstr("length must be >= 1"));
}

TEST_CASE("hla_plan reproduces the rank table of hlq.md 4.6", "[hla]") {
  struct Row {
    int64_t length, block, kept;
  };
  const std::vector<Row> table = {{16, 16, 10},    {64, 64, 36},  {256, 256, 136}, {1024, 1024, 528},
                                  {3136, 64, 36},  {784, 16, 10}, {12544, 256, 136}, {196, 4, 3},
                                  {197, 1, 1},     {49, 1, 1},    {32, 32, 10},    {128, 128, 36},
                                  {512, 512, 136}, {4, 4, 3},     {1, 1, 1}};
  for (const Row& row : table) {
    const HlaPlan plan = grad::hla_plan(row.length, HlaRank::of_pct(50));
    INFO(plan.describe());
    CHECK(plan.length == row.length);
    CHECK(plan.block == row.block);
    CHECK(plan.kept() == row.kept);
    CHECK(plan.projected_length() == row.length / row.block * row.kept);
  }
  CHECK(grad::hla_plan(64, HlaRank::of_pct(10)).kept() == 10);
  CHECK(grad::hla_plan(64, HlaRank::of_pct(25)).kept() == 21);
  CHECK(grad::hla_plan(64, HlaRank::of_pct(50)).kept() == 36);
  CHECK(grad::hla_plan(1024, HlaRank::of_pct(50)).describe() == "L 1024: n 1024, r 528 (51.6 %)");
  CHECK(grad::hla_plan(197, HlaRank::of_pct(50)).describe() == "L 197: n 1, r 1 (100.0 %)");
  // n = 16 at pct 50, group by group: {0 1 2 3} {5 6 7} {8 9} {15}.
  CHECK(grad::hla_sequency_rows(16, HlaRank::of_pct(50)) == std::vector<int32_t>{0, 1, 2, 3, 5, 6, 7, 8, 9, 15});
}

TEST_CASE("hla plan rows are sequency rows of the Walsh matrix, ascending", "[hla]") {
  for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
    const HlaPlan full = grad::hla_plan(n, HlaRank::all());
    REQUIRE(full.kept() == n);
    std::set<int32_t> seen;
    for (int64_t j = 0; j < n; ++j) {
      const int32_t k = full.rows[static_cast<std::size_t>(j)];
      REQUIRE(k >= 0);
      REQUIRE(k < n);
      seen.insert(k);
      CHECK(sign_changes(k, n) == j);  // row j of S_n has exactly j sign changes
    }
    CHECK(static_cast<int64_t>(seen.size()) == n);
    // Every plan's natural rows follow its sequency rows through the same map.
    const auto seq = grad::hla_sequency_rows(n, HlaRank::of_pct(50));
    const HlaPlan plan = grad::hla_plan(n, HlaRank::of_pct(50));
    REQUIRE(seq.size() == plan.rows.size());
    CHECK(std::is_sorted(seq.begin(), seq.end()));
    for (std::size_t i = 0; i < seq.size(); ++i) CHECK(plan.rows[i] == full.rows[static_cast<std::size_t>(seq[i])]);
  }
}

TEST_CASE("the percentile rule keeps the 2-D low-pass triangle (Kind::rows equivalence)", "[hla]") {
  for (int64_t n : {4, 8, 16, 32, 64, 128, 256, 512, 1024}) {
    int64_t m = 0;
    while ((int64_t{1} << m) < n) ++m;
    const int64_t s = int64_t{1} << (m / 2);
    for (double pct : {1.0, 5.0, 10.0, 17.5, 25.0, 33.0, 40.0, 50.0}) {
      const double sd = static_cast<double>(s);
      const int64_t sf = static_cast<int64_t>(0.1 * (10 * sd + 5 - std::sqrt(2 * sd * sd * pct + 25)));
      const int64_t r = (s - sf) * (s - sf + 1) / 2;
      INFO("n " << n << " pct " << pct << " sf " << sf);
      const auto by_pct = grad::hla_sequency_rows(n, HlaRank::of_pct(pct));
      CHECK(static_cast<int64_t>(by_pct.size()) == r);
      CHECK(grad::hla_sequency_rows(n, HlaRank::of_rows(r)) == by_pct);
      // Written out: u + v <= s − 1 − sf with index u·s + (v if u even else s − 1 − v).
      std::vector<int32_t> tri;
      for (int64_t u = 0; u < s; ++u)
        for (int64_t v = 0; v < s; ++v)
          if (u + v <= s - 1 - sf) tri.push_back(static_cast<int32_t>(u * s + (u % 2 == 0 ? v : s - 1 - v)));
      std::sort(tri.begin(), tri.end());
      CHECK(tri == by_pct);
    }
  }
  // Kind::rows between triangle sizes: the first r pairs in (u + v, then u) order. s = 8 (n 64), r = 4:
  // (0,0) (0,1) (1,0) (0,2) -> indices 0, 1, 8 + 7 = 15, 2.
  CHECK(grad::hla_sequency_rows(64, HlaRank::of_rows(4)) == std::vector<int32_t>{0, 1, 2, 15});
  CHECK(grad::hla_sequency_rows(64, HlaRank::of_rows(64)).size() == 64);
}

TEST_CASE("hla_plan rejects pct outside (0, 50] and bad rows (bug #3 regression)", "[hla]") {
  CHECK_THROWS_WITH(grad::hla_plan(64, HlaRank::of_pct(75)), HasSubstr("pct must be in (0, 50]"));
  CHECK_THROWS_WITH(grad::hla_plan(64, HlaRank::of_pct(50.5)), HasSubstr("got 50.5"));
  CHECK_THROWS_WITH(grad::hla_plan(64, HlaRank::of_pct(0)), HasSubstr("pct must be in (0, 50]"));
  CHECK_THROWS_WITH(grad::hla_plan(64, HlaRank::of_pct(-3)), HasSubstr("pct must be in (0, 50]"));
  CHECK_THROWS_WITH(grad::hla_plan(197, HlaRank::of_pct(75)), HasSubstr("pct must be in (0, 50]"));
  CHECK_THROWS_WITH(grad::hla_plan(64, HlaRank::of_rows(0)), HasSubstr("rows >= 1"));
  CHECK_THROWS_WITH(grad::hla_plan(64, HlaRank::of_rows(65)), HasSubstr("exceeds s² = 64"));
  CHECK_THROWS_WITH(grad::hla_plan(32, HlaRank::of_rows(17)), HasSubstr("exceeds s² = 16"));
  CHECK_THROWS_WITH(grad::hla_plan(0, HlaRank::of_pct(50)), HasSubstr("length L must be >= 1"));
  CHECK_THROWS_WITH(grad::hla_sequency_rows(12, HlaRank::of_pct(50)), HasSubstr("power of two"));
  // A valid rank on odd L: identity plan.
  CHECK(grad::hla_plan(49, HlaRank::of_rows(5)).rows == std::vector<int32_t>{0});
}

TEST_CASE("hla_project matches the definition (bf16, f32, f64, non-contiguous)", "[hla]") {
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    for (int64_t L : {16, 48, 64, 12, 7}) {
      const Tensor base = test::random_tensor({3, 5, L}, 11 + L, dt, -2, 2);  // (B, C, L)
      const Tensor x = base.transpose(1, 2);                                    // (B, L, C) non-contiguous
      REQUIRE_FALSE(x.is_contiguous());
      const HlaPlan plan = grad::hla_plan(L, HlaRank::of_pct(50));
      const Tensor out = grad::hla_project(x, plan);
      INFO(dtype_name(dt) << " " << plan.describe());
      CHECK(out.dtype() == DType::f32);
      CHECK(out.shape() == Shape{3, plan.projected_length(), 5});
      CHECK(test::compare(out, naive_project(x, plan), 1e-5, 1e-5) == "");
    }
  }
  // Integer-valued inputs: every partial sum is exact, so the result equals the definition exactly.
  std::vector<double> iv(2 * 64 * 3);
  for (std::size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<double>(static_cast<int>((i * 37) % 101) - 50);
  const Tensor xi = from_vector(iv, {2, 64, 3}).to(DType::f32);
  const HlaPlan plan = grad::hla_plan(64, HlaRank::all());
  CHECK(test::compare(grad::hla_project(xi, plan), naive_project(xi, plan), 0, 0) == "");
}

TEST_CASE("both hla layouts hold the same values (channels = rows transposed)", "[hla]") {
  const Tensor x = test::random_tensor({3, 96, 7}, 3, DType::bf16);
  for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::of_pct(10), HlaRank::all(), HlaRank::of_rows(5)}) {
    const HlaPlan plan = grad::hla_plan(96, rank);
    const Tensor a = grad::hla_project(x, plan, HlaLayout::rows);      // (B, R, C)
    const Tensor b = grad::hla_project(x, plan, HlaLayout::channels);  // (B, C, R)
    CHECK(b.shape() == Shape{3, 7, plan.projected_length()});
    CHECK(b.is_contiguous());
    CHECK(test::compare(b, a.transpose(1, 2).contiguous().to_vector<double>(), 0, 0) == "");
  }
}

TEST_CASE("the HLA projector is an orthogonal projector", "[hla]") {
  for (int64_t L : {4, 16, 32, 64, 48, 128}) {
    for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::of_pct(20), HlaRank::of_rows(3), HlaRank::all()}) {
      const HlaPlan plan = grad::hla_plan(L, rank);
      INFO(plan.describe());
      // Identity input: the projection is P (R × L), blockdiag of the kept Hadamard rows.
      const Tensor P = select(grad::hla_project(eye3(L), plan), 0, 0).to(DType::f64);  // (R, L)
      const int64_t R = plan.projected_length();
      REQUIRE(P.shape() == Shape{R, L});
      const double n = static_cast<double>(plan.block);
      CHECK(test::compare(matmul(P, P.transpose(0, 1)), mul(select(eye3(R), 0, 0), n).to_vector<double>(), 0, 1e-9) ==
            "");
      const Tensor pi = div(matmul(P.transpose(0, 1), P), n);  // (L, L)
      CHECK(test::compare(matmul(pi, pi), pi.to_vector<double>(), 1e-12, 1e-12) == "");
      CHECK(test::compare(pi.transpose(0, 1).contiguous(), pi.to_vector<double>(), 0, 0) == "");
      // The trace of a projector is its rank.
      double tr = 0;
      const auto pv = pi.to_vector<double>();
      for (int64_t i = 0; i < L; ++i) tr += pv[static_cast<std::size_t>(i * L + i)];
      CHECK(tr == Approx(static_cast<double>(R)).epsilon(1e-12));
    }
  }
}

TEST_CASE("full-rank HLA reproduces g_yᵀx summed over samples", "[hla]") {
  for (int64_t L : {64, 48, 12, 5}) {
    const int64_t B = 3, O = 6, I = 9;
    const Tensor g = test::random_tensor({B, L, O}, 21, DType::f32);
    const Tensor x = test::random_tensor({B, L, I}, 22, DType::f32);
    const HlaPlan plan = grad::hla_plan(L, HlaRank::all());
    const Tensor pg = grad::hla_project(g, plan).to(DType::f64);  // (B, L, O)
    const Tensor px = grad::hla_project(x, plan).to(DType::f64);  // (B, L, I)
    const Tensor approx = div(sum(matmul(pg.transpose(1, 2), px), {0}), static_cast<double>(plan.block));
    const Tensor exact = sum(matmul(g.to(DType::f64).transpose(1, 2), x.to(DType::f64)), {0});  // (O, I)
    INFO(plan.describe());
    CHECK(test::compare(approx, exact.to_vector<double>(), 1e-5, 1e-5) == "");
    // Reduced rank is a low-pass: it differs from the exact product when n > 1.
    if (plan.block > 1) {
      const HlaPlan low = grad::hla_plan(L, HlaRank::of_pct(50));
      const Tensor lg = grad::hla_project(g, low).to(DType::f64), lx = grad::hla_project(x, low).to(DType::f64);
      const Tensor a2 = div(sum(matmul(lg.transpose(1, 2), lx), {0}), static_cast<double>(low.block));
      CHECK_FALSE(test::compare(a2, exact.to_vector<double>(), 1e-3, 1e-3) == "");
    }
  }
}

TEST_CASE("hla identity plan for odd L copies x as f32", "[hla]") {
  const Tensor x = test::random_tensor({2, 197, 5}, 8, DType::bf16);
  const HlaPlan plan = grad::hla_plan(197, HlaRank::of_pct(50));
  CHECK(plan.block == 1);
  CHECK(plan.rows == std::vector<int32_t>{0});
  CHECK(plan.projected_length() == 197);
  CHECK(test::compare(grad::hla_project(x, plan), x.to(DType::f32).to_vector<double>(), 0, 0) == "");
  CHECK(test::compare(grad::hla_project(x, plan, HlaLayout::channels),
                      x.to(DType::f32).transpose(1, 2).contiguous().to_vector<double>(), 0, 0) == "");
}

TEST_CASE("hla_project reports the largest magnitude it wrote", "[hla]") {
  for (int64_t L : {64, 197}) {
    const Tensor x = test::random_tensor({3, L, 7}, 9, DType::f32, -3.0, 3.0);
    const HlaPlan plan = grad::hla_plan(L, HlaRank::of_pct(50));
    for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
      Tensor m;
      const Tensor y = grad::hla_project(x, plan, layout, &m);
      REQUIRE(m.defined());
      double want = 0;
      for (double v : y.to_vector<double>()) want = std::max(want, std::fabs(v));
      CHECK(m.shape() == Shape{1});
      CHECK(m.dtype() == DType::f32);
      CHECK(m.item() == want);
      CHECK(want > 0);
      CHECK(test::compare(y, grad::hla_project(x, plan, layout).to_vector<double>(), 0, 0) == "");
    }
  }
}

TEST_CASE("hla_project rejects bad inputs", "[hla]") {
  const HlaPlan plan = grad::hla_plan(64, HlaRank::of_pct(50));
  CHECK_THROWS_WITH(grad::hla_project(test::random_tensor({64, 3}, 1), plan), HasSubstr("must be (B, L, C)"));
  CHECK_THROWS_WITH(grad::hla_project(test::random_tensor({2, 32, 3}, 1), plan), HasSubstr("plan is for L = 64"));
  CHECK_THROWS_WITH(grad::hla_project(ones({2, 64, 3}, {DType::i32}), plan), HasSubstr("expected a floating"));
  HlaPlan bad = plan;
  bad.rows.push_back(64);
  CHECK_THROWS_WITH(grad::hla_project(test::random_tensor({2, 64, 3}, 1), bad), HasSubstr("natural row 64"));
}

TEST_CASE("hla_project_unfolded equals hla_project of the unfolded columns", "[hla]") {
  struct Case {
    int64_t C, H, W;
    Unfold2dParams window;
  };
  // 3x3 s1 p1 on 8x8 (L 64), 3x3 s2 p1 on 8x8 (L 16), 1x1 s2 on 6x6 (L 9: identity plan), 2x2 dilation 2 on
  // 10x10 (L 64), 4x4 stride 4 patches of 16x16 (L 16).
  const Case cases[] = {{3, 8, 8, test::square_window(3, 1, 1)},
                        {5, 8, 8, test::square_window(3, 2, 1)},
                        {4, 6, 6, test::square_window(1, 2, 0)},
                        {2, 10, 10, test::square_window(2, 1, 0, 2)},
                        {3, 16, 16, test::square_window(4, 4, 0)}};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    for (bool channels_last : {false, true}) {
      // channels-last: an (N, H, W, C) tensor viewed as (N, C, H, W)
      const Tensor image = channels_last
                               ? test::random_tensor({2, c.H, c.W, c.C}, seed++, DType::bf16).permute({0, 3, 1, 2})
                               : test::random_tensor({2, c.C, c.H, c.W}, seed++, DType::bf16);
      const Tensor cols = unfold2d(image, c.window);
      for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::all()}) {
        const HlaPlan plan = grad::hla_plan(cols.size(1), rank);
        for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
          INFO("C " << c.C << " " << c.H << "x" << c.W << " k " << c.window.kernel_h << " s " << c.window.stride_h
                    << (channels_last ? " channels-last " : " NCHW ") << plan.describe()
                    << (layout == HlaLayout::rows ? " rows" : " channels"));
          Tensor m_fused, m_comp;
          const Tensor fused = grad::hla_project_unfolded(image, c.window, plan, layout, &m_fused);
          const Tensor comp = grad::hla_project(cols, plan, layout, &m_comp);
          CHECK(fused.shape() == comp.shape());
          CHECK(test::compare(fused, comp.to_vector<double>(), 0, 0) == "");
          CHECK(m_fused.item() == m_comp.item());
        }
      }
    }
  }
}

TEST_CASE("hla_project_unfolded rejects bad inputs", "[hla]") {
  const HlaPlan plan = grad::hla_plan(64, HlaRank::of_pct(50));
  const Tensor flat = test::random_tensor({2, 3, 64}, 1);
  CHECK_THROWS_WITH(grad::hla_project_unfolded(flat, test::square_window(3, 1, 1), plan),
                    HasSubstr("image must be (N, C, H, W), got " + flat.describe()));
  // A plan for another length: 8x8 with 3x3 stride 2 padding 1 has L = 16.
  CHECK_THROWS_WITH(
      grad::hla_project_unfolded(test::random_tensor({2, 3, 8, 8}, 1), test::square_window(3, 2, 1), plan),
      HasSubstr("plan is for L = 64"));
  CHECK_THROWS_WITH(
      grad::hla_project_unfolded(test::random_tensor({2, 3, 2, 2}, 1), test::square_window(3, 1, 0), plan),
      HasSubstr("larger than the padded image"));
}

TEST_CASE("hla_back_project is the adjoint: P_rᵀ·g, and back(project(x)) / n = Π·x", "[hla]") {
  uint64_t seed = 40;
  for (int64_t L : {4, 16, 48, 64, 197}) {
    for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::of_rows(3), HlaRank::all()}) {
      const HlaPlan plan = grad::hla_plan(L, rank);
      INFO(plan.describe());
      const int64_t B = 2, C = 5, n = plan.block, r = plan.kept(), P = L / n, R = plan.projected_length();
      // The definition in double: out[b][p·n + t][c] = Σ_i H_n[rows[i]][t]·g[b][p·r + i][c].
      const Tensor g = test::random_tensor({B, R, C}, seed++, DType::f32, -2.0, 2.0);
      const auto gv = g.to_vector<double>();
      std::vector<double> want(static_cast<std::size_t>(B * L * C), 0.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t p = 0; p < P; ++p)
          for (int64_t t = 0; t < n; ++t)
            for (int64_t c = 0; c < C; ++c) {
              double acc = 0;
              for (int64_t i = 0; i < r; ++i)
                acc += hadamard(plan.rows[static_cast<std::size_t>(i)], t) *
                       gv[static_cast<std::size_t>((b * R + p * r + i) * C + c)];
              want[static_cast<std::size_t>((b * L + p * n + t) * C + c)] = acc * 0.25;
            }
      const Tensor back = grad::hla_back_project(g, plan, 0.25, DType::f32);
      REQUIRE(back.shape() == Shape{B, L, C});
      CHECK(test::compare(back, want, 1e-6, 1e-6) == "");
      // A non-contiguous g (the channels layout viewed as rows) and a bf16 result: the same values, rounded once.
      const Tensor gt = g.transpose(1, 2).contiguous().transpose(1, 2);
      CHECK(test::compare(grad::hla_back_project(gt, plan, 0.25, DType::f32), back.to_vector<double>(), 0, 0) == "");
      CHECK(test::compare(grad::hla_back_project(g, plan, 0.25, DType::bf16),
                          back.to(DType::bf16).to_vector<double>(), 0, 0) == "");
      // Π·x = back(project(x)) / n: idempotent, and x itself at full rank.
      const Tensor x = test::random_tensor({B, L, C}, seed++, DType::f32);
      const Tensor pix = grad::hla_back_project(grad::hla_project(x, plan), plan, 1.0 / static_cast<double>(n),
                                                DType::f64);
      const Tensor pipix = grad::hla_back_project(grad::hla_project(pix, plan), plan, 1.0 / static_cast<double>(n),
                                                  DType::f64);
      CHECK(test::compare(pipix, pix.to_vector<double>(), 1e-5, 1e-5) == "");
      if (r == n) CHECK(test::compare(pix, x.to_vector<double>(), 1e-5, 1e-5) == "");
      if (r < n) CHECK_FALSE(test::compare(pix, x.to_vector<double>(), 1e-2, 1e-2) == "");
    }
  }
}

TEST_CASE("hla_back_project rejects bad inputs", "[hla]") {
  const HlaPlan plan = grad::hla_plan(64, HlaRank::of_pct(50));  // r 36
  CHECK_THROWS_WITH(grad::hla_back_project(test::random_tensor({36, 3}, 1), plan, 1.0, DType::f32),
                    HasSubstr("must be (B, R, C)"));
  CHECK_THROWS_WITH(grad::hla_back_project(test::random_tensor({2, 35, 3}, 1), plan, 1.0, DType::f32),
                    HasSubstr("expected (B, 36, C)"));
  CHECK_THROWS_WITH(grad::hla_back_project(test::random_tensor({2, 36, 3}, 1), plan, 1.0, DType::i8),
                    HasSubstr("output dtype must be"));
  CHECK_THROWS_WITH(grad::hla_back_project(ones({2, 36, 3}, {DType::i32}), plan, 1.0, DType::f32),
                    HasSubstr("expected a floating"));
  HlaPlan bad = plan;
  bad.rows.back() = 64;
  CHECK_THROWS_WITH(grad::hla_back_project(test::random_tensor({2, 36, 3}, 1), bad, 1.0, DType::f32),
                    HasSubstr("natural row 64"));
}
