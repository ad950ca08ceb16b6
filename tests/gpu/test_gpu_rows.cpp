// CUDA row ops against the CPU reference: softmax / log_softmax (any dim), cross_entropy (label smoothing,
// ignore_index, every reduction, device-side target check), embedding (repeated ids, device-side id check) and
// max / argmax (ties, NaN), forward and backward, for f32, bf16 and f64, with row lengths 1, 7, 1000 and 4097,
// non-contiguous inputs and poisoned CUDA allocations; the register-cached and long-row kernels also with the
// layer_norm / rms_norm forward. The norm tests proper (every norm kernel variant): test_gpu_rows_norm.cpp.
// Tolerances (row_tol) and check_op: support/row_testing.h.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/row_testing.h"
#include "support/testing.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

using namespace ht;
using test::check_op;
using test::kDTypes;
using test::kLens;
using test::row_tol;

namespace {

Tensor ids_tensor(const std::vector<int64_t>& v, const Shape& shape, DType dt) {
  return from_vector(v, shape).to(dt);
}

}  // namespace

TEST_CASE("softmax and log_softmax on CUDA match the CPU, forward and backward", "[gpu][rows][softmax]") {
  uint64_t seed = 1;
  for (DType dt : kDTypes) {
    for (int64_t len : kLens) {
      const Tensor x = test::random_input({5, len}, ++seed, dt, -4.0, 4.0);
      INFO(dtype_name(dt) << " len " << len);
      CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], -1); }, {x}, dt) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {x}, dt) == "");
      // a non-contiguous input: the rows of the transposed view are strided
      const Tensor xt = test::random_input({len, 3}, ++seed, dt, -4.0, 4.0);
      CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0].transpose(0, 1), -1); }, {xt}, dt) == "");
    }
    // over a non-last dim (middle and first), of a 3-D tensor
    const Tensor x3 = test::random_input({4, 1000, 3}, ++seed, dt, -4.0, 4.0);
    INFO(dtype_name(dt) << " non-last dims");
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {x3}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); }, {x3}, dt) == "");
    // a non-contiguous incoming gradient (through a transpose after the softmax)
    CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], 2).transpose(0, 1); }, {x3}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1).transpose(1, 2); }, {x3}, dt) == "");
  }
  // many short rows: more row groups than blocks in the grid (the grid-stride loop) and a 0-d input
  const Tensor many = test::random_input({70001, 3}, 7, DType::f32, -4.0, 4.0);
  CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {many}, DType::f32) == "");
  const Tensor scalar = test::random_input({}, 8, DType::f32);
  CHECK(test::compare_to_cpu(log_softmax(scalar.to(test::kCuda), 0), log_softmax(scalar, 0)) == "");
  CHECK(test::compare_to_cpu(softmax(scalar.to(test::kCuda), -1), softmax(scalar, -1)) == "");
}

TEST_CASE("softmax on CUDA: -inf entries and NaN rows as on the CPU", "[gpu][rows][softmax]") {
  const double inf = INFINITY, nan = NAN;
  const Tensor x = from_vector(std::vector<double>{1, -inf, 2, 0, nan, 1, -inf, -inf, -inf}, {3, 3});
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor xd = x.to(dt);
    CHECK(test::compare_to_cpu(softmax(xd.to(test::kCuda), 1), softmax(xd, 1), row_tol(dt)) == "");
    CHECK(test::compare_to_cpu(log_softmax(xd.to(test::kCuda), 1), log_softmax(xd, 1), row_tol(dt)) == "");
  }
}

