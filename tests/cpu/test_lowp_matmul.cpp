// int8_matmul_nt and fp8_matmul_nt (CPU reference) against naive loops written here: random int8 in
// [-127, 127] (exact int32 results), fp8 values made by converting random floats (the reference sums the
// decoded values in double; f32 outputs agree to a few f32 ulps, bf16 to one bf16 rounding), odd sizes
// with K not a multiple of 4, batch dims, a shared 2-D b, non-contiguous operands, K = 0, error messages.
#include "support/catch.h"
#include "support/testing.h"

#include <cmath>
#include <random>
#include <vector>

#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/ops.h"

using namespace ht;

namespace {

Tensor rand_i8(const Shape& s, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(-127, 127);
  std::vector<int64_t> v(static_cast<std::size_t>(numel_of(s)));
  for (auto& x : v) x = dist(gen);
  return from_vector(v, s, {DType::i64}).to(DType::i8);
}

Tensor rand_fp8(const Shape& s, uint64_t seed, DType dt) { return test::random_tensor(s, seed, DType::f32, -3.0, 3.0).to(dt); }

// out[t, i, j] = scale · sum_k a[t, i, k] · b[t or 0, j, k] in double, from the values of a and b.
std::vector<double> ref_nt(const Tensor& a, const Tensor& b, double scale = 1.0) {
  const auto av = a.contiguous().to_vector<double>(), bv = b.contiguous().to_vector<double>();
  const int64_t m = a.shape()[a.dim() - 2], k = a.shape().back(), n = b.shape()[b.dim() - 2];
  const int64_t batch = m * k == 0 ? 1 : static_cast<int64_t>(av.size()) / (m * k);
  const bool shared = b.dim() == 2;
  std::vector<double> out;
  for (int64_t t = 0; t < std::max<int64_t>(batch, 1); ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += av[static_cast<std::size_t>((t * m + i) * k + p)] *
               bv[static_cast<std::size_t>(((shared ? 0 : t) * n + j) * k + p)];
        out.push_back(scale * s);
      }
  return out;
}

struct Mnk {
  int64_t m, n, k;
};
const std::vector<Mnk> kSizes = {{1, 1, 1}, {3, 5, 5}, {7, 4, 13}, {17, 9, 37}, {16, 16, 64}, {5, 33, 3}};

Tensor scalar_f32(double v) { return from_vector(std::vector<float>{static_cast<float>(v)}, {1}); }

}  // namespace

TEST_CASE("int8_matmul_nt is exact on odd sizes", "[lowp]") {
  uint64_t seed = 10;
  for (const Mnk& s : kSizes) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    const Tensor a = rand_i8({s.m, s.k}, ++seed), b = rand_i8({s.n, s.k}, ++seed);
    const Tensor out = int8_matmul_nt(a, b);
    CHECK(out.dtype() == DType::i32);
    CHECK(out.shape() == Shape{s.m, s.n});
    CHECK(test::compare(out, ref_nt(a, b), 0, 0) == "");
  }
}

TEST_CASE("int8_matmul_nt: batches, shared b, non-contiguous operands, K = 0", "[lowp]") {
  const Tensor a = rand_i8({2, 3, 5, 13}, 1), b = rand_i8({2, 3, 4, 13}, 2);
  const Tensor out = int8_matmul_nt(a, b);
  CHECK(out.shape() == Shape{2, 3, 5, 4});
  CHECK(test::compare(out, ref_nt(a, b), 0, 0) == "");

  const Tensor a3 = rand_i8({4, 7, 37}, 3), b2 = rand_i8({6, 37}, 4);
  CHECK(test::compare(int8_matmul_nt(a3, b2), ref_nt(a3, b2), 0, 0) == "");

  // a and b as transposed / sliced views
  const Tensor at = rand_i8({13, 9}, 5).transpose(0, 1);           // (9, 13), stride (1, 9)
  const Tensor bs = rand_i8({5, 20}, 6).narrow(1, 3, 13);          // (5, 13), row stride 20
  REQUIRE(!at.is_contiguous());
  REQUIRE(!bs.is_contiguous());
  CHECK(test::compare(int8_matmul_nt(at, bs), ref_nt(at, bs), 0, 0) == "");

  // extremes: -128 included; sums of 4096 products of 127 · -128 stay far inside int32
  const Tensor big_a = full({2, 4096}, -128.0, {DType::i8}), big_b = full({3, 4096}, 127.0, {DType::i8});
  const Tensor big = int8_matmul_nt(big_a, big_b);
  for (int64_t v : big.to_vector<int64_t>()) CHECK(v == -128LL * 127 * 4096);

  const Tensor e = int8_matmul_nt(rand_i8({3, 0}, 7), rand_i8({2, 0}, 8));
  CHECK(e.shape() == Shape{3, 2});
  for (int64_t v : e.to_vector<int64_t>()) CHECK(v == 0);
}

