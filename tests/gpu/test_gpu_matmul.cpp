// CUDA matmul and linear (cuBLASLt) against the CPU reference: f32 (no TF32: the tolerance is far below
// TF32's error), f64, bf16/f16 (one rounding per output on both sides), odd sizes, broadcast batch dims
// (merged strided batches and the outer loop around them), 1-D operands, transposed views (trans flags),
// sliced operands (a leading dim, an unaligned start, a stepped slice that is copied), k = 0, linear
// forward and backward with 3-D inputs (bias epilogue and pre-loaded bias), the raw gemm API with alpha,
// beta and a stride-0 operand, and a 1024^3 product. Every CUDA allocation is poisoned.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <array>
#include <cmath>
#include <functional>
#include <optional>

#include "hadatrain/cuda/cublaslt_gemm.h"

using namespace ht;

namespace {

// CUDA-vs-CPU tolerance of a product with inner size K and inputs in [-1, 1]: the two sides accumulate in
// different orders. f32: a few ulps of the typical partial sum (~sqrt(K/3)) times sqrt(K) terms, i.e.
// about 1e-6·K/3 (TF32 would be off by ~1e-3·sqrt(K)). bf16/f16: one ulp of the output (both round an
// fp32 sum once; they differ where the sums straddle a rounding boundary).
test::Tolerance gemm_tol(DType dt, int64_t K) {
  const double k = static_cast<double>(std::max<int64_t>(K, 1));
  switch (dt) {
    case DType::f64: return {1e-12, 1e-14 * k + 1e-14};
    case DType::f32: return {1e-5, 1e-6 * k / 3.0 + 1e-6};
    case DType::bf16: return {8e-3, 1e-3 + 1e-6 * k};
    case DType::f16: return {1e-3, 1e-4 + 1e-6 * k};
    default: return test::tolerance(dt);
  }
}

using Op = std::function<Tensor(const Tensor&, const Tensor&)>;

// op(a, b) on the CPU and on CUDA (poisoned allocations); "" when they agree within tol.
std::string check_binary(const Op& op, const Tensor& a, const Tensor& b, test::Tolerance tol) {
  const Tensor expected = op(a, b);
  Tensor actual;
  {
    test::PoisonGuard poison;
    actual = op(a.to(test::kCuda), b.to(test::kCuda));
  }
  return test::compare_to_cpu(actual, expected, tol);
}

Tensor mm(const Tensor& a, const Tensor& b) { return matmul(a, b); }

Tensor rnd(const Shape& s, uint64_t seed, DType dt) { return test::random_input(s, seed, dt, -1.0, 1.0); }

struct Dims3 {
  int64_t m, k, n;
};

}  // namespace

TEST_CASE("2-D matmul of odd sizes matches the CPU in every floating dtype", "[gpu][matmul]") {
  const std::vector<Dims3> sizes = {{1, 1, 1},    {1, 7, 13},   {7, 13, 1},  {13, 129, 7},
                                    {129, 257, 13}, {257, 7, 129}, {64, 64, 64}, {33, 1, 17}};
  uint64_t seed = 100;
  for (DType dt : test::kFloatDTypes)
    for (const Dims3& d : sizes) {
      INFO(dtype_name(dt) << " m " << d.m << " k " << d.k << " n " << d.n);
      const Tensor a = rnd({d.m, d.k}, ++seed, dt), b = rnd({d.k, d.n}, ++seed, dt);
      CHECK(check_binary(mm, a, b, gemm_tol(dt, d.k)) == "");
    }
}

TEST_CASE("fp8 matmul is computed in f32 and rounded once, like the CPU", "[gpu][matmul]") {
  for (DType dt : test::kFp8DTypes) {
    INFO(dtype_name(dt));
    const Tensor a = rnd({13, 29}, 1, dt), b = rnd({29, 7}, 2, dt);
    CHECK(check_binary(mm, a, b, test::tolerance(dt)) == "");
  }
}

TEST_CASE("matmul_f32 on CUDA: 16-bit operands, f32 result within f32 rounding of the exact product", "[gpu][matmul]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Tensor a = rnd({129, 4099}, 7, dt), b = rnd({33, 4099}, 8, dt);  // K = 4099: the f32 sum matters
    const Tensor out = matmul_f32(a.to(test::kCuda), b.to(test::kCuda).transpose(0, 1));
    REQUIRE(out.dtype() == DType::f32);
    const Tensor ref = matmul(a.to(DType::f64), b.to(DType::f64).transpose(0, 1));
    CHECK(test::rel_error(out.to(Device::cpu()), ref) < 1e-6);
    CHECK(test::rel_error(matmul_f32(a, b.transpose(0, 1)), ref) < 1e-6);  // the CPU's
  }
}

