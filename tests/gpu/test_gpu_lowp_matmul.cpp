// Low-precision products on CUDA (cuBLASLt int8 / fp8 through cuda::gemm_lowp_nt) against the CPU reference
// (tests/cpu/test_lowp_matmul.cpp checks that one against naive loops). int8 -> int32 must be EXACT
// (bit-identical) for aligned and odd shapes (K = 13, 37, 333: zero-padded copies), big K, batches and a
// shared b. fp8 tolerance per output element: |cuda - cpu| <= 2^-12 · |scale_a · scale_b| · sum_k |a_ik·b_jk|
// (+ one bf16 ulp, 2^-7 · |cpu|, for bf16 outputs). The bound is wider than fp32 accumulation alone
// (~1e-5 of the sum of |products| at these K) because Hopper's fp8 tensor cores add the products of one
// MMA with a ~14-bit accumulator before the (precise-mode) promotion to fp32. The device scales are changed
// in place between calls without re-planning and must take effect. The fallback kernel is checked too.
// Every CUDA allocation is poisoned (0xFF) while the products run.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "hadatrain/cuda/cublaslt_gemm.h"
#include "hadatrain/ops/lowp_matmul.h"

using namespace ht;

namespace {

Tensor rand_i8(const Shape& s, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(-127, 127);
  std::vector<int64_t> v(static_cast<std::size_t>(numel_of(s)));
  for (auto& x : v) x = dist(gen);
  return from_vector(v, s, {DType::i64}).to(DType::i8);
}

Tensor rand_fp8(const Shape& s, uint64_t seed, DType dt) {
  return test::random_tensor(s, seed, DType::f32, -3.0, 3.0).to(dt);
}

Tensor scalar_f32(double v, Device dev = Device::cpu()) {
  return from_vector(std::vector<float>{static_cast<float>(v)}, {1}).to(dev);
}

// "" when the CUDA int8 product of a and b (CPU tensors) is bit-identical to the CPU one.
std::string check_int8(const Tensor& a, const Tensor& b) {
  const Tensor expected = int8_matmul_nt(a, b);
  Tensor actual;
  {
    test::PoisonGuard poison;
    actual = int8_matmul_nt(a.to(test::kCuda), b.to(test::kCuda));
  }
  if (actual.shape() != expected.shape() || actual.dtype() != DType::i32) return "wrong shape or dtype";
  return test::compare_bits(actual, expected);
}

// sum_k |a_ik·b_jk| per output element (a (..., M, K), b (..., N, K) or (N, K)), in the output's order.
std::vector<double> abs_sums(const Tensor& a, const Tensor& b) {
  const auto av = a.contiguous().to_vector<double>(), bv = b.contiguous().to_vector<double>();
  const int64_t m = a.shape()[a.dim() - 2], k = a.shape().back(), n = b.shape()[b.dim() - 2];
  const int64_t batch = m * k == 0 ? 1 : static_cast<int64_t>(av.size()) / (m * k);
  std::vector<double> out;
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += std::fabs(av[static_cast<std::size_t>((t * m + i) * k + p)] *
                         bv[static_cast<std::size_t>(((b.dim() == 2 ? 0 : t) * n + j) * k + p)]);
        out.push_back(s);
      }
  return out;
}

// "" when the CUDA result (any device tensor) agrees with the CPU result within the fp8 bound above.
std::string fp8_agrees(const Tensor& actual, const Tensor& expected, const std::vector<double>& sums, double scale) {
  if (!actual.is_cuda() || actual.dtype() != expected.dtype() || actual.shape() != expected.shape())
    return "wrong device, dtype or shape: " + actual.describe() + " vs " + expected.describe();
  const auto av = actual.to(Device::cpu()).to_vector<double>(), ev = expected.to_vector<double>();
  // bf16: the two sides may round sums on either side of a rounding boundary to neighbouring values, one
  // ulp apart; one ulp is at most 2^-7 of the value.
  const double round = expected.dtype() == DType::bf16 ? 1.0 / 128 : 0.0;
  std::ostringstream msg;
  int bad = 0;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const double tol = std::ldexp(std::fabs(scale) * sums[i], -12) + round * std::fabs(ev[i]) + 1e-30;
    if (!(std::fabs(av[i] - ev[i]) <= tol) && bad++ < 5)
      msg << "element " << i << ": cuda " << av[i] << " cpu " << ev[i] << " tol " << tol << "\n";
  }
  if (bad) msg << bad << " of " << ev.size() << " elements differ";
  return msg.str();
}

