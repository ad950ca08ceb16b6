// matmul and linear: against naive loops (2-D, odd sizes, broadcast batches, 1-D operands), the GEMM
// layout choice (transposed views take the trans flag, column slices pass a leading dim, stepped slices
// are copied), narrow dtypes against f64 (one rounding per output), gradchecks and error messages.
#include <array>
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"
#include "ops/cpu/gemm.h"

using namespace ht;

namespace {

// Batched matmul on row-major values: a (..., M, K) @ b (..., K, N) with numpy broadcasting of the batch
// dims, by plain loops in double.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b) {
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape ab = a.shape(), bb = b.shape();
  ab.resize(a.dim() - 2);
  bb.resize(b.dim() - 2);
  const Shape batch = broadcast_shapes(ab, bb, "naive");
  const int64_t nb = numel_of(batch);
  std::vector<double> out;
  for (int64_t flat = 0; flat < nb; ++flat) {
    // Multi-index of this batch entry, then the matching (possibly broadcast) flat batch index of a and b.
    std::vector<int64_t> idx(static_cast<std::size_t>(batch.size()));
    int64_t rest = flat;
    for (int i = batch.size() - 1; i >= 0; --i) {
      idx[static_cast<std::size_t>(i)] = rest % batch[i];
      rest /= batch[i];
    }
    auto flat_of = [&](const Shape& s) {
      int64_t f = 0;
      const int lead = batch.size() - s.size();
      for (int i = 0; i < s.size(); ++i) f = f * s[i] + (s[i] == 1 ? 0 : idx[static_cast<std::size_t>(i + lead)]);
      return f;
    };
    const int64_t fa = flat_of(ab), fb = flat_of(bb);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t p = 0; p < K; ++p)
          s += av[static_cast<std::size_t>((fa * M + i) * K + p)] * bv[static_cast<std::size_t>((fb * K + p) * N + j)];
        out.push_back(s);
      }
  }
  return out;
}

// y = x·Wᵀ + b on row-major values; x (..., in), W (out, in), b (out) or undefined.
std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t in = w.size(1), out_f = w.size(0), rows = x.numel() / in;
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out_f; ++o) {
      double s = b.defined() ? bv[static_cast<std::size_t>(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        s += xv[static_cast<std::size_t>(r * in + i)] * wv[static_cast<std::size_t>(o * in + i)];
      y.push_back(s);
    }
  return y;
}

Tensor rand_t(const Shape& s, uint64_t seed, DType dt = DType::f64) { return test::random_tensor(s, seed, dt); }

bool needs_no_copy(const Tensor& m) { return cpu::gemm_operand(m).t.is_same(m); }

}  // namespace

TEST_CASE("matmul 2-D matches naive loops at odd sizes in f64 and f32", "[matmul]") {
  for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{{7, 13, 5}, {1, 1, 1}, {1, 9, 3}, {6, 1, 4}, {17, 31, 1}}) {
    Tensor a = rand_t({M, K}, 1), b = rand_t({K, N}, 2);
    Tensor y = matmul(a, b);
    REQUIRE(y.shape() == Shape{M, N});
    CHECK(test::compare(y, naive_matmul(a, b), 1e-12, 1e-12) == "");
    Tensor yf = matmul(a.to(DType::f32), b.to(DType::f32));
    CHECK(yf.dtype() == DType::f32);
    CHECK(test::compare(yf, naive_matmul(a, b), 1e-5, 1e-5) == "");
  }
}

