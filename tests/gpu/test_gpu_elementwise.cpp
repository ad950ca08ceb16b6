// CUDA elementwise ops against the CPU reference: binary arithmetic (bit-exact: one IEEE operation in the
// same precision on both sides), scalar ops, unary math, comparisons, where / masked_fill, and the in-place
// optimiser updates, for every dtype, odd sizes, broadcasting and non-contiguous views. CUDA outputs are
// allocated poisoned (0xFF) so unwritten elements fail.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <functional>
#include <limits>

#include "hadatrain/autograd/grad_mode.h"

using namespace ht;

namespace {

using View = std::function<Tensor(const Tensor&)>;
using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;
using UnaryFn = std::function<Tensor(const Tensor&)>;

Tensor same(const Tensor& t) { return t; }

// One input layout case: shapes of the two base tensors and the views applied to them (on both devices).
struct Case {
  const char* name;
  Shape a, b;
  View va = same, vb = same;
};

std::vector<Case> binary_cases() {
  return {
      {"1 element", {1}, {1}},
      {"7 elements", {7}, {7}},
      {"1000003 elements", {1000003}, {1000003}},
      {"broadcast (7,1,5) with (3,5)", {7, 1, 5}, {3, 5}},
      // a bias row (cuda/kernels/map.cuh map2_rows: 64 and 32 are whole 16-byte packs in every dtype), either side
      {"bias row (33,64) + (64)", {33, 64}, {64}},
      {"bias row (32) + (5,3,32)", {32}, {5, 3, 32}},
      {"scalar operand", {4, 9}, {}},
      {"transposed and step-sliced views", {5, 7}, {7, 10},
       [](const Tensor& t) { return t.transpose(0, 1); }, [](const Tensor& t) { return slice(t, 1, 0, 10, 2); }},
      {"expanded views", {1, 6}, {5, 1},
       [](const Tensor& t) { return t.expand({5, 6}); }, [](const Tensor& t) { return t.expand({5, 6}); }},
  };
}

// Runs f on CPU inputs and on their CUDA copies and returns "" when the results agree.
std::string run_binary(const BinaryFn& f, const Case& c, const Tensor& a, const Tensor& b, test::Tolerance tol,
                       bool bitwise) {
  const Tensor ca = a.to(test::kCuda), cb = b.to(test::kCuda);
  const Tensor expected = f(c.va(a), c.vb(b));
  Tensor actual;
  {
    test::PoisonGuard poison;
    actual = f(c.va(ca), c.vb(cb));
  }
  return bitwise ? test::compare_bits(actual, expected) : test::compare_to_cpu(actual, expected, tol);
}

struct NamedBinary {
  const char* name;
  BinaryFn f;
};

}  // namespace

TEST_CASE("binary arithmetic matches the CPU bit for bit in every dtype", "[gpu][elementwise]") {
  const std::vector<NamedBinary> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  uint64_t seed = 100;
  for (DType dt : test::all_dtypes()) {
    for (const auto& op : ops) {
      const bool is_div = std::string(op.name) == "div";
      if (is_div && dt == DType::b8) continue;  // bool divisors are zero half of the time (tested below)
      for (const Case& c : binary_cases()) {
        // integer divisors in [1, 9]; integer operands wide enough to hit i8/u8 saturation in mul/sub
        const Tensor a = test::random_input(c.a, ++seed, dt, -100, 100);
        const Tensor b = is_div && !is_floating(dt) ? test::random_input(c.b, ++seed, dt, 1, 9)
                                                    : test::random_input(c.b, ++seed, dt, -100, 100);
        INFO(op.name << " " << dtype_name(dt) << ", " << c.name);
        CHECK(run_binary(op.f, c, a, b, test::tolerance(dt), true) == "");
      }
    }
  }
}