std::string check_fp8(const Tensor& a, const Tensor& b, double sa, double sb, DType out_dt) {
  const Tensor expected = fp8_matmul_nt(a, b, scalar_f32(sa), scalar_f32(sb), out_dt);
  Tensor actual;
  {
    test::PoisonGuard poison;
    actual = fp8_matmul_nt(a.to(test::kCuda), b.to(test::kCuda), scalar_f32(sa, test::kCuda),
                           scalar_f32(sb, test::kCuda), out_dt);
  }
  return fp8_agrees(actual, expected, abs_sums(a, b), sa * sb);
}

struct Mnk {
  int64_t m, n, k;
};

}  // namespace

TEST_CASE("int8_matmul_nt on CUDA is bit-identical to the CPU for aligned and odd shapes", "[gpu][lowp]") {
  const std::vector<Mnk> sizes = {{64, 48, 4096}, {1000, 777, 333}, {1, 1, 1},    {7, 5, 13},
                                  {33, 17, 37},   {128, 256, 512},  {16, 16, 16}, {3, 64, 4100}};
  uint64_t seed = 10;
  for (const Mnk& s : sizes) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    CHECK(check_int8(rand_i8({s.m, s.k}, ++seed), rand_i8({s.n, s.k}, ++seed)) == "");
  }
}

TEST_CASE("int8_matmul_nt on CUDA: batches, shared b, non-contiguous operands, K = 0", "[gpu][lowp]") {
  CHECK(check_int8(rand_i8({3, 65, 37}, 1), rand_i8({3, 19, 37}, 2)) == "");      // padded, batched
  CHECK(check_int8(rand_i8({4, 64, 128}, 3), rand_i8({4, 32, 128}, 4)) == "");    // in place, batched
  CHECK(check_int8(rand_i8({2, 3, 31, 45}, 5), rand_i8({17, 45}, 6)) == "");      // shared b, padded
  CHECK(check_int8(rand_i8({5, 64, 256}, 7), rand_i8({48, 256}, 8)) == "");       // shared b, in place
  CHECK(check_int8(rand_i8({2, 96, 4096}, 9), rand_i8({2, 80, 4096}, 10)) == "");  // big K, batched
  CHECK(check_int8(rand_i8({40, 24}, 11).transpose(0, 1), rand_i8({5, 43}, 12).narrow(1, 3, 40)) == "");  // K 40
  // -128 · 127 over K = 4096 everywhere: the int32 accumulator must hold it exactly
  CHECK(check_int8(full({16, 4096}, -128.0, {DType::i8}), full({32, 4096}, 127.0, {DType::i8})) == "");
  CHECK(check_int8(rand_i8({3, 0}, 13), rand_i8({5, 0}, 14)) == "");
}