TEST_CASE("batched matmul with broadcast batch dims matches the CPU", "[gpu][matmul]") {
  struct Case {
    const char* name;
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {"same batch", {5, 7, 13}, {5, 13, 9}},
      {"3-D @ 2-D (rows merged)", {4, 7, 13}, {13, 9}},
      {"2-D @ 3-D (a broadcast, stride 0)", {7, 13}, {6, 13, 9}},
      {"(3,1) @ (4): both broadcast", {3, 1, 7, 13}, {4, 13, 9}},
      {"(2,3) @ (2,1): outer loop around a batch", {2, 3, 7, 13}, {2, 1, 13, 9}},
      {"(2,1,3) @ (1,4,1)", {2, 1, 3, 5, 11}, {1, 4, 1, 11, 6}},
      {"batch of one row", {8, 1, 129}, {8, 129, 1}},
  };
  uint64_t seed = 200;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " " << c.name);
      const Tensor a = rnd(c.a, ++seed, dt), b = rnd(c.b, ++seed, dt);
      CHECK(check_binary(mm, a, b, gemm_tol(dt, c.a.back())) == "");
    }
}

TEST_CASE("1-D operands follow numpy on CUDA", "[gpu][matmul]") {
  const Tensor v = rnd({13}, 1, DType::f32), w = rnd({13}, 2, DType::f32);
  const Tensor m = rnd({13, 7}, 3, DType::f32), mt = rnd({7, 13}, 4, DType::f32), bt = rnd({3, 7, 13}, 5, DType::f32);
  const test::Tolerance tol = gemm_tol(DType::f32, 13);
  CHECK(check_binary(mm, v, w, tol) == "");   // () dot product
  CHECK(check_binary(mm, v, m, tol) == "");   // (7)
  CHECK(check_binary(mm, mt, v, tol) == "");  // (7)
  CHECK(check_binary(mm, bt, v, tol) == "");  // (3, 7)
  CHECK(check_binary(mm, v, bt.transpose(-1, -2), tol) == "");  // (3, 7)
}

TEST_CASE("transposed views and sliced operands match the CPU", "[gpu][matmul]") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> va, vb;  // views applied to the base tensors on either device
    Shape a, b;
    int64_t k;
  };
  auto id = [](const Tensor& t) { return t; };
  auto tr = [](const Tensor& t) { return t.transpose(-1, -2); };
  const std::vector<Case> cases = {
      {"aᵀ @ b", tr, id, {13, 7}, {13, 9}, 13},
      {"a @ bᵀ", id, tr, {7, 13}, {9, 13}, 13},
      {"aᵀ @ bᵀ", tr, tr, {129, 7}, {9, 129}, 129},
      {"batched aᵀ @ bᵀ", tr, tr, {3, 13, 7}, {3, 9, 13}, 13},
      {"permuted batch", [](const Tensor& t) { return t.permute({1, 0, 2}); }, id, {7, 3, 13}, {3, 13, 9}, 13},
      {"column slice: ld > cols, start 1 element in (unaligned)",
       [](const Tensor& t) { return slice(t, 1, 1, 14); }, id, {7, 20}, {13, 9}, 13},
      {"row slice from row 1 of b (unaligned start)", id, [](const Tensor& t) { return slice(t, 0, 1, 14); },
       {7, 13}, {15, 9}, 13},
      {"stepped slice (copied)", [](const Tensor& t) { return slice(t, 1, 0, 26, 2); }, id, {7, 26}, {13, 9}, 13},
      {"expanded batch (stride 0)", [](const Tensor& t) { return t.expand({4, 7, 13}); }, id, {1, 7, 13},
       {4, 13, 9}, 13},
  };
  uint64_t seed = 300;
  for (DType dt : {DType::f32, DType::bf16, DType::f64})
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " " << c.name);
      const Tensor a = rnd(c.a, ++seed, dt), b = rnd(c.b, ++seed, dt);
      const Op op = [&](const Tensor& x, const Tensor& y) { return matmul(c.va(x), c.vb(y)); };
      CHECK(check_binary(op, a, b, gemm_tol(dt, c.k)) == "");
    }
}