TEST_CASE("binary ops promote mixed dtypes like the CPU", "[gpu][elementwise]") {
  const std::vector<std::pair<DType, DType>> pairs = {{DType::bf16, DType::f16},  {DType::f32, DType::bf16},
                                                      {DType::i32, DType::f16},   {DType::u8, DType::i8},
                                                      {DType::f8e4m3, DType::f64}, {DType::b8, DType::i64}};
  uint64_t seed = 900;
  for (auto [da, db] : pairs) {
    const Case c{"broadcast", {3, 1, 8}, {5, 8}};
    const Tensor a = test::random_input(c.a, ++seed, da, -50, 50), b = test::random_input(c.b, ++seed, db, -50, 50);
    INFO(dtype_name(da) << " * " << dtype_name(db));
    CHECK(run_binary([](const Tensor& x, const Tensor& y) { return mul(x, y); }, c, a, b, {}, true) == "");
  }
}

TEST_CASE("integer division by zero is an error on CUDA as on the CPU", "[gpu][elementwise]") {
  const Tensor a = from_vector(std::vector<int64_t>{4, 5, 6}, {3}, {DType::i32, test::kCuda});
  const Tensor b = from_vector(std::vector<int64_t>{1, 0, 2}, {3}, {DType::i32, test::kCuda});
  CHECK_THROWS_WITH(div(a, b), HasSubstr("integer division by zero"));
  CHECK_THROWS_WITH(div(a.to(DType::b8), b.to(DType::b8)), HasSubstr("integer division by zero"));
  CHECK(div(a, a).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
}

TEST_CASE("NaN propagates through maximum, minimum and relu on CUDA as on the CPU", "[gpu][elementwise]") {
  const double nan = std::nan("");
  const Tensor a = from_vector(std::vector<double>{nan, 1.0, nan, -2.0}, {4}, {DType::f32});
  const Tensor b = from_vector(std::vector<double>{0.0, nan, nan, 3.0}, {4}, {DType::f32});
  const Tensor ca = a.to(test::kCuda), cb = b.to(test::kCuda);
  CHECK(test::compare_bits(maximum(ca, cb), maximum(a, b)) == "");
  CHECK(test::compare_bits(minimum(ca, cb), minimum(a, b)) == "");
  // relu may return a different NaN payload on the GPU (nvcc turns the select into max.NaN, which yields the
  // canonical NaN), so it is compared as values: NaN where the CPU has NaN, the exact value elsewhere.
  CHECK(test::compare_to_cpu(relu(ca), relu(a), {0.0, 0.0}) == "");
  CHECK(test::compare_bits(eq(ca, cb), eq(a, b)) == "");
  CHECK(test::compare_bits(ne(ca, cb), ne(a, b)) == "");
}

TEST_CASE("scalar ops match the CPU in every dtype", "[gpu][elementwise]") {
  const std::vector<std::pair<const char*, UnaryFn>> ops = {
      {"add 2.5", [](const Tensor& x) { return add(x, 2.5); }},
      {"sub 3", [](const Tensor& x) { return sub(x, 3.0); }},
      {"mul -1.75", [](const Tensor& x) { return mul(x, -1.75); }},
      {"div 4", [](const Tensor& x) { return div(x, 4.0); }},
      {"rsub 1", [](const Tensor& x) { return rsub(1.0, x); }},
      {"pow 2", [](const Tensor& x) { return pow(x, 2.0); }},
      {"pow 0.5", [](const Tensor& x) { return pow(abs(x), 0.5); }},
  };
  uint64_t seed = 300;
  for (DType dt : test::all_dtypes()) {
    for (const auto& [name, f] : ops) {
      if (dt == DType::b8 && std::string(name) == "pow 0.5") continue;  // abs is not defined for bool
      for (const Shape& s : {Shape{1}, Shape{7}, Shape{1000003}, Shape{6, 5}}) {
        const Tensor x = test::random_input(s, ++seed, dt, -20, 20);
        const bool strided = s.size() == 2;
        const View v = strided ? View([](const Tensor& t) { return t.transpose(0, 1); }) : View(same);
        const Tensor expected = f(v(x));
        Tensor actual;
        {
          test::PoisonGuard poison;
          actual = f(v(x.to(test::kCuda)));
        }
        INFO(name << " " << dtype_name(dt) << " " << to_string(s));
        // pow runs std::pow / CUDA pow in double on both sides, then truncates integers: a result that is an
        // integer in exact arithmetic may come out one unit lower on one side.
        const bool int_pow = !is_floating(dt) && std::string(name).rfind("pow", 0) == 0;
        CHECK(test::compare_to_cpu(actual, expected, int_pow ? test::Tolerance{0, 1} : test::tolerance(dt)) == "");
      }
    }
  }
}

TEST_CASE("unary math matches the CPU in every floating dtype", "[gpu][elementwise]") {
  struct Op {
    const char* name;
    UnaryFn f;
    double lo, hi;  // input range (log/sqrt/rsqrt need positive inputs)
  };
  const std::vector<Op> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }, -4, 4},
      {"abs", [](const Tensor& x) { return abs(x); }, -4, 4},
      {"exp", [](const Tensor& x) { return exp(x); }, -4, 4},
      {"log", [](const Tensor& x) { return log(x); }, 0.05, 6},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.05, 6},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.05, 6},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -4, 4},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -6, 6},
      {"relu", [](const Tensor& x) { return relu(x); }, -4, 4},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -4, 4},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, -4, 4},
      {"silu", [](const Tensor& x) { return silu(x); }, -6, 6},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }, -2, 2},
  };
  std::vector<DType> dtypes = test::kFloatDTypes;
  dtypes.insert(dtypes.end(), test::kFp8DTypes.begin(), test::kFp8DTypes.end());
  uint64_t seed = 500;
  for (DType dt : dtypes) {
    for (const Op& op : ops) {
      for (const Shape& s : {Shape{1}, Shape{7}, Shape{1000003}, Shape{9, 4, 3}}) {
        const Tensor x = test::random_input(s, ++seed, dt, op.lo, op.hi);
        const bool strided = s.size() == 3;
        const View v = strided ? View([](const Tensor& t) { return t.permute({2, 0, 1}); }) : View(same);
        const Tensor expected = op.f(v(x));
        Tensor actual;
        {
          test::PoisonGuard poison;
          actual = op.f(v(x.to(test::kCuda)));
        }
        INFO(op.name << " " << dtype_name(dt) << " " << to_string(s));
        CHECK(test::compare_to_cpu(actual, expected) == "");
      }
    }
  }
}