// The register-cached forward kernels (packable rows): -inf and NaN entries in rows whose lanes see only
// -inf, rows of -inf, and many rows (more row groups than blocks, a partial last group) of several widths.
TEST_CASE("softmax and layer_norm on CUDA: cached row kernels, -inf / NaN in packable rows, many rows",
          "[gpu][rows][softmax]") {
  const double inf = INFINITY, nan = NAN;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    const int64_t len = 1024;
    std::vector<double> v(4 * len, -inf);
    v[5] = 2.0;                                        // row 0: one finite value, every other lane only -inf
    for (int64_t j = 0; j < len; ++j) v[len + j] = 0.001 * static_cast<double>(j % 97);  // row 1: finite
    v[len + 700] = -inf;
    v[2 * len + 3] = 1.0;                              // row 2: a NaN in another lane than the finite values
    v[2 * len + 900] = nan;
    // row 3: all -inf
    const Tensor x = from_vector(v, {4, len}).to(dt);
    INFO(dtype_name(dt));
    CHECK(test::compare_to_cpu(softmax(x.to(test::kCuda), 1), softmax(x, 1), row_tol(dt)) == "");
    CHECK(test::compare_to_cpu(log_softmax(x.to(test::kCuda), 1), log_softmax(x, 1), row_tol(dt)) == "");
  }
  uint64_t seed = 5200;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (const Shape& shape : {Shape{20003, 64}, Shape{4001, 520}, Shape{3001, 1024}, Shape{2001, 4096}, Shape{301, 8192}}) {
      const Tensor x = test::random_input(shape, ++seed, dt, -4.0, 4.0);
      const Tensor w = test::random_input({shape[1]}, ++seed, DType::f32, 0.5, 1.5);
      const Tensor b = test::random_input({shape[1]}, ++seed, DType::f32, -1.0, 1.0);
      const Tensor xc = x.to(test::kCuda), wc = w.to(test::kCuda), bc = b.to(test::kCuda);
      INFO(dtype_name(dt) << " " << to_string(shape));
      test::PoisonGuard poison;
      CHECK(test::compare_to_cpu(softmax(xc, 1), softmax(x, 1), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(log_softmax(xc, 1), log_softmax(x, 1), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(layer_norm(xc, wc, bc), layer_norm(x, w, b), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(rms_norm(xc, Tensor()), rms_norm(x, Tensor()), row_tol(dt)) == "");
    }
  }
}

// The bf16 / f16 paths of the register-cached forward kernels (rows.cu, rows_norm_cached.cu): a softmax row maximum of large
// magnitude (e^(x - m) as 2^(x log2e - m log2e) below |m| = 2^23, (x - m) log2e above), and NaN / inf
// parameters of layer_norm, whose NaN results the pack-wise rounding must detect and patch like store_cast.
TEST_CASE("softmax and layer_norm on CUDA: cached row kernels with large logits and non-finite parameters",
          "[gpu][rows][softmax]") {
  uint64_t seed = 5300;
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::vector<double> scales =
        dt == DType::f16 ? std::vector<double>{1e3, 6e4} : std::vector<double>{1e3, 6e6, 8.5e6, 1e9, 1e30};
    for (double scale : scales) {
      const Tensor x = test::random_input({7, 1024}, ++seed, dt, -scale, scale);
      INFO(dtype_name(dt) << " scale " << scale);
      CHECK(test::compare_to_cpu(softmax(x.to(test::kCuda), 1), softmax(x, 1), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(log_softmax(x.to(test::kCuda), 1), log_softmax(x, 1), row_tol(dt)) == "");
    }
    // ties at the maximum just below 2^23 (bf16; f16 saturates at 65504, its -1e6 is -inf): e of the max
    // scaled by the rounding of m log2e, which cancels in e / s
    std::vector<double> v(3 * 512, -1e6);
    v[10] = v[300] = dt == DType::f16 ? 6e4 : 8.3e6;
    v[512 + 7] = 4096.0;
    v[1024 + 100] = -5e6;
    const Tensor t = from_vector(v, {3, 512}).to(dt);
    INFO(dtype_name(dt) << " ties");
    CHECK(test::compare_to_cpu(softmax(t.to(test::kCuda), 1), softmax(t, 1), row_tol(dt)) == "");
  }
  const double inf = INFINITY, nan = NAN;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (DType pdt : {dt, DType::f32}) {  // parameters in the row dtype (read as they are) or f32
      Tensor x = test::random_input({5, 1024}, ++seed, dt, -2.0, 2.0);
      std::vector<double> xv = x.to_vector<double>();
      xv[3 * 1024 + 17] = nan;  // row 3: NaN everywhere
      x = from_vector(xv, {5, 1024}).to(dt);
      std::vector<double> wv = test::random_input({1024}, ++seed, DType::f64, 0.5, 1.5).to_vector<double>();
      std::vector<double> bv = test::random_input({1024}, ++seed, DType::f64, -1.0, 1.0).to_vector<double>();
      wv[3] = nan;    // column 3: NaN
      bv[700] = inf;  // column 700: +inf
      wv[701] = inf;  // column 701: +-inf (or NaN where x - mean is 0)
      const Tensor w = from_vector(wv, {1024}).to(pdt), b = from_vector(bv, {1024}).to(pdt);
      INFO(dtype_name(dt) << " x, " << dtype_name(pdt) << " parameters");
      CHECK(test::compare_to_cpu(layer_norm(x.to(test::kCuda), w.to(test::kCuda), b.to(test::kCuda)), layer_norm(x, w, b),
                                 row_tol(dt)) == "");
    }
  }
}