TEST_CASE("matmul with K = 0 gives zeros and empty shapes give empty results", "[gpu][matmul]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor a = zeros({5, 0}, {dt}), b = zeros({0, 3}, {dt});
    CHECK(check_binary(mm, a, b, test::tolerance(dt)) == "");
    CHECK(check_binary(mm, zeros({2, 5, 0}, {dt}), zeros({2, 0, 3}, {dt}), test::tolerance(dt)) == "");
    CHECK(check_binary(mm, rnd({0, 4}, 1, dt), rnd({4, 3}, 2, dt), test::tolerance(dt)) == "");
  }
}

TEST_CASE("matmul backward on CUDA matches the CPU gradients", "[gpu][matmul][autograd]") {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dtype_name(dt));
    const Tensor av = rnd({2, 3, 7, 13}, 1, dt), bv = rnd({3, 13, 5}, 2, dt), gv = rnd({2, 3, 7, 5}, 3, dt);
    std::array<Tensor, 2> ga, gb;
    for (int side = 0; side < 2; ++side) {
      const Device dev = side == 0 ? Device::cpu() : test::kCuda;
      Tensor a = av.to(dev).detach(), b = bv.to(dev).detach();
      a.set_requires_grad(true);
      b.set_requires_grad(true);
      matmul(a, b).backward(gv.to(dev));
      ga[static_cast<std::size_t>(side)] = a.grad();
      gb[static_cast<std::size_t>(side)] = b.grad();
    }
    CHECK(test::compare_to_cpu(ga[1], ga[0], gemm_tol(dt, 5)) == "");
    CHECK(test::compare_to_cpu(gb[1], gb[0], gemm_tol(dt, 14)) == "");  // summed over 2 · 7 rows
  }
}

TEST_CASE("linear forward and backward with 3-D inputs match the CPU", "[gpu][linear]") {
  struct Case {
    const char* name;
    Shape x;
    int64_t out;
    bool bias;
  };
  // 64/32 features: 16-byte rows, the bias goes into the cuBLASLt epilogue; odd sizes pre-load the bias.
  const std::vector<Case> cases = {
      {"aligned, bias (epilogue)", {2, 5, 64}, 32, true},  {"aligned, no bias", {2, 5, 64}, 32, false},
      {"odd, bias (pre-loaded)", {3, 7, 13}, 9, true},    {"odd, no bias", {3, 7, 13}, 9, false},
      {"2-D, one row", {1, 129}, 257, true},              {"1-D input", {13}, 7, true},
  };
  uint64_t seed = 400;
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " " << c.name);
      const int64_t in = c.x.back();
      const Tensor xv = rnd(c.x, ++seed, dt), wv = rnd({c.out, in}, ++seed, dt), bv = rnd({c.out}, ++seed, dt);
      Shape ys = c.x;
      ys[ys.size() - 1] = c.out;
      const Tensor gv = rnd(ys, ++seed, dt);
      int64_t rows = 1;
      for (int i = 0; i + 1 < c.x.size(); ++i) rows *= c.x[i];
      std::array<Tensor, 2> y, gx, gw, gb;
      for (std::size_t side = 0; side < 2; ++side) {
        const Device dev = side == 0 ? Device::cpu() : test::kCuda;
        std::optional<test::PoisonGuard> poison;
        if (side == 1) poison.emplace();
        Tensor x = xv.to(dev).detach(), w = wv.to(dev).detach(), b = bv.to(dev).detach();
        x.set_requires_grad(true);
        w.set_requires_grad(true);
        b.set_requires_grad(true);
        y[side] = linear(x, w, c.bias ? b : Tensor());
        y[side].backward(gv.to(dev));
        gx[side] = x.grad();
        gw[side] = w.grad();
        gb[side] = b.grad();
      }
      CHECK(test::compare_to_cpu(y[1], y[0], gemm_tol(dt, in + 1)) == "");
      CHECK(test::compare_to_cpu(gx[1], gx[0], gemm_tol(dt, c.out)) == "");
      CHECK(test::compare_to_cpu(gw[1], gw[0], gemm_tol(dt, rows)) == "");
      if (c.bias) CHECK(test::compare_to_cpu(gb[1], gb[0], gemm_tol(dt, rows)) == "");
      else CHECK(!gb[1].defined());
    }
}