TEST_CASE("integer unary ops match the CPU; bool has none", "[gpu][elementwise]") {
  const std::vector<std::pair<const char*, UnaryFn>> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -3, 40); }},
  };
  uint64_t seed = 700;
  for (DType dt : test::kIntDTypes) {
    for (const auto& [name, f] : ops) {
      const Tensor x = test::random_input({1001}, ++seed, dt, -128, 127);  // i8 -128: neg saturates
      Tensor actual;
      {
        test::PoisonGuard poison;
        actual = f(x.to(test::kCuda));
      }
      INFO(name << " " << dtype_name(dt));
      CHECK(test::compare_bits(actual, f(x)) == "");
    }
  }
  const Tensor flags = test::random_input({5}, 1, DType::b8).to(test::kCuda);
  CHECK_THROWS_WITH(neg(flags), HasSubstr("neg: not defined for bool"));
  CHECK_THROWS_WITH(exp(test::random_input({5}, 1, DType::i32).to(test::kCuda)), HasSubstr("exp"));
}

TEST_CASE("comparisons match the CPU in every dtype", "[gpu][elementwise]") {
  const std::vector<NamedBinary> ops = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
  };
  uint64_t seed = 1100;
  for (DType dt : test::all_dtypes()) {
    for (const auto& op : ops) {
      for (const Case& c : binary_cases()) {
        // small integers converted to dt, so that ties (eq, le, ge) occur
        const Tensor a = test::random_input(c.a, ++seed, DType::i32, -3, 3).to(dt);
        const Tensor b = test::random_input(c.b, ++seed, DType::i32, -3, 3).to(dt);
        INFO(op.name << " " << dtype_name(dt) << ", " << c.name);
        CHECK(run_binary(op.f, c, a, b, {}, true) == "");
      }
    }
  }
  // the scalar forms
  const Tensor x = test::random_input({1000}, 5, DType::i32, -3, 3).to(DType::f32);
  const Tensor cx = x.to(test::kCuda);
  CHECK(test::compare_bits(eq(cx, 1.0), eq(x, 1.0)) == "");
  CHECK(test::compare_bits(lt(cx, 0.0), lt(x, 0.0)) == "");
  CHECK(test::compare_bits(gt(cx, -1.0), gt(x, -1.0)) == "");
}