TEST_CASE("cross_entropy on CUDA matches the CPU for every reduction, label smoothing and ignore_index",
          "[gpu][rows][cross_entropy]") {
  uint64_t seed = 100;
  const int64_t n = 37;
  for (DType dt : kDTypes) {
    for (int64_t c : kLens) {
      const Tensor logits = test::random_input({n, c}, ++seed, dt, -3.0, 3.0);
      std::vector<int64_t> t = test::random_input({n}, ++seed, DType::i64, 0, static_cast<double>(c - 1)).to_vector<int64_t>();
      t[3] = -100;  // the default ignore_index
      t[10] = -100;
      for (DType tdt : {DType::i64, DType::i32}) {
        const Tensor target = ids_tensor(t, {n}, tdt);
        for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
          for (double ls : {0.0, 0.1}) {
            INFO(dtype_name(dt) << " C " << c << " target " << dtype_name(tdt) << " reduction "
                                << static_cast<int>(red) << " smoothing " << ls);
            const CrossEntropyOptions opts{-100, ls, red};
            CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], opts); },
                           {logits, target}, dt) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy on CUDA: custom ignore_index, all rows ignored, strided logits", "[gpu][rows][cross_entropy]") {
  const Tensor logits = test::random_input({9, 7}, 200, DType::f32, -3.0, 3.0);
  const Tensor target = ids_tensor({0, 3, 6, 3, 2, 3, 1, 5, 4}, {9}, DType::i64);
  const CrossEntropyOptions custom{3, 0.2, Reduction::mean};
  CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], custom); }, {logits, target},
                 DType::f32) == "");
  // every row ignored: mean is NaN on both devices, and the gradient is zero
  const Tensor all_ignored = ids_tensor(std::vector<int64_t>(9, -100), {9}, DType::i64);
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    const CrossEntropyOptions opts{-100, 0.0, red};
    CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], opts); },
                   {logits, all_ignored}, DType::f32) == "");
  }
  // non-contiguous logits: the transpose of a (C, N) tensor
  const Tensor lt = test::random_input({7, 9}, 201, DType::f64, -3.0, 3.0);
  CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0].transpose(0, 1), in[1]); },
                 {lt, target}, DType::f64) == "");
}

TEST_CASE("cross_entropy on CUDA rejects out-of-range targets (checked on the device)", "[gpu][rows][cross_entropy]") {
  const Tensor logits = test::random_input({4, 5}, 300, DType::f32).to(test::kCuda);
  for (int64_t bad : {5, -1, 1000}) {
    const Tensor target = ids_tensor({0, 1, bad, 7}, {4}, DType::i64).to(test::kCuda);
    CHECK_THROWS_WITH(cross_entropy(logits, target),
                      HasSubstr("target[2] = " + std::to_string(bad) + " is out of range for 5 classes"));
  }
  // the same tensors without the bad value work (the status buffer is per call)
  CHECK(std::isfinite(cross_entropy(logits, ids_tensor({0, 1, 2, 4}, {4}, DType::i32).to(test::kCuda)).item()));
}

// The register-resident softmax backward on many short rows: more row groups than blocks (grid-stride
// iterations) and a last group with rows past the end.
TEST_CASE("softmax and log_softmax backward on CUDA: many short rows", "[gpu][rows][softmax]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = test::random_input({70001, 16}, 970, dt, -3.0, 3.0);
    INFO(dtype_name(dt));
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], -1); }, {x}, dt) == "");
    // log_softmax's backward g - exp(y) sum(g) amplifies a one-ulp difference of the saved bf16 y (the fast
    // exp of the forward may round the other way at a tie): 2^-6 relative at y ~ -3, times sum(g) ~ 16 and
    // exp(y) ~ 0.04 is ~0.01 absolute, so the gradient gets an absolute tolerance of that size in bf16.
    test::Tolerance gtol = row_tol(dt);
    if (dt == DType::bf16) gtol.atol = 0.02;
    CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], -1); }, {x}, row_tol(dt), gtol) == "");
  }
}