TEST_CASE("matmul broadcasts batch dims like numpy", "[matmul]") {
  auto check = [](const Shape& as, const Shape& bs, const Shape& expect) {
    Tensor a = rand_t(as, 3), b = rand_t(bs, 4);
    Tensor y = matmul(a, b);
    REQUIRE(y.shape() == expect);
    CHECK(test::compare(y, naive_matmul(a, b), 1e-12, 1e-12) == "");
  };
  check({3, 1, 4, 6}, {2, 6, 5}, {3, 2, 4, 5});
  check({2, 4, 6}, {6, 5}, {2, 4, 5});        // batched @ 2-D: one folded GEMM
  check({2, 3, 4, 6}, {6, 5}, {2, 3, 4, 5});
  check({4, 6}, {2, 6, 5}, {2, 4, 5});        // 2-D @ batched
  check({1, 4, 6}, {3, 6, 5}, {3, 4, 5});
  // An expanded (stride 0) batch is read in place, not materialised.
  Tensor a = rand_t({1, 4, 6}, 5).expand({3, 4, 6}), b = rand_t({3, 6, 2}, 6);
  CHECK(test::compare(matmul(a, b), naive_matmul(a.contiguous(), b), 1e-12, 1e-12) == "");
}

TEST_CASE("matmul takes 1-D operands like numpy", "[matmul]") {
  Tensor v = rand_t({6}, 7), m = rand_t({6, 4}, 8), mt = rand_t({3, 6}, 9), bm = rand_t({2, 6, 4}, 10);
  Tensor vm = matmul(v, m);
  REQUIRE(vm.shape() == Shape{4});
  CHECK(test::compare(vm, naive_matmul(v.reshape({1, 6}), m), 1e-12, 1e-12) == "");
  Tensor mv = matmul(mt, v);
  REQUIRE(mv.shape() == Shape{3});
  CHECK(test::compare(mv, naive_matmul(mt, v.reshape({6, 1})), 1e-12, 1e-12) == "");
  Tensor vv = matmul(v, v);
  REQUIRE(vv.dim() == 0);
  const auto vals = v.to_vector<double>();
  double dot = 0;
  for (double x : vals) dot += x * x;
  CHECK(vv.item() == Approx(dot).epsilon(1e-12));
  CHECK(matmul(v, bm).shape() == Shape{2, 4});
}

TEST_CASE("GEMM layouts: transposed views use the trans flag, column slices a leading dim", "[matmul]") {
  // Transposed views: strides (1, ld) go to GEMM with the trans flag, no copy.
  Tensor at_base = rand_t({13, 7}, 11), bt_base = rand_t({5, 13}, 12);
  Tensor at = at_base.transpose(0, 1), bt = bt_base.transpose(0, 1);  // (7, 13), (13, 5)
  auto la = cpu::gemm_layout(7, 13, at.stride(0), at.stride(1));
  REQUIRE(la.has_value());
  CHECK(la->trans == cpu::Trans::yes);
  CHECK(la->ld == 7);
  CHECK(needs_no_copy(at));
  CHECK(needs_no_copy(bt));
  CHECK(test::compare(matmul(at, bt), naive_matmul(at.contiguous(), bt.contiguous()), 1e-12, 1e-12) == "");
  CHECK(test::compare(matmul(at.to(DType::f32), bt.to(DType::f32)),
                      naive_matmul(at.contiguous(), bt.contiguous()), 1e-5, 1e-5) == "");
  // The same for batched transposed views (last two dims swapped).
  Tensor bb = rand_t({3, 5, 13}, 13).transpose(-1, -2);  // (3, 13, 5)
  CHECK(needs_no_copy(bb));
  CHECK(test::compare(matmul(at, bb), naive_matmul(at.contiguous(), bb.contiguous()), 1e-12, 1e-12) == "");

  // A column slice of a wider matrix: row-major with a leading dim larger than its width, no copy.
  Tensor wide = rand_t({7, 20}, 14);
  Tensor cols = narrow(wide, 1, 3, 13);  // (7, 13), strides (20, 1)
  CHECK_FALSE(cols.is_contiguous());
  auto lc = cpu::gemm_layout(7, 13, cols.stride(0), cols.stride(1));
  REQUIRE(lc.has_value());
  CHECK(lc->trans == cpu::Trans::no);
  CHECK(lc->ld == 20);
  CHECK(needs_no_copy(cols));
  Tensor b = rand_t({13, 5}, 15);
  CHECK(test::compare(matmul(cols, b), naive_matmul(cols.contiguous(), b), 1e-12, 1e-12) == "");

  // A stepped slice has no GEMM layout and is copied; the result is still right.
  Tensor stepped = slice(rand_t({7, 26}, 16), 1, 0, 26, 2);  // (7, 13), strides (26, 2)
  CHECK_FALSE(cpu::gemm_layout(7, 13, stepped.stride(0), stepped.stride(1)).has_value());
  CHECK_FALSE(needs_no_copy(stepped));
  CHECK(test::compare(matmul(stepped, b), naive_matmul(stepped.contiguous(), b), 1e-12, 1e-12) == "");
  CHECK(test::compare(matmul(b.transpose(0, 1), stepped.transpose(0, 1)),
                      naive_matmul(b.transpose(0, 1).contiguous(), stepped.transpose(0, 1).contiguous()), 1e-12,
                      1e-12) == "");
  // Size-1 dims never force a copy, whatever their stride.
  CHECK(cpu::gemm_layout(1, 13, 999, 1).has_value());
  CHECK(cpu::gemm_layout(7, 1, 3, 999).has_value());
}