TEST_CASE("where and masked_fill match the CPU in every dtype", "[gpu][elementwise]") {
  uint64_t seed = 1300;
  for (DType dt : test::all_dtypes()) {
    // cond (6,1), a (1,7) expanded, b a transposed (7,6) view: all three broadcast to (6,7)
    const Tensor cond = test::random_input({6, 1}, ++seed, DType::b8);
    const Tensor a = test::random_input({1, 7}, ++seed, dt, -50, 50);
    const Tensor b = test::random_input({7, 6}, ++seed, dt, -50, 50);
    const Tensor expected = where(cond, a, b.transpose(0, 1));
    Tensor actual;
    {
      test::PoisonGuard poison;
      actual = where(cond.to(test::kCuda), a.to(test::kCuda), b.to(test::kCuda).transpose(0, 1));
    }
    INFO("where " << dtype_name(dt));
    CHECK(test::compare_bits(actual, expected) == "");
    // odd-sized, contiguous
    const Tensor c2 = test::random_input({1000003}, ++seed, DType::b8);
    const Tensor a2 = test::random_input({1000003}, ++seed, dt, -50, 50);
    const Tensor b2 = test::random_input({1000003}, ++seed, dt, -50, 50);
    CHECK(test::compare_bits(where(c2.to(test::kCuda), a2.to(test::kCuda), b2.to(test::kCuda)), where(c2, a2, b2)) == "");
    if (dt != DType::b8) {
      const Tensor mask = test::random_input({1, 7}, ++seed, DType::b8);
      const Tensor x = test::random_input({5, 7}, ++seed, dt, -50, 50);
      CHECK(test::compare_bits(masked_fill(x.to(test::kCuda), mask.to(test::kCuda), -3.0), masked_fill(x, mask, -3.0)) ==
            "");
    }
  }
  // mixed dtypes promote like the CPU
  const Tensor cond = test::random_input({9}, 3, DType::b8);
  const Tensor a = test::random_input({9}, 4, DType::bf16), b = test::random_input({9}, 5, DType::i32, -9, 9);
  CHECK(test::compare_bits(where(cond.to(test::kCuda), a.to(test::kCuda), b.to(test::kCuda)), where(cond, a, b)) == "");
  CHECK_THROWS_WITH(where(a.to(test::kCuda), a.to(test::kCuda), b.to(test::kCuda)), HasSubstr("condition must be bool"));
}

TEST_CASE("in-place add_ and mul_ update CUDA tensors like the CPU", "[gpu][elementwise]") {
  NoGradGuard no_grad;
  uint64_t seed = 1500;
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::f8e4m3}) {
    // self: a transposed view of an (8,5) tensor; other broadcasts from (1,8) with another dtype
    const Tensor self = test::random_input({8, 5}, ++seed, dt);
    const Tensor other = test::random_input({1, 8}, ++seed, DType::f32);
    const Tensor cself = self.to(test::kCuda);
    add_(self.transpose(0, 1), other, -0.375);
    add_(cself.transpose(0, 1), other.to(test::kCuda), -0.375);
    INFO("add_ " << dtype_name(dt));
    CHECK(test::compare_to_cpu(cself, self) == "");  // add_ may fuse x + alpha*y into one FMA on the GPU
    mul_(self, 1.5);
    mul_(cself, 1.5);
    CHECK(test::compare_to_cpu(cself, self) == "");
  }
  Tensor ints = test::random_input({4}, 1, DType::i32).to(test::kCuda);
  CHECK_THROWS_WITH(mul_(ints, 2.0), HasSubstr("mul_"));
}