TEST_CASE("embedding on CUDA gathers rows and sums the gradients of repeated ids", "[gpu][rows][embedding]") {
  uint64_t seed = 500;
  // ids drawn from 0..9 of a 50-row table: every used id repeats
  const std::vector<int64_t> idv = test::random_input({4 * 33}, 501, DType::i64, 0, 9).to_vector<int64_t>();
  for (DType dt : kDTypes) {
    for (int64_t d : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
      const Tensor w = test::random_input({50, d}, ++seed, dt);
      for (DType idt : {DType::i64, DType::i32}) {
        INFO(dtype_name(dt) << " D " << d << " ids " << dtype_name(idt));
        const Tensor ids = ids_tensor(idv, {4, 33}, idt);
        // the gradient sums up to ~13 rows per id in f32 in a varying order (atomicAdd): not bit-stable
        CHECK(check_op([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }, {w, ids}, dt) == "");
      }
    }
  }
  // a non-contiguous table (the transpose of a (D, V) tensor) and integer tables (bit copies)
  const Tensor wt = test::random_input({7, 50}, 550, DType::f32);
  const Tensor ids = ids_tensor(idv, {4, 33}, DType::i64);
  CHECK(check_op([](const std::vector<Tensor>& in) { return embedding(in[0].transpose(0, 1), in[1]); }, {wt, ids},
                 DType::f32) == "");
  for (DType dt : {DType::i64, DType::u8, DType::b8, DType::f8e4m3}) {
    INFO(dtype_name(dt));
    const Tensor w = test::random_input({50, 5}, 551, dt);
    CHECK(test::compare_bits(embedding(w.to(test::kCuda), ids.to(test::kCuda)), embedding(w, ids)) == "");
  }
}

TEST_CASE("embedding on CUDA rejects out-of-range ids (checked on the device)", "[gpu][rows][embedding]") {
  const Tensor w = test::random_input({10, 4}, 600, DType::f32).to(test::kCuda);
  for (int64_t bad : {10, -1}) {
    const Tensor ids = ids_tensor({1, 2, 3, bad, 4, bad}, {2, 3}, DType::i64).to(test::kCuda);
    CHECK_THROWS_WITH(embedding(w, ids), HasSubstr("id " + std::to_string(bad) +
                                                                   " (at flat position 3) is out of range"));
  }
}

TEST_CASE("max and argmax on CUDA pick the first maximal element, NaN first", "[gpu][rows][max]") {
  uint64_t seed = 700;
  for (DType dt : test::all_dtypes()) {
    for (int64_t len : kLens) {
      // small integers: many ties per row
      const Tensor x = test::random_input({5, len}, ++seed, DType::i32, -3, 3).to(dt);
      for (int64_t dim : {int64_t{0}, int64_t{1}}) {
        INFO(dtype_name(dt) << " len " << len << " dim " << dim);
        const Tensor xc = x.to(test::kCuda);
        test::PoisonGuard poison;
        CHECK(test::compare_bits(argmax(xc, dim), argmax(x, dim)) == "");
        CHECK(test::compare_bits(max(xc, dim, KeepDim::yes), max(x, dim, KeepDim::yes)) == "");
        CHECK(test::compare_bits(argmax(xc.transpose(0, 1), 1 - dim), argmax(x.transpose(0, 1), 1 - dim)) == "");
      }
    }
  }
  // NaN wins over everything and the first NaN is chosen; -inf rows pick their first element
  const double nan = NAN, inf = INFINITY;
  const Tensor x = from_vector(std::vector<double>{1, nan, 3, nan, 2, 5, 5, 1, -inf, -inf, -inf, -inf, inf, 0, inf, 1},
                               {4, 4});
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::f16, DType::f8e5m2}) {
    INFO(dtype_name(dt));
    const Tensor xd = x.to(dt);
    CHECK(test::compare_bits(argmax(xd.to(test::kCuda), 1), argmax(xd, 1)) == "");
    // values as values: a NaN may come back as another NaN code through the f32 compute dtype of fp8
    CHECK(test::compare_to_cpu(max(xd.to(test::kCuda), 1), max(xd, 1)) == "");
    CHECK(argmax(xd.to(test::kCuda), 1).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0, 0});
  }
  // many rows (the grid-stride loop) and the all-element max
  const Tensor many = test::random_input({70001, 3}, 710, DType::i32, -3, 3).to(DType::f32);
  CHECK(test::compare_bits(argmax(many.to(test::kCuda), 1), argmax(many, 1)) == "");
  CHECK(test::compare_bits(max(many.to(test::kCuda)), max(many)) == "");
}