TEST_CASE("fp8_matmul_nt on CUDA agrees with the CPU within the fp8 accumulation bound", "[gpu][lowp]") {
  const std::vector<Mnk> sizes = {{64, 48, 4096}, {1000, 777, 333}, {1, 1, 1}, {7, 5, 13}, {33, 17, 37}, {128, 256, 512}};
  const std::vector<std::pair<DType, DType>> combos = {
      {DType::f8e4m3, DType::f8e4m3}, {DType::f8e5m2, DType::f8e4m3}, {DType::f8e4m3, DType::f8e5m2}};
  uint64_t seed = 100;
  for (const auto& [da, db] : combos)
    for (DType out_dt : {DType::f32, DType::bf16})
      for (const Mnk& s : sizes) {
        INFO(dtype_name(da) << " x " << dtype_name(db) << " -> " << dtype_name(out_dt) << " m " << s.m << " n "
                            << s.n << " k " << s.k);
        CHECK(check_fp8(rand_fp8({s.m, s.k}, ++seed, da), rand_fp8({s.n, s.k}, ++seed, db), 0.75, -1.5, out_dt) ==
              "");
      }
  // batches and a shared b
  CHECK(check_fp8(rand_fp8({3, 65, 37}, 1, DType::f8e4m3), rand_fp8({3, 19, 37}, 2, DType::f8e4m3), 1, 1,
                  DType::f32) == "");
  CHECK(check_fp8(rand_fp8({4, 64, 128}, 3, DType::f8e4m3), rand_fp8({4, 32, 128}, 4, DType::f8e4m3), 2, 0.5,
                  DType::bf16) == "");
  CHECK(check_fp8(rand_fp8({2, 3, 31, 45}, 5, DType::f8e5m2), rand_fp8({17, 45}, 6, DType::f8e4m3), 0.125, 3,
                  DType::f32) == "");
  CHECK(check_fp8(rand_fp8({5, 64, 256}, 7, DType::f8e4m3), rand_fp8({48, 256}, 8, DType::f8e4m3), 1, 1,
                  DType::bf16) == "");
}

// fp8_matmul_nt_outer: cuBLASLt's outer-vector scales on aligned shapes (m, n, k multiples of 16), the f32
// fallback on the others, both against the CPU within the fp8 bound (scaled by each element's row · col).
TEST_CASE("fp8_matmul_nt_outer on CUDA agrees with the CPU, aligned and unaligned", "[gpu][lowp]") {
  uint64_t seed = 500;
  for (DType out_dt : {DType::f32, DType::bf16})
    for (const Mnk& s : std::vector<Mnk>{{256, 576, 64}, {1024, 64, 576}, {64, 48, 4096}, {33, 17, 37}, {7, 5, 13}}) {
      INFO(dtype_name(out_dt) << " m " << s.m << " n " << s.n << " k " << s.k);
      const Tensor a = rand_fp8({s.m, s.k}, ++seed, DType::f8e4m3), b = rand_fp8({s.n, s.k}, ++seed, DType::f8e4m3);
      const Tensor row = test::random_tensor({s.m}, ++seed, DType::f32, 0.1, 4.0);
      const Tensor col = test::random_tensor({s.n}, ++seed, DType::f32, 0.1, 2.0);
      const Tensor expected = fp8_matmul_nt_outer(a, b, row, col, out_dt);
      Tensor actual;
      {
        test::PoisonGuard poison;
        actual = fp8_matmul_nt_outer(a.to(test::kCuda), b.to(test::kCuda), row.to(test::kCuda), col.to(test::kCuda),
                                     out_dt);
      }
      // the bound of fp8_agrees with the largest row · col as the scale (a looser bound for the other elements)
      const double scale = 4.0 * 2.0;
      CHECK(fp8_agrees(actual, expected, abs_sums(a, b), scale) == "");
    }
}

TEST_CASE("fp8 scales are read from device memory when the product runs", "[gpu][lowp]") {
  for (const Mnk& s : std::vector<Mnk>{{64, 48, 256}, {33, 17, 37}}) {  // in place, and padded
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    const Tensor a = rand_fp8({s.m, s.k}, 1, DType::f8e4m3), b = rand_fp8({s.n, s.k}, 2, DType::f8e4m3);
    const Tensor ad = a.to(test::kCuda), bd = b.to(test::kCuda);
    const Tensor sa = scalar_f32(0.5, test::kCuda), sb = scalar_f32(3.0, test::kCuda);
    const std::vector<double> sums = abs_sums(a, b);
    test::PoisonGuard poison;
    const Tensor first = fp8_matmul_nt(ad, bd, sa, sb, DType::f32);
    const std::size_t plans = cuda::gemm_plan_cache_size();
    CHECK(fp8_agrees(first, fp8_matmul_nt(a, b, scalar_f32(0.5), scalar_f32(3.0), DType::f32), sums, 1.5) == "");
    fill_(sa, -2.0);  // same buffers, new values: the cached plan must pick them up
    fill_(sb, 0.25);
    const Tensor second = fp8_matmul_nt(ad, bd, sa, sb, DType::f32);
    CHECK(cuda::gemm_plan_cache_size() == plans);
    CHECK(fp8_agrees(second, fp8_matmul_nt(a, b, scalar_f32(-2.0), scalar_f32(0.25), DType::f32), sums, 0.5) == "");
    // -0.5 / 1.5: every element scales by exactly -1/3 of the first run's sum (powers of two aside)
    const auto v1 = first.to(Device::cpu()).to_vector<double>(), v2 = second.to(Device::cpu()).to_vector<double>();
    int same = 0;
    for (std::size_t i = 0; i < v1.size(); ++i) same += v1[i] == v2[i] && v1[i] != 0;
    CHECK(same == 0);
  }
}

