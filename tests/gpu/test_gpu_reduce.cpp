// CUDA sum and mean against the CPU reference: every dim combination of small 3-D shapes, row- and
// column-style reductions large enough to split over many blocks, odd sizes, non-contiguous inputs and
// every dtype. Integer-valued inputs make f32 sums exact, so a missed or double-counted element is caught
// exactly; random real inputs are compared with the dtype tolerance.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <functional>

using namespace ht;

namespace {

using View = std::function<Tensor(const Tensor&)>;

struct ReduceSpec {
  const char* name;
  Dims dims;  // empty: all dims
  KeepDim keep = KeepDim::no;
};

Tensor reduce(const Tensor& x, const ReduceSpec& r, bool is_mean) {
  if (r.dims.empty()) return is_mean ? mean(x) : sum(x);
  return is_mean ? mean(x, r.dims, r.keep) : sum(x, r.dims, r.keep);
}

// The reduced result of x on both devices; "" when they agree within tol.
std::string check_reduction(const Tensor& x, const View& view, const ReduceSpec& r, bool is_mean, test::Tolerance tol) {
  const Tensor expected = reduce(view(x), r, is_mean);
  Tensor actual;
  {
    test::PoisonGuard poison;
    actual = reduce(view(x.to(test::kCuda)), r, is_mean);
  }
  return test::compare_to_cpu(actual, expected, tol);
}

Tensor same(const Tensor& t) { return t; }

}  // namespace

TEST_CASE("sum over every dim combination is exact on integer-valued data", "[gpu][reduce]") {
  const std::vector<ReduceSpec> reductions = {
      {"all", {}},          {"dim 0", {0}},        {"dim 1", {1}},       {"dim 2", {2}},
      {"dims 0,1", {0, 1}}, {"dims 0,2", {0, 2}},  {"dims 1,2", {1, 2}}, {"dim -1 keep", {-1}, KeepDim::yes},
      {"dims 0,2 keep", {0, 2}, KeepDim::yes},
  };
  const std::vector<std::pair<const char*, View>> views = {
      {"contiguous", same},
      {"permuted", [](const Tensor& t) { return t.permute({2, 0, 1}); }},
      {"step-sliced", [](const Tensor& t) { return slice(t, 2, 0, t.size(2), 2); }},
  };
  uint64_t seed = 10;
  for (DType dt : test::all_dtypes()) {
    for (const Shape& shape : {Shape{7, 13, 5}, Shape{3, 1, 1030}, Shape{1, 1, 1}}) {
      // small integers: every partial sum is exact in f32 / f16 / bf16 accumulation alike
      const Tensor x = test::random_input(shape, ++seed, DType::i32, -3, 3).to(dt);
      for (const auto& [vname, view] : views) {
        for (const ReduceSpec& r : reductions) {
          INFO("sum " << r.name << " of " << vname << " " << dtype_name(dt) << " " << to_string(shape));
          CHECK(check_reduction(x, view, r, false, test::tolerance(dt)) == "");
        }
      }
    }
  }
}

TEST_CASE("large and split reductions are exact on integer-valued data", "[gpu][reduce]") {
  struct Big {
    const char* name;
    Shape shape;
    ReduceSpec r;
  };
  const std::vector<Big> cases = {
      {"1000003 elements, all", {1000003}, {"all", {}}},
      {"long rows", {3, 300007}, {"dim 1", {1}}},
      {"many short rows", {100003, 7}, {"dim 1", {1}}},
      {"columns (bias gradient)", {65537, 33}, {"dim 0", {0}}},
      {"leading and trailing dims", {129, 7, 257}, {"dims 0,2", {0, 2}}},
      {"middle dim", {17, 4099, 9}, {"dim 1", {1}}},
  };
  uint64_t seed = 200;
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::b8}) {
    for (const Big& c : cases) {
      const Tensor x = test::random_input(c.shape, ++seed, DType::i32, -3, 3).to(dt);
      INFO(c.name << " " << dtype_name(dt));
      CHECK(check_reduction(x, same, c.r, false, test::tolerance(dt)) == "");
      if (c.shape.size() >= 2)
        CHECK(check_reduction(x, [](const Tensor& t) { return t.transpose(0, -1); }, c.r, false, test::tolerance(dt)) ==
              "");
    }
  }
}