TEST_CASE("narrow-dtype matmul accumulates in fp32 and rounds each output once", "[matmul][dtype]") {
  // Inputs are exactly representable in bf16, so the f64 product of the same values is the exact answer;
  // one rounding keeps every output within half a bf16 ulp (relative 2^-8) of it.
  Tensor a16 = rand_t({2, 9, 33}, 17, DType::bf16), b16 = rand_t({33, 11}, 18, DType::bf16);
  Tensor exact = matmul(a16.to(DType::f64), b16.to(DType::f64));
  Tensor y = matmul(a16, b16);
  CHECK(y.dtype() == DType::bf16);
  CHECK(test::compare(y, exact, std::ldexp(1.0, -8), 1e-6) == "");
  // The same through a transposed bf16 view (op(B) widened from the trans layout).
  Tensor bt = b16.transpose(0, 1).contiguous().transpose(0, 1);
  CHECK(test::compare(matmul(a16, bt), exact, std::ldexp(1.0, -8), 1e-6) == "");
  // f16 (half ulp 2^-11) and fp8 e4m3 (half ulp 2^-4; subnormal spacing 2^-9 near zero).
  Tensor a_h = a16.to(DType::f16), b_h = b16.to(DType::f16);
  CHECK(test::compare(matmul(a_h, b_h), exact, std::ldexp(1.0, -11), 1e-6) == "");
  Tensor a8 = rand_t({5, 6}, 19, DType::f8e4m3), b8 = rand_t({6, 4}, 20, DType::f8e4m3);
  CHECK(test::compare(matmul(a8, b8), matmul(a8.to(DType::f64), b8.to(DType::f64)), std::ldexp(1.0, -4),
                      std::ldexp(1.0, -10)) == "");
}

TEST_CASE("narrow GEMM on raw pointers: transposed A, beta 1 into a strided C, and the f32 accumulator form",
          "[matmul][dtype]") {
  // C (m, n) in a row of ldc = n + 3 (the padding must stay untouched) starts from c0 and gets op(A)·op(B) added,
  // with A stored (k, m) and used transposed; every value is exact in bf16, so f64 gives the exact answer.
  constexpr int64_t m = 5, n = 7, k = 19, ldc = n + 3;
  Tensor a = rand_t({k, m}, 31, DType::bf16), b = rand_t({k, n}, 32, DType::bf16);
  Tensor c0 = rand_t({m, ldc}, 33, DType::bf16);
  Tensor exact = add(matmul(a.to(DType::f64).transpose(0, 1), b.to(DType::f64)),
                     c0.to(DType::f64).narrow(1, 0, n));
  cpu::GemmDims d{.m = m, .n = n, .k = k, .trans_a = cpu::Trans::yes, .trans_b = cpu::Trans::no,
                  .lda = m, .ldb = n, .ldc = ldc, .beta = 1.0};
  Tensor c = c0.clone();
  cpu::gemm<bf16>(d, a.data<bf16>(), b.data<bf16>(), c.data<bf16>());
  CHECK(test::compare(c.narrow(1, 0, n), exact, std::ldexp(1.0, -8), 1e-6) == "");
  CHECK(test::compare(c.narrow(1, n, 3), c0.narrow(1, n, 3), 0, 0) == "");
  // gemm_acc adds into an f32 C without rounding to bf16: within f32's accumulation error of the exact sum.
  Tensor acc = c0.to(DType::f32);
  cpu::gemm_acc<bf16>(d, a.data<bf16>(), b.data<bf16>(), acc.data<float>());
  CHECK(test::compare(acc.narrow(1, 0, n), exact, 1e-6, 1e-6) == "");
  CHECK(test::compare(acc.narrow(1, n, 3), c0.narrow(1, n, 3).to(DType::f32), 0, 0) == "");
}