TEST_CASE("gemm_lowp_nt takes cuBLASLt in place when aligned, padded copies otherwise", "[gpu][lowp]") {
  struct Case {
    int64_t m, n, k, lda_extra;
    cuda::LowpPath expected;
  };
  // lda_extra > 0: a is a sub-matrix of a wider buffer (lda = k + extra), unaligned when extra % 16 != 0
  const std::vector<Case> cases = {{64, 48, 4096, 0, cuda::LowpPath::cublaslt},
                                   {64, 48, 4096, 16, cuda::LowpPath::cublaslt},
                                   {64, 48, 4096, 3, cuda::LowpPath::cublaslt_padded},
                                   {1000, 777, 333, 0, cuda::LowpPath::cublaslt_padded},
                                   {17, 40, 64, 0, cuda::LowpPath::cublaslt_padded}};
  uint64_t seed = 50;
  for (const Case& c : cases)
    for (bool fp8 : {false, true}) {
      INFO((fp8 ? "fp8" : "int8") << " m " << c.m << " n " << c.n << " k " << c.k << " lda " << c.k + c.lda_extra);
      const DType dt = fp8 ? DType::f8e4m3 : DType::i8, out_dt = fp8 ? DType::bf16 : DType::i32;
      const Tensor wide = fp8 ? rand_fp8({c.m, c.k + c.lda_extra}, ++seed, dt) : rand_i8({c.m, c.k + c.lda_extra}, ++seed);
      const Tensor b = fp8 ? rand_fp8({c.n, c.k}, ++seed, dt) : rand_i8({c.n, c.k}, ++seed);
      const Tensor a = wide.narrow(1, 0, c.k);
      const Tensor one = scalar_f32(1.0, test::kCuda);
      const Tensor wd = wide.to(test::kCuda), bd = b.to(test::kCuda);
      for (auto impl : {cuda::LowpImpl::automatic, cuda::LowpImpl::fallback_kernel}) {
        test::PoisonGuard poison;
        const Tensor out = empty({c.m, c.n}, {out_dt, test::kCuda});
        cuda::LowpGemmArgs g;
        g.a_dtype = g.b_dtype = dt;
        g.c_dtype = out_dt;
        g.m = c.m;
        g.n = c.n;
        g.k = c.k;
        g.a = wd.data_ptr();
        g.b = bd.data_ptr();
        g.c = out.data_ptr();
        g.lda = c.k + c.lda_extra;
        g.ldb = c.k;
        g.ldc = c.n;
        if (fp8) g.scale_a = g.scale_b = static_cast<const float*>(one.data_ptr());
        g.impl = impl;
        const cuda::LowpPath path = cuda::gemm_lowp_nt(g);
        INFO("path " << cuda::lowp_path_name(path));
        CHECK(path == (impl == cuda::LowpImpl::automatic ? c.expected : cuda::LowpPath::kernel));
        if (fp8) {
          const Tensor expected = fp8_matmul_nt(a, b, scalar_f32(1.0), scalar_f32(1.0), out_dt);
          CHECK(fp8_agrees(out, expected, abs_sums(a, b), 1.0) == "");
        } else {
          CHECK(test::compare_bits(out, int8_matmul_nt(a, b)) == "");
        }
      }
    }
}