TEST_CASE("linear on a non-contiguous input and weight matches the CPU", "[gpu][linear]") {
  const Tensor x = rnd({13, 4, 32}, 1, DType::f32), w = rnd({32, 16}, 2, DType::f32), b = rnd({16}, 3, DType::f32);
  const Op op = [&](const Tensor& xx, const Tensor& ww) {
    return linear(xx.transpose(0, 1), ww.transpose(0, 1), b.to(xx.device()));  // x (4, 13, 32), W (16, 32)
  };
  CHECK(check_binary(op, x, w, gemm_tol(DType::f32, 33)) == "");
}

TEST_CASE("raw gemm: alpha, beta, a stride-0 operand and plan reuse", "[gpu][matmul]") {
  // C (3 batches of 7 x 9) = 0.5 · A (one 7 x 13, stride 0) · B[i] + 2 · C, B stored transposed (9 x 13).
  const Tensor a = rnd({7, 13}, 1, DType::f32), bt = rnd({3, 9, 13}, 2, DType::f32), c0 = rnd({3, 7, 9}, 3, DType::f32);
  const Tensor expected = add(mul(matmul(a, bt.transpose(-1, -2)), 0.5), mul(c0, 2.0));
  const Tensor da = a.to(test::kCuda), db = bt.to(test::kCuda), dc = c0.to(test::kCuda);
  cuda::GemmArgs g;
  g.dtype = g.c_dtype = DType::f32;
  g.m = 7;
  g.n = 9;
  g.k = 13;
  g.trans_b = cuda::Trans::yes;
  g.a = da.data_ptr();
  g.b = db.data_ptr();
  g.c = dc.data_ptr();
  g.lda = 13;
  g.ldb = 13;
  g.ldc = 9;
  g.batch = 3;
  g.stride_a = 0;
  g.stride_b = 9 * 13;
  g.stride_c = 7 * 9;
  g.alpha = 0.5;
  g.beta = 2.0;
  REQUIRE(cuda::tf32_mode() == cuda::Tf32::off);
  cuda::gemm(g);
  const std::size_t plans = cuda::gemm_plan_cache_size();
  CHECK(test::compare_to_cpu(dc, expected, gemm_tol(DType::f32, 13)) == "");
  // The same product again reuses the cached plan (and so accumulates into C once more).
  cuda::gemm(g);
  CHECK(cuda::gemm_plan_cache_size() == plans);
  const Tensor expected2 = add(mul(matmul(a, bt.transpose(-1, -2)), 0.5), mul(expected, 2.0));
  CHECK(test::compare_to_cpu(dc, expected2, gemm_tol(DType::f32, 13)) == "");
  g.bias = g.a;
  CHECK_THROWS_WITH(cuda::gemm(g), HasSubstr("bias requires beta = 0"));
  g.bias = nullptr;
  g.ldb = 5;
  CHECK_THROWS_WITH(cuda::gemm(g), HasSubstr("leading dims too small"));
}

TEST_CASE("TF32 is used only inside a Tf32Guard", "[gpu][matmul]") {
  const Tensor a = rnd({256, 512}, 1, DType::f32), b = rnd({512, 128}, 2, DType::f32);
  const Tensor expected = matmul(a, b);
  const Tensor da = a.to(test::kCuda), db = b.to(test::kCuda);
  CHECK(test::compare_to_cpu(matmul(da, db), expected, gemm_tol(DType::f32, 512)) == "");
  {
    cuda::Tf32Guard tf32(cuda::Tf32::on);
    CHECK(cuda::tf32_mode() == cuda::Tf32::on);
    // TF32 keeps 10 mantissa bits: still close, within a TF32 tolerance.
    CHECK(test::compare_to_cpu(matmul(da, db), expected, {1e-2, 5e-2}) == "");
  }
  CHECK(cuda::tf32_mode() == cuda::Tf32::off);
}

TEST_CASE("a 1024 x 1024 x 1024 f32 product matches the CPU", "[gpu][matmul]") {
  const Tensor a = rnd({1024, 1024}, 11, DType::f32), b = rnd({1024, 1024}, 12, DType::f32);
  CHECK(check_binary(mm, a, b, gemm_tol(DType::f32, 1024)) == "");
}