TEST_CASE("fp8_matmul_nt matches double sums of the fp8 values, scaled", "[lowp]") {
  uint64_t seed = 100;
  const std::vector<std::pair<DType, DType>> combos = {
      {DType::f8e4m3, DType::f8e4m3}, {DType::f8e5m2, DType::f8e4m3}, {DType::f8e4m3, DType::f8e5m2}};
  for (const auto& [da, db] : combos)
    for (DType out_dt : {DType::f32, DType::bf16})
      for (const Mnk& s : kSizes) {
        INFO(dtype_name(da) << " x " << dtype_name(db) << " -> " << dtype_name(out_dt) << " m " << s.m << " n "
                            << s.n << " k " << s.k);
        const Tensor a = rand_fp8({s.m, s.k}, ++seed, da), b = rand_fp8({s.n, s.k}, ++seed, db);
        const Tensor out = fp8_matmul_nt(a, b, scalar_f32(0.75), scalar_f32(-1.5), out_dt);
        CHECK(out.dtype() == out_dt);
        CHECK(out.shape() == Shape{s.m, s.n});
        // the reference is exact up to double rounding; the op rounds once to f32 (then to bf16)
        const double rtol = out_dt == DType::f32 ? 1e-7 : 1.0 / 256;
        CHECK(test::compare(out, ref_nt(a, b, 0.75 * -1.5), rtol, 1e-30) == "");
      }
}

TEST_CASE("fp8_matmul_nt_outer scales each element by its row and column scale", "[lowp]") {
  uint64_t seed = 300;
  for (DType out_dt : {DType::f32, DType::bf16})
    for (const Mnk& s : kSizes) {
      INFO(dtype_name(out_dt) << " m " << s.m << " n " << s.n << " k " << s.k);
      const Tensor a = rand_fp8({s.m, s.k}, ++seed, DType::f8e4m3), b = rand_fp8({s.n, s.k}, ++seed, DType::f8e4m3);
      const Tensor row = test::random_tensor({s.m}, ++seed, DType::f32, 0.1, 4.0);
      const Tensor col = test::random_tensor({s.n}, ++seed, DType::f32, -2.0, 2.0);
      const Tensor out = fp8_matmul_nt_outer(a, b, row, col, out_dt);
      CHECK(out.dtype() == out_dt);
      CHECK(out.shape() == Shape{s.m, s.n});
      std::vector<double> ref = ref_nt(a, b);
      const auto rv = row.to_vector<double>(), cv = col.to_vector<double>();
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) ref[static_cast<std::size_t>(i * s.n + j)] *= rv[i] * cv[j];
      CHECK(test::compare(out, ref, out_dt == DType::f32 ? 1e-7 : 1.0 / 256, 1e-30) == "");
    }
  const Tensor a = rand_fp8({3, 8}, 1, DType::f8e4m3), b = rand_fp8({4, 8}, 2, DType::f8e4m3);
  const Tensor r3 = from_vector(std::vector<float>{1, 2, 3}, {3}), c4 = from_vector(std::vector<float>{1, 1, 1, 1}, {4});
  CHECK_THROWS_WITH(fp8_matmul_nt_outer(a, b, c4, c4, DType::f32), HasSubstr("row_scale must be an f32 vector of 3"));
  CHECK_THROWS_WITH(fp8_matmul_nt_outer(a, b, r3, r3, DType::f32), HasSubstr("col_scale must be an f32 vector of 4"));
  CHECK_THROWS_WITH(fp8_matmul_nt_outer(reshape(a, {1, 3, 8}), b, r3, c4, DType::f32), HasSubstr("must be 2-D"));
}