// Outer-vector scales (HLQ's per-token g_x product, Note [HLQ outer-scale product]): on aligned shapes cuBLASLt
// takes them in place (faster on the H200); batched, unaligned or fallback-kernel requests
// get LowpPath::unsupported and compute nothing (fp8_matmul_nt_outer then scales the f32 product itself).
TEST_CASE("gemm_lowp_nt takes outer-vector scales through cuBLASLt on aligned shapes", "[gpu][lowp]") {
  uint64_t seed = 700;
  for (const Mnk& s : std::vector<Mnk>{{256, 576, 64}, {1024, 64, 576}, {64, 48, 4096}}) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    const Tensor a = rand_fp8({s.m, s.k}, ++seed, DType::f8e4m3), b = rand_fp8({s.n, s.k}, ++seed, DType::f8e4m3);
    const Tensor row = test::random_tensor({s.m}, ++seed, DType::f32, 0.1, 4.0);
    const Tensor col = test::random_tensor({s.n}, ++seed, DType::f32, 0.1, 2.0);
    const Tensor ad = a.to(test::kCuda), bd = b.to(test::kCuda), rd = row.to(test::kCuda), cd = col.to(test::kCuda);
    for (auto impl : {cuda::LowpImpl::automatic, cuda::LowpImpl::fallback_kernel}) {
      test::PoisonGuard poison;
      const Tensor out = empty({s.m, s.n}, {DType::bf16, test::kCuda});
      cuda::LowpGemmArgs g;
      g.a_dtype = g.b_dtype = DType::f8e4m3;
      g.c_dtype = DType::bf16;
      g.m = s.m;
      g.n = s.n;
      g.k = s.k;
      g.a = ad.data_ptr();
      g.b = bd.data_ptr();
      g.c = out.data_ptr();
      g.lda = g.ldb = s.k;
      g.ldc = s.n;
      g.row_scale_a = static_cast<const float*>(rd.data_ptr());
      g.col_scale_b = static_cast<const float*>(cd.data_ptr());
      g.impl = impl;
      const cuda::LowpPath path = cuda::gemm_lowp_nt(g);
      INFO("path " << cuda::lowp_path_name(path));
      if (impl == cuda::LowpImpl::fallback_kernel) {
        CHECK(path == cuda::LowpPath::unsupported);
        continue;
      }
      CHECK(path == cuda::LowpPath::cublaslt);
      CHECK(fp8_agrees(out, fp8_matmul_nt_outer(a, b, row, col, DType::bf16), abs_sums(a, b), 4.0 * 2.0) == "");
    }
  }
}

TEST_CASE("gemm_lowp_nt rejects unsupported combinations", "[gpu][lowp]") {
  cuda::LowpGemmArgs g;
  g.m = g.n = g.k = 16;
  g.lda = g.ldb = g.ldc = 16;
  g.a_dtype = g.b_dtype = DType::f8e5m2;
  g.c_dtype = DType::f32;
  CHECK_THROWS_WITH(cuda::gemm_lowp_nt(g), HasSubstr("f8e5m2 x f8e5m2 is not supported"));
  g.a_dtype = g.b_dtype = DType::i8;
  CHECK_THROWS_WITH(cuda::gemm_lowp_nt(g), HasSubstr("i8 x i8 products are i32"));
  g.a_dtype = DType::i8;
  g.b_dtype = DType::f8e4m3;
  CHECK_THROWS_WITH(cuda::gemm_lowp_nt(g), HasSubstr("are not supported"));
  const Tensor a = rand_i8({4, 5}, 1).to(test::kCuda);
  CHECK_THROWS_WITH(int8_matmul_nt(a, rand_i8({4, 5}, 2)), HasSubstr("int8_matmul_nt"));
  const Tensor f = rand_fp8({4, 5}, 3, DType::f8e4m3).to(test::kCuda);
  CHECK_THROWS_WITH(fp8_matmul_nt(f, f, scalar_f32(1.0), scalar_f32(1.0, test::kCuda), DType::f32),
                    HasSubstr("scale_a must be on cuda:0"));
}