TEST_CASE("max on CUDA: the gradient goes to the first maximal element", "[gpu][rows][max]") {
  for (DType dt : kDTypes) {
    const Tensor x = test::random_input({6, 1000}, 800, DType::i32, -5, 5).to(dt);
    INFO(dtype_name(dt));
    CHECK(check_op([](const std::vector<Tensor>& in) { return max(in[0], 1); }, {x}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return max(in[0], 0, KeepDim::yes); }, {x}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return max(in[0]); }, {x}, dt) == "");
  }
}

// Register-resident row kernels (rows.cu, rows_norm_cached.cu: a row of up to 512 x 8 16-byte packs is held in registers by a
// group of 32..512 threads) and the multi-pass kernels beyond that: long rows (transformer widths 4096, 8192,
// 11008), rows that are not a multiple of a 16-byte pack (unaligned row starts), several rows per block with
// a partial last block, and rows too long for registers (40000 elements in every dtype; 32768 bf16 is the
// largest register-resident row). Forward results against the CPU; one width also through backward.
TEST_CASE("softmax, log_softmax, layer_norm and rms_norm on CUDA: long and odd rows", "[gpu][rows][long]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{301, 4096}, {3, 8192}, {5, 11008}, {7, 4095},
                                                           {129, 2048}, {33, 520},  {2, 40000}, {1, 32768},
                                                           {4, 16385}};
  uint64_t seed = 1200;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const auto& [rows, len] : shapes) {
      const Tensor x = test::random_input({rows, len}, ++seed, dt, -4.0, 4.0);
      const Tensor w = test::random_input({len}, ++seed, DType::f32, 0.5, 1.5);
      const Tensor b = test::random_input({len}, ++seed, DType::f32, -1.0, 1.0);
      const Tensor xc = x.to(test::kCuda), wc = w.to(test::kCuda), bc = b.to(test::kCuda);
      INFO(dtype_name(dt) << " " << rows << " x " << len);
      const test::Tolerance tol = row_tol(dt);
      auto check = [&](const Tensor& actual, const Tensor& expected, const char* what) {
        INFO(what);
        CHECK(test::compare_to_cpu(actual, expected, tol) == "");
      };
      test::PoisonGuard poison;
      check(softmax(xc, 1), softmax(x, 1), "softmax");
      check(log_softmax(xc, -1), log_softmax(x, -1), "log_softmax");
      check(layer_norm(xc, wc, bc), layer_norm(x, w, b), "layer_norm");
      check(layer_norm(xc, Tensor(), Tensor()), layer_norm(x, Tensor(), Tensor()), "layer_norm without affine");
      check(rms_norm(xc, wc), rms_norm(x, w), "rms_norm");
      // a row view that starts one element in: every row start is misaligned for 16-byte packs
      const Tensor xs = slice(x, 1, 1, len, 1), xsc = slice(xc, 1, 1, len, 1);
      check(softmax(xsc, 1), softmax(xs, 1), "softmax of a sliced view");
      check(layer_norm(xsc, Tensor(), Tensor()), layer_norm(xs, Tensor(), Tensor()), "layer_norm of a sliced view");
    }
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = test::random_input({9, 4096}, 1300, dt, -4.0, 4.0);
    const Tensor w = test::random_input({4096}, 1301, dt, 0.5, 1.5);
    const Tensor b = test::random_input({4096}, 1302, dt, -1.0, 1.0);
    INFO(dtype_name(dt) << " backward, rows of 4096");
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {x}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, dt) == "");
  }
}