// The fixed-op unary kernels (relu, gelu, gelu_tanh, silu, add / mul by a scalar compiled per op for f32,
// bf16 and f16) on sizes where every thread of the capped grid handles two or more 16-byte packs and a
// tail remains, and on a view starting one element in (not 16-byte aligned: the generic strided kernel).
TEST_CASE("hot unary ops on large and unaligned inputs match the CPU", "[gpu][elementwise]") {
  const std::vector<std::pair<const char*, UnaryFn>> ops = {
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"add 2.5", [](const Tensor& x) { return add(x, 2.5); }},
      {"mul -1.75", [](const Tensor& x) { return mul(x, -1.75); }},
      {"exp (generic kernel)", [](const Tensor& x) { return exp(x); }},
  };
  uint64_t seed = 900;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t n = dt == DType::f32 ? 9000011 : 17300003;  // > 2 packs per thread of 132 * 32 * 256
    const Tensor x = test::random_input({n}, ++seed, dt, -5, 5);
    const Tensor xc = x.to(test::kCuda);
    for (const auto& [name, f] : ops) {
      INFO(name << " " << dtype_name(dt));
      Tensor actual, actual_sliced;
      {
        test::PoisonGuard poison;
        actual = f(xc);
        actual_sliced = f(slice(xc, 0, 1, n, 1));
      }
      CHECK(test::compare_to_cpu(actual, f(x)) == "");
      CHECK(test::compare_to_cpu(actual_sliced, f(slice(x, 0, 1, n, 1))) == "");
    }
  }
}

// The fused unary backward (gx = g * f'(x) in one kernel, cuda/kernels/elementwise.cu launch_unary_backward):
// fixed-op kernels (relu, gelu, gelu_tanh, silu; bf16 / f16 GELU and SiLU in their fast forms) on a large
// flat input, the generic kernel for the other ops, and the strided kernel through a permuted view, against
// the f64 CPU gradient of the same values (the GPU rounds once; the op composition on the CPU rounds twice).
TEST_CASE("fused unary backward matches the f64 CPU gradient", "[gpu][elementwise]") {
  const std::vector<std::pair<const char*, UnaryFn>> ops = {
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }},
  };
  uint64_t seed = 1300;
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    for (const auto& [name, f] : ops) {
      for (const Shape& s : {Shape{1000003}, Shape{33, 17, 9}}) {
        const bool strided = s.size() == 3;
        const View v = strided ? View([](const Tensor& t) { return t.permute({2, 0, 1}); })
                               : View([](const Tensor& t) { return t; });
        const Tensor x = test::random_input(s, ++seed, dt, -5, 5);
        const Tensor g = test::random_input(v(x).shape(), ++seed, dt, -2, 2);
        auto grad = [&](Device dev, DType t) {
          Tensor leaf = x.to(t).to(dev).detach();
          leaf.set_requires_grad(true);
          f(v(leaf)).backward(g.to(t).to(dev));
          return leaf.grad();
        };
        const Tensor expected = grad(Device::cpu(), DType::f64);
        Tensor actual;
        {
          test::PoisonGuard poison;
          actual = grad(test::kCuda, dt);
        }
        INFO(name << " " << dtype_name(dt) << " " << to_string(s));
        const test::Tolerance tol = dt == DType::f32 ? test::Tolerance{1e-5, 1e-6} : test::tolerance(dt);
        CHECK(test::compare_to_cpu(actual, expected.to(dt), tol) == "");
      }
    }
  }
}