TEST_CASE("fp8_matmul_nt: batches, shared b, non-contiguous operands, K = 0", "[lowp]") {
  const Tensor s1 = scalar_f32(1.0), s2 = scalar_f32(0.25);
  const Tensor a = rand_fp8({3, 5, 37}, 1, DType::f8e4m3), b = rand_fp8({3, 6, 37}, 2, DType::f8e4m3);
  CHECK(test::compare(fp8_matmul_nt(a, b, s1, s2, DType::f32), ref_nt(a, b, 0.25), 1e-7, 1e-30) == "");
  const Tensor b2 = rand_fp8({6, 37}, 3, DType::f8e4m3);
  CHECK(test::compare(fp8_matmul_nt(a, b2, s2, s2, DType::f32), ref_nt(a, b2, 0.0625), 1e-7, 1e-30) == "");
  const Tensor at = rand_fp8({13, 9}, 4, DType::f8e5m2).transpose(0, 1);
  const Tensor bs = rand_fp8({5, 20}, 5, DType::f8e4m3).narrow(1, 2, 13);
  CHECK(test::compare(fp8_matmul_nt(at, bs, s1, s1, DType::bf16), ref_nt(at, bs), 1.0 / 256, 1e-30) == "");
  const Tensor e = fp8_matmul_nt(rand_fp8({2, 0}, 6, DType::f8e4m3), rand_fp8({4, 0}, 7, DType::f8e4m3), s1, s1,
                                 DType::f32);
  CHECK(e.shape() == Shape{2, 4});
  for (double v : e.to_vector<double>()) CHECK(v == 0.0);
}

TEST_CASE("low-precision products reject bad operands with clear messages", "[lowp]") {
  const Tensor a = rand_i8({3, 5}, 1), b = rand_i8({4, 5}, 2);
  CHECK_THROWS_WITH(int8_matmul_nt(a.to(DType::f32), b), HasSubstr("must be i8"));
  CHECK_THROWS_WITH(int8_matmul_nt(a, rand_i8({4, 6}, 3)), HasSubstr("must share K"));
  CHECK_THROWS_WITH(int8_matmul_nt(rand_i8({5}, 3), b), HasSubstr("at least 2 dims"));
  CHECK_THROWS_WITH(int8_matmul_nt(rand_i8({2, 3, 5}, 4), rand_i8({3, 4, 5}, 5)), HasSubstr("batch dims"));
  CHECK_THROWS_WITH(int8_matmul_nt(a, rand_i8({2, 4, 5}, 6)), HasSubstr("batch dims"));

  const Tensor fa = rand_fp8({3, 5}, 7, DType::f8e4m3), fb = rand_fp8({4, 5}, 8, DType::f8e4m3);
  const Tensor one = scalar_f32(1.0);
  CHECK_THROWS_WITH(fp8_matmul_nt(fa.to(DType::f8e5m2), fb.to(DType::f8e5m2), one, one, DType::f32),
                    HasSubstr("f8e5m2 x f8e5m2 is not supported"));
  CHECK_THROWS_WITH(fp8_matmul_nt(fa.to(DType::bf16), fb, one, one, DType::f32), HasSubstr("f8e4m3 or f8e5m2"));
  CHECK_THROWS_WITH(fp8_matmul_nt(fa, fb, one, one, DType::f16), HasSubstr("out_dtype must be f32 or bf16"));
  CHECK_THROWS_WITH(fp8_matmul_nt(fa, fb, one.to(DType::f64), one, DType::f32), HasSubstr("scale_a must be"));
  CHECK_THROWS_WITH(fp8_matmul_nt(fa, fb, one, from_vector(std::vector<float>{1, 2}, {2}), DType::f32),
                    HasSubstr("scale_b must be"));
  CHECK_THROWS_WITH(fp8_matmul_nt(fa, rand_fp8({4, 6}, 9, DType::f8e4m3), one, one, DType::f32),
                    HasSubstr("must share K"));
}