// Note [Fast accumulation of integer codes] (ops/lowp_matmul.h): e4m3 operands that hold integers -7..7 (HLQ's
// 4-bit levels) have integer products of at most 49, and every partial sum of them is an integer. The tensor
// cores' fast accumulator keeps 14 significant bits, so it holds every integer below 2^14 exactly and the fast
// product is then bit-identical to the promoted (precise) one and to the exact sum. Three crafted rows, each the
// same in a and b and on its own span of K (so that they meet only themselves): row 0 walks its partial sums up
// to 13544, row 1 up to 14700 and back down to 0, row 2 past 2^14 to 19600 and then adds one 1·1 per 32
// products. Every other row and column holds random levels (partial sums of a few thousand at most). The precise product
// must be exact everywhere, the fast one everywhere but at (2, 2), where what it gives is reported (the
// hardware's truncation), not asserted.
TEST_CASE("fp8 products of integer codes: fast accumulation is exact while the partial sums stay below 2^14",
          "[gpu][lowp]") {
  const int64_t M = 64, N = 64, K = 4096;
  std::mt19937_64 gen(20261204);
  std::uniform_int_distribution<int> level(-7, 7);
  std::vector<float> av(static_cast<std::size_t>(M * K)), bv(static_cast<std::size_t>(N * K));
  for (auto& v : av) v = static_cast<float>(level(gen));
  for (auto& v : bv) v = static_cast<float>(level(gen));
  std::fill(av.begin(), av.begin() + 3 * K, 0.f);  // the crafted rows are zero outside their spans
  std::fill(bv.begin(), bv.begin() + 3 * K, 0.f);
  auto set = [&](int64_t row, int64_t k, float a, float b) {
    av[static_cast<std::size_t>(row * K + k)] = a;
    bv[static_cast<std::size_t>(row * K + k)] = b;
  };
  for (int64_t k = 0; k < 1256; ++k) set(0, k, k < 256 ? 7.f : 1.f, k < 256 ? 7.f : 1.f);  // 256·49 + 1000·1
  for (int64_t k = 1256; k < 1856; ++k) set(1, k, 7.f, k < 1556 ? 7.f : -7.f);             // 300·49 - 300·49
  for (int64_t k = 1856; k < K; ++k) {  // 400·49 = 19600, then one 1·1 every 32 products (58 of them)
    const float v = k < 2256 ? 7.f : (k - 2256) % 32 == 5 ? 1.f : 0.f;
    set(2, k, v, v);
  }
  const Tensor a = from_vector(av, {M, K}).to(DType::f8e4m3), b = from_vector(bv, {N, K}).to(DType::f8e4m3);
  const Tensor exact = fp8_matmul_nt(a, b, scalar_f32(1.0), scalar_f32(1.0), DType::f32);  // the CPU sums exactly
  const std::vector<float> ev = exact.to_vector<float>();
  const auto at = [&](int64_t i, int64_t j) { return static_cast<std::size_t>(i * N + j); };
  REQUIRE(ev[at(0, 0)] == 13544.f);
  REQUIRE(ev[at(1, 1)] == 0.f);
  REQUIRE(ev[at(2, 2)] == 19658.f);
  const Tensor ad = a.to(test::kCuda), bd = b.to(test::kCuda), one = scalar_f32(1.0, test::kCuda);
  const Tensor precise = fp8_matmul_nt(ad, bd, one, one, DType::f32, Fp8Accumulation::precise);
  const Tensor fast = fp8_matmul_nt(ad, bd, one, one, DType::f32, Fp8Accumulation::fast);
  CHECK(test::compare_bits(precise, exact) == "");
  std::vector<float> fv = fast.to(Device::cpu()).to_vector<float>();
  WARN("fast accumulation of row 2 (partial sums past 2^14): " << fv[at(2, 2)] << ", exact 19658");
  CHECK(fv[at(0, 0)] == 13544.f);
  CHECK(fv[at(1, 1)] == 0.f);
  fv[at(2, 2)] = ev[at(2, 2)];  // every other element: exact
  CHECK(test::compare_bits(from_vector(fv, {M, N}).to(test::kCuda), exact) == "");
}