TEST_CASE("matmul with K = 0 gives zeros; empty batches give empty results", "[matmul]") {
  Tensor a = zeros({3, 0}, {DType::f64}), b = zeros({0, 4}, {DType::f64});
  Tensor y = matmul(a, b);
  CHECK(y.shape() == Shape{3, 4});
  CHECK(test::compare(y, std::vector<double>(12, 0.0), 0, 0) == "");
  CHECK(matmul(zeros({2, 3, 0}, {DType::bf16}), zeros({0, 4}, {DType::bf16})).to(DType::f64).to_vector<double>() ==
        std::vector<double>(24, 0.0));
  CHECK(matmul(zeros({0, 3, 5}), zeros({5, 2})).shape() == Shape{0, 3, 2});
}

TEST_CASE("matmul gradients pass the finite-difference check", "[matmul][gradcheck]") {
  auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  auto check = [&](const Shape& as, const Shape& bs, test::GradcheckFn f) {
    Tensor a = rand_t(as, 21).set_requires_grad(true), b = rand_t(bs, 22).set_requires_grad(true);
    CHECK(test::gradcheck(f, {a, b}) == "");
  };
  check({3, 4}, {4, 2}, mm);
  check({2, 1, 3, 4}, {3, 4, 2}, mm);  // both sides broadcast: gradients summed back
  check({2, 3, 4}, {4, 2}, mm);        // batched @ 2-D: folded weight-like gradient
  check({3, 4}, {2, 4, 2}, mm);        // 2-D @ batched
  check({4}, {4, 3}, mm);              // vector @ matrix
  check({3, 4}, {4}, mm);              // matrix @ vector
  check({4}, {4}, mm);                 // dot
  // Non-contiguous views inside f: transposes and a stepped slice.
  check({4, 3}, {2, 4}, [](const std::vector<Tensor>& in) { return matmul(in[0].transpose(0, 1), in[1].transpose(0, 1)); });
  check({3, 8}, {4, 2}, [](const std::vector<Tensor>& in) { return matmul(slice(in[0], 1, 0, 8, 2), in[1]); });
}

TEST_CASE("linear matches x·Wᵀ + b, with and without bias, for 1-D to 3-D inputs", "[linear]") {
  Tensor w = rand_t({5, 7}, 31), b = rand_t({5}, 32);
  for (const Shape& xs : {Shape{7}, Shape{3, 7}, Shape{2, 3, 7}}) {
    Tensor x = rand_t(xs, 33);
    Shape ys = xs;
    ys[ys.size() - 1] = 5;
    Tensor y = linear(x, w, b);
    REQUIRE(y.shape() == ys);
    CHECK(test::compare(y, naive_linear(x, w, b), 1e-12, 1e-12) == "");
    CHECK(test::compare(linear(x, w), naive_linear(x, w, Tensor()), 1e-12, 1e-12) == "");
    CHECK(test::compare(linear(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32)), naive_linear(x, w, b), 1e-5,
                        1e-5) == "");
  }
  // Non-contiguous input (a transposed (..., in) view) and a transposed weight view.
  Tensor xt = rand_t({7, 4}, 34).transpose(0, 1);  // (4, 7)
  Tensor wt = rand_t({7, 5}, 35).transpose(0, 1);  // (5, 7), strides (1, 5)
  CHECK(test::compare(linear(xt, wt, b), naive_linear(xt.contiguous(), wt.contiguous(), b), 1e-12, 1e-12) == "");
  // bf16: bias pre-loaded, one rounding per output.
  Tensor x16 = rand_t({3, 2, 7}, 36, DType::bf16), w16 = rand_t({5, 7}, 37, DType::bf16), b16 = rand_t({5}, 38, DType::bf16);
  Tensor exact = linear(x16.to(DType::f64), w16.to(DType::f64), b16.to(DType::f64));
  CHECK(test::compare(linear(x16, w16, b16), exact, std::ldexp(1.0, -8), 1e-6) == "");
}