TEST_CASE("sum and mean of random real data match the CPU within tolerance", "[gpu][reduce]") {
  const std::vector<std::pair<Shape, ReduceSpec>> cases = {
      {{1}, {"all", {}}},
      {{7}, {"all", {}}},
      {{1000003}, {"all", {}}},
      {{33, 1025}, {"dim 1", {1}}},
      {{4097, 31}, {"dim 0", {0}, KeepDim::yes}},
      {{6, 5, 301}, {"dims 0,2", {0, 2}}},
  };
  std::vector<DType> dtypes = test::kFloatDTypes;
  dtypes.insert(dtypes.end(), test::kFp8DTypes.begin(), test::kFp8DTypes.end());
  uint64_t seed = 400;
  for (DType dt : dtypes) {
    for (const auto& [shape, r] : cases) {
      // positive inputs keep the relative tolerance meaningful (no cancellation)
      const Tensor x = test::random_input(shape, ++seed, dt, 0.5, 1.5);
      // f32 accumulation over up to 1e6 terms: allow sqrt(n) float roundings; the result's own rounding
      // to a narrow dtype is covered by the table's rtol.
      test::Tolerance tol = test::tolerance(dt);
      if (dt != DType::f64) tol.rtol += 1e-6;
      for (bool is_mean : {false, true}) {
        INFO((is_mean ? "mean " : "sum ") << r.name << " " << dtype_name(dt) << " " << to_string(shape));
        CHECK(check_reduction(x, same, r, is_mean, tol) == "");
      }
    }
  }
}

TEST_CASE("reductions of empty tensors and integer results", "[gpu][reduce]") {
  const Tensor e = empty({0, 4}, {DType::f32, test::kCuda});
  CHECK(test::compare_bits(sum(e, {0}), sum(empty({0, 4}, {DType::f32}), {0})) == "");
  CHECK(sum(e).item() == 0.0);
  CHECK(sum(e, {1}).numel() == 0);
  // integers sum to i64 (no overflow at i8 scale)
  const Tensor big = full({1000}, 100.0, {DType::i8, test::kCuda});
  const Tensor s = sum(big);
  CHECK(s.dtype() == DType::i64);
  CHECK(s.item() == 100000.0);
  CHECK_THROWS_WITH(mean(big), HasSubstr("mean: expected a floating tensor"));
}

// The vectorized rows path (16-byte loads when the reduced dim is contiguous and every row and split start
// is aligned) against the scalar one: a warp per row (K < 2048, many rows) and a block per row (K >= 2048),
// whole-tensor sums split over many blocks, lengths that leave a tail after the last pack, and views whose
// rows start one element in (not aligned, scalar loads). Integer-valued data: exact in every dtype.
TEST_CASE("contiguous row sums with 16-byte loads are exact on integer-valued data", "[gpu][reduce]") {
  struct Case {
    const char* name;
    Shape shape;
    ReduceSpec r;
  };
  const std::vector<Case> cases = {
      {"rows of 4096 (block per row)", {1031, 4096}, {"dim 1", {1}}},
      {"rows of 1000 (warp per row)", {2051, 1000}, {"dim 1", {1}, KeepDim::yes}},
      {"rows of 4099 (tail)", {37, 4099}, {"dim 1", {1}}},
      {"all of 4194319", {4194319}, {"all", {}}},
      {"all of (2048, 2048)", {2048, 2048}, {"all", {}}},
      {"inner dims of (5, 64, 65)", {5, 64, 65}, {"dims 1,2", {1, 2}}},
  };
  uint64_t seed = 700;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::u8, DType::b8, DType::f8e4m3}) {
    for (const Case& c : cases) {
      const Tensor x = test::random_input(c.shape, ++seed, DType::i32, 0, 3).to(dt);
      INFO(c.name << " " << dtype_name(dt));
      CHECK(check_reduction(x, same, c.r, false, test::tolerance(dt)) == "");
      if (is_floating(dt)) CHECK(check_reduction(x, same, c.r, true, test::tolerance(dt)) == "");  // mean: floats only
      if (c.shape.size() >= 2) {
        const View drop_first = [](const Tensor& t) { return slice(t, -1, 1, t.shape().back(), 1); };
        CHECK(check_reduction(x, drop_first, c.r, false, test::tolerance(dt)) == "");
      }
    }
  }
}