// The bf16 / f16 gelu (erf) forward kernel (gelu_erf_fwd, Note [GELU forward kernel] in
// cuda/kernels/elementwise.cu) against the CPU: sizes below one pack, with a tail after the last pack, spanning
// several blocks with a partial last block, large; a view one element in (not 16-byte aligned: the generic
// kernel); inputs far in both tails; and non-finite inputs through both kernels (NaN stays NaN, +inf -> inf,
// -inf -> NaN as on the CPU). f32 takes the generic fixed-op kernel.
TEST_CASE("gelu forward kernel matches the CPU", "[gpu][elementwise]") {
  uint64_t seed = 1700;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{8 * 1024 + 3}, int64_t{1000003}, int64_t{17300003}})
      for (double range : {5.0, 12.0}) {
        INFO(dtype_name(dt) << " n " << n << " range " << range);
        const Tensor x = test::random_input({n}, ++seed, dt, -range, range);
        const Tensor xc = x.to(test::kCuda);
        Tensor got, sliced;
        {
          test::PoisonGuard poison;
          got = gelu(xc);
          if (n > 1) sliced = gelu(slice(xc, 0, 1, n, 1));
        }
        CHECK(test::compare_to_cpu(got, gelu(x)) == "");
        if (n > 1) CHECK(test::compare_to_cpu(sliced, gelu(slice(x, 0, 1, n, 1))) == "");
      }
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t off : {int64_t{0}, int64_t{1}}) {  // 1: not 16-byte aligned (the generic kernel)
      INFO(dtype_name(dt) << " offset " << off);
      const Tensor x9 = from_vector(std::vector<double>{1.0, inf, -inf, nan, 0.0, -0.0, 3.0, -3.0, 1.5}, {9}).to(dt);
      const Tensor x = slice(x9, 0, 1, 9, 1);
      const Tensor yv = off == 0 ? gelu(x.contiguous().to(test::kCuda)) : gelu(slice(x9.to(test::kCuda), 0, 1, 9, 1));
      const Tensor yh = yv.to(Device::cpu()).to(DType::f64);
      const Tensor yc = gelu(x).to(DType::f64);
      CHECK(select(yh, 0, 0).item() == inf);
      CHECK(std::isnan(select(yh, 0, 1).item()));
      CHECK(std::isnan(select(yh, 0, 2).item()));
      CHECK(select(yh, 0, 3).item() == 0.0);
      CHECK(select(yh, 0, 4).item() == 0.0);
      CHECK(std::isnan(select(yc, 0, 1).item()));  // the CPU agrees on -inf
      for (int i = 5; i < 8; ++i) CHECK(select(yh, 0, i).item() == Approx(select(yc, 0, i).item()).epsilon(8e-3));
    }
}

// The bf16 / f16 GELU (erf) forward kernel (Note [GELU forward kernel] in cuda/kernels/elementwise.cu: packs
// rounded two results at a time, packs with a NaN result element by element) matches the CPU on finite inputs,
// and with NaN / inf scattered through the input: NaN -> NaN with the CPU's NaN bits, +inf -> +inf,
// -inf -> NaN, and the finite neighbours in the same packs still match the CPU.
TEST_CASE("gelu forward kernel matches the CPU, with NaN / inf in its packs", "[gpu][elementwise]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  uint64_t seed = 1900;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t n : {int64_t{8}, int64_t{8 * 1024 + 3}, int64_t{1000003}})
      for (const bool special : {false, true}) {
        std::vector<double> v = test::random_input({n}, ++seed, DType::f64, -12.0, 12.0).to_vector<double>();
        if (special)
          for (int64_t i = 5; i < n; i += 977) v[static_cast<std::size_t>(i)] = (i / 977) % 3 == 0 ? nan : ((i / 977) % 3 == 1 ? inf : -inf);
        const Tensor x = from_vector(v, {n}).to(dt);
        const Tensor xc = x.to(test::kCuda);
        INFO(dtype_name(dt) << " n " << n << (special ? " with NaN / inf" : ""));
        Tensor y;
        {
          test::PoisonGuard poison;
          y = gelu(xc);
        }
        const Tensor yh = y.to(Device::cpu());
        const Tensor expected = gelu(x);
        if (!special) {
          CHECK(test::compare_to_cpu(y, expected) == "");
          continue;
        }
        const std::vector<double> got = yh.to_vector<double>(), want = expected.to_vector<double>();
        // both dtypes are 2-byte floats: their bits as uint16_t (yh is a dense host copy of y)
        const Tensor cpu_nan = from_vector(std::vector<double>{nan}, {1}).to(dt);
        const uint16_t nan_bits = *static_cast<const uint16_t*>(cpu_nan.data_ptr());
        const uint16_t* bits = static_cast<const uint16_t*>(yh.data_ptr());
        int mismatches = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double xi = v[static_cast<std::size_t>(i)], gi = got[static_cast<std::size_t>(i)];
          bool ok;
          if (std::isnan(xi) || xi == -inf) {
            ok = std::isnan(gi) && bits[i] == nan_bits;
          } else if (xi == inf) {
            ok = gi == inf;
          } else {
            const double wi = want[static_cast<std::size_t>(i)];
            ok = std::abs(gi - wi) <= 1e-2 * std::abs(wi) + 1e-3;
          }
          if (!ok && ++mismatches <= 5) FAIL_CHECK("element " << i << ": x " << xi << ", got " << gi);
        }
        CHECK(mismatches == 0);
      }
}