TEST_CASE("linear gradients pass the finite-difference check, including a 3-D input", "[linear][gradcheck]") {
  Tensor w = rand_t({5, 4}, 41).set_requires_grad(true), b = rand_t({5}, 42).set_requires_grad(true);
  auto lin = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  for (const Shape& xs : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}}) {
    Tensor x = rand_t(xs, 43).set_requires_grad(true);
    CHECK(test::gradcheck(lin, {x, w, b}) == "");
  }
  Tensor x = rand_t({2, 3, 4}, 44).set_requires_grad(true);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, w}) == "");
  // Through non-contiguous views: x permuted, W transposed.
  Tensor xp = rand_t({4, 2, 3}, 45).set_requires_grad(true), wp = rand_t({4, 5}, 46).set_requires_grad(true);
  CHECK(test::gradcheck([](const std::vector<Tensor>& in) {
          return linear(in[0].permute({1, 2, 0}), in[1].transpose(0, 1), in[2]);
        }, {xp, wp, b}) == "");
  // The bias gradient is the sum of g over every leading dim.
  Tensor x3 = rand_t({2, 3, 4}, 47);
  auto g = grad({sum(linear(x3, w, b))}, {b});
  CHECK(test::compare(g[0], std::vector<double>(5, 6.0), 1e-12, 1e-12) == "");
}

TEST_CASE("matmul and linear report shape and dtype errors clearly", "[matmul][linear][errors]") {
  Tensor a = rand_t({3, 4}, 51), b = rand_t({5, 2}, 52);
  CHECK_THROWS_WITH(matmul(a, b), HasSubstr("inner dimensions differ") && HasSubstr("K = 4") && HasSubstr("K = 5"));
  CHECK_THROWS_WITH(matmul(rand_t({4}, 53), rand_t({3}, 54)), HasSubstr("inner dimensions differ"));
  CHECK_THROWS_WITH(matmul(rand_t({2, 3, 4}, 55), rand_t({3, 4, 2}, 56)), HasSubstr("batch dims"));
  CHECK_THROWS_WITH(matmul(a, rand_t({4, 2}, 57, DType::f32)), HasSubstr("different dtypes"));
  CHECK_THROWS_WITH(matmul(scalar_tensor(1.0, {DType::f64}), a), HasSubstr("at least 1 dim"));
  CHECK_THROWS_WITH(matmul(arange(4, {DType::i64}).reshape({2, 2}), arange(4, {DType::i64}).reshape({2, 2})),
                    HasSubstr("floating"));
  Tensor w = rand_t({5, 4}, 58);
  CHECK_THROWS_WITH(linear(rand_t({2, 3}, 59), w), HasSubstr("expects in = 4"));
  CHECK_THROWS_WITH(linear(a, w, rand_t({4}, 60)), HasSubstr("bias must be (out) = (5)"));
  CHECK_THROWS_WITH(linear(a, rand_t({5, 4, 1}, 61)), HasSubstr("weight must be (out, in)"));
  CHECK_THROWS_WITH(linear(a, w.to(DType::f32)), HasSubstr("different dtypes"));
}
