// CUDA layer_norm and rms_norm against the CPU reference, forward and backward (parameter gradients included):
// f32, bf16, f16 and f64, with and without affine parameters, row widths that pick each kernel (Note [Norm
// kernels] in cuda/kernels/rows_norm.cu: the staged kernels with the parameters in shared memory below 2048
// elements and in registers / the cluster backward from 2048 up, the register-resident and the multi-pass
// kernels; 1 to 11008 wide), many rows, rows at an offset in their storage, NaN / inf values, element indices
// past 2^31, each kernel's determinism, and poisoned CUDA allocations. Softmax, cross_entropy, embedding and max: test_gpu_rows.cpp.
// Tolerances (row_tol) and check_op: support/row_testing.h.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/row_testing.h"
#include "support/testing.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/kernels/rows.cuh"  // norm_staged_counts, norm_backward_partials
#include "hadatrain/autograd/engine.h"

using namespace ht;
using test::check_op;
using test::row_tol;

namespace {

}  // namespace

TEST_CASE("layer_norm and rms_norm on CUDA match the CPU, with and without affine parameters",
          "[gpu][rows][norm]") {
  uint64_t seed = 400;
  for (DType dt : test::kDTypes) {
    for (int64_t d : test::kLens) {
      const Tensor x = test::random_input({2, 3, d}, ++seed, dt, -2.0, 3.0);
      const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
      const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
      INFO(dtype_name(dt) << " D " << d);
      // D = 1: x - mean is exactly 0 and the x-gradient is 0 in exact arithmetic; rstd = 1/sqrt(eps) ~ 316
      // amplifies the rounding of the row sums, so that case gets an absolute tolerance of 1e-4.
      const test::Tolerance t = d == 1 ? test::Tolerance{row_tol(dt).rtol, 1e-4} : row_tol(dt);
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, t, t) ==
            "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {x}, dt) ==
            "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], Tensor(), 1e-3); }, {x, w},
                     dt) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, dt) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor(), 1e-5); }, {x}, dt) == "");
    }
  }
  // bf16 activations with f32 parameters (mixed precision), and a non-contiguous x (transposed)
  const Tensor xb = test::random_input({6, 1000}, 450, DType::bf16);
  const Tensor wf = test::random_input({1000}, 451, DType::f32, 0.5, 1.5);
  const Tensor bf = test::random_input({1000}, 452, DType::f32);
  CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {xb, wf, bf},
                 DType::bf16) == "");
  CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {xb, wf}, DType::bf16) == "");
  const Tensor xt = test::random_input({1000, 6}, 453, DType::f32);
  CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0].transpose(0, 1), in[1], in[2]); },
                 {xt, wf, bf}, DType::f32) == "");
  CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0].transpose(0, 1), in[1]); }, {xt, wf},
                 DType::f32) == "");
}

TEST_CASE("layer_norm and rms_norm backward on CUDA: many rows (split column sums), parameter-only gradients",
          "[gpu][rows][norm]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    // (16643, 384): the register-resident backward with fused parameter sums, several row groups per block,
    // several iterations per block and a last group with rows past the end
    for (const Shape& shape : {Shape{3001, 7}, Shape{700, 1000}, Shape{257, 4097}, Shape{16643, 384}}) {
      const int64_t d = shape[1];
      const Tensor x = test::random_input(shape, 900 + d, dt, -2.0, 3.0);
      const Tensor w = test::random_input({d}, 901 + d, dt, 0.5, 1.5);
      const Tensor b = test::random_input({d}, 902 + d, dt, -1.0, 1.0);
      INFO(dtype_name(dt) << " " << to_string(shape));
      // the parameter gradients sum thousands of rows: f32 accumulation against the CPU's double
      const test::Tolerance tol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                     row_tol(dt), tol) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, row_tol(dt), tol) ==
            "");
      // x as a constant: only the parameters need gradients
      CHECK(check_op([&](const std::vector<Tensor>& in) { return layer_norm(x.to(in[0].device()), in[0], in[1]); },
                     {w, b}, row_tol(dt), tol) == "");
      CHECK(check_op([&](const std::vector<Tensor>& in) { return rms_norm(x.to(in[0].device()), in[0]); }, {w},
                     row_tol(dt), tol) == "");
    }
  }
}

// The norm backward's one-wave grid (blocks walk several row groups, loading the next group before reducing
// the current one) and the one-launch parameter-gradient sum that stores gw / gb in the parameters' own
// dtypes: ViT-like widths with few rows (fewer groups than blocks), many rows (many groups per block, a
// partial last group), f16, parameters of two different dtypes, and the non-fused column-sum path (odd D).
TEST_CASE("layer_norm and rms_norm backward on CUDA: prefetching grid, parameter gradients in their dtypes",
          "[gpu][rows][norm]") {
  uint64_t seed = 5000;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (const Shape& shape : {Shape{3, 384}, Shape{9, 768}, Shape{5003, 768}, Shape{20001, 384}, Shape{1001, 385}}) {
      const int64_t d = shape[1];
      const Tensor x = test::random_input(shape, ++seed, dt, -2.0, 3.0);
      const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
      const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
      INFO(dtype_name(dt) << " " << to_string(shape));
      const test::Tolerance tol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                     row_tol(dt), tol) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, row_tol(dt), tol) ==
            "");
      // only the bias needs a gradient (weight a constant)
      CHECK(check_op([&](const std::vector<Tensor>& in) { return layer_norm(in[0], w.to(in[0].device()), in[1]); },
                     {x, b}, row_tol(dt), tol) == "");
    }
  }
  // bf16 activations, f32 weight and bf16 bias: gw and gb stored in different dtypes by one launch
  const Tensor x = test::random_input({4099, 384}, 5100, DType::bf16, -2.0, 3.0);
  const Tensor w = test::random_input({384}, 5101, DType::f32, 0.5, 1.5);
  const Tensor b = test::random_input({384}, 5102, DType::bf16, -1.0, 1.0);
  CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                 row_tol(DType::bf16), row_tol(DType::bf16)) == "");
  // bf16 parameters read as they are by the kernels: here views that start one element in (contiguous but
  // not 16-byte aligned, so the multi-pass kernels read them element by element)
  {
    const Tensor wl = test::random_input({385}, 5106, DType::bf16, 0.5, 1.5);
    const Tensor bl = test::random_input({385}, 5107, DType::bf16, -1.0, 1.0);
    CHECK(check_op([](const std::vector<Tensor>& in) {
            return layer_norm(in[0], slice(in[1], 0, 1, 385, 1), slice(in[2], 0, 1, 385, 1));
          }, {x, wl, bl}, row_tol(DType::bf16), row_tol(DType::bf16)) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], slice(in[1], 0, 1, 385, 1)); }, {x, wl},
                   row_tol(DType::bf16), row_tol(DType::bf16)) == "");
  }
  // f64: double partial sums and outputs
  const Tensor xd = test::random_input({2049, 768}, 5103, DType::f64, -2.0, 3.0);
  const Tensor wd = test::random_input({768}, 5104, DType::f64, 0.5, 1.5);
  const Tensor bd = test::random_input({768}, 5105, DType::f64, -1.0, 1.0);
  CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {xd, wd, bd},
                 DType::f64) == "");
}

// The norm kernels (Note [Staged norm kernels] in cuda/kernels/rows_staged.cuh) on the row shapes that pick their
// geometry: threads per row 1..256 with 1..4 packs per thread (bf16 D = 8, 16, 64, 72, 384, 520, 768, 1024,
// 4096, 8192; f32 / f64 likewise with their packs), several stages of row groups per block, rows past the end
// in the last group; widths that are not a multiple of a pack (1004 bf16, 4095, 385) or too long for the
// staged kernels (11008 bf16) fall back. Forward with and without parameters, rms_norm, and the backward with
// the parameter gradients; rows with a large common offset (the bf16 / f16 statistics are sums shifted by
// the row's first element) and with a far outlier in the first element (f32 / f64: two-pass statistics).
TEST_CASE("layer_norm and rms_norm on CUDA: staged and fallback kernels, every row geometry", "[gpu][rows][norm]") {
  uint64_t seed = 7000;
  const std::vector<Shape> shapes = {{1037, 8},   {513, 16},   {301, 64},   {77, 72},  {2003, 384}, {1001, 385},
                                     {257, 520},  {1031, 768}, {129, 1004}, {65, 1024}, {33, 4095}, {41, 4096},
                                     {9, 8192},   {3, 11008}};
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    for (const Shape& shape : shapes) {
      const int64_t d = shape[1];
      const Tensor x = test::random_input(shape, ++seed, dt, -4.0, 4.0);
      const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
      const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
      const Tensor wf = test::random_input({d}, ++seed, DType::f32, 0.5, 1.5);
      const Tensor bf = test::random_input({d}, ++seed, DType::f32, -1.0, 1.0);
      const Tensor xc = x.to(test::kCuda);
      INFO(dtype_name(dt) << " " << to_string(shape));
      const test::Tolerance tol = row_tol(dt);
      auto check = [&](const Tensor& actual, const Tensor& expected, const char* what) {
        INFO(what);
        CHECK(test::compare_to_cpu(actual, expected, tol) == "");
      };
      {
        test::PoisonGuard poison;
        check(layer_norm(xc, w.to(test::kCuda), b.to(test::kCuda)), layer_norm(x, w, b), "layer_norm");
        check(layer_norm(xc, wf.to(test::kCuda), bf.to(test::kCuda)), layer_norm(x, wf, bf), "layer_norm, f32 parameters");
        check(layer_norm(xc, Tensor(), Tensor()), layer_norm(x, Tensor(), Tensor()), "layer_norm without affine");
        check(layer_norm(xc, w.to(test::kCuda), Tensor()), layer_norm(x, w, Tensor()), "layer_norm, weight only");
        check(rms_norm(xc, w.to(test::kCuda)), rms_norm(x, w), "rms_norm");
        check(rms_norm(xc, Tensor()), rms_norm(x, Tensor()), "rms_norm without weight");
      }
      if (shape[0] * d > 2'000'000) continue;  // the backward on the smaller shapes
      const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : tol;
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, tol,
                     gtol) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), in[1]); }, {x, b}, tol,
                     gtol) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, tol, gtol) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor()); }, {x}, tol, gtol) == "");
    }
    // a large common offset in every row, packable (768: staged or register-resident kernels) and not (767:
    // the multi-pass kernels). The weight gradient sums g * xhat over the 300 rows, so a bias in the row means
    // adds up: a plain float sum of f16 values near 100 gave means off by up to 5e-6 and weight gradients off
    // by up to 1.5e-3 (23 of 768 columns over the tolerance); every bf16 / f16 kernel sums x minus the row's
    // first element (Note [Shifted row mean] in cuda/kernels/rows_common.cuh).
    for (const int64_t d : {int64_t{768}, int64_t{767}}) {
      // (100 for bf16 / f16; 10 for f32 / f64, whose kernels sum x itself: the float mean of values near 100
      // would carry more rounding than the f32 tolerance)
      const double offset = dt == DType::bf16 || dt == DType::f16 ? 100.0 : 10.0;
      const Tensor x = add(test::random_input({300, d}, ++seed, DType::f64, -1.0, 1.0), offset).to(dt);
      const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
      const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
      INFO(dtype_name(dt) << " offset rows, D " << d);
      CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                     row_tol(dt), dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt)) == "");
    }
    // an outlier as the first element of every row
    {
      std::vector<double> v = test::random_input({50, 4096}, ++seed, DType::f64, -1.0, 1.0).to_vector<double>();
      for (int64_t r = 0; r < 50; ++r) v[static_cast<std::size_t>(r * 4096)] = dt == DType::f16 ? 300.0 : 1000.0;
      const Tensor x = from_vector(v, {50, 4096}).to(dt);
      INFO(dtype_name(dt) << " outlier first");
      CHECK(test::compare_to_cpu(layer_norm(x.to(test::kCuda), Tensor(), Tensor()), layer_norm(x, Tensor(), Tensor()),
                                 row_tol(dt)) == "");
    }
  }
  // NaN / inf in x and in the parameters (rows and columns of NaN results, pack_cast's check), both parameter
  // dtypes
  const double inf = INFINITY, nan = NAN;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (DType pdt : {dt, DType::f32}) {
      Tensor x = test::random_input({9, 768}, ++seed, dt, -2.0, 2.0);
      std::vector<double> xv = x.to_vector<double>();
      xv[3 * 768 + 17] = nan;  // row 3: NaN everywhere
      xv[5 * 768 + 700] = inf;  // row 5: NaN everywhere (inf - mean)
      x = from_vector(xv, {9, 768}).to(dt);
      std::vector<double> wv = test::random_input({768}, ++seed, DType::f64, 0.5, 1.5).to_vector<double>();
      std::vector<double> bv = test::random_input({768}, ++seed, DType::f64, -1.0, 1.0).to_vector<double>();
      wv[3] = nan;
      bv[700] = inf;
      wv[701] = inf;
      const Tensor w = from_vector(wv, {768}).to(pdt), b = from_vector(bv, {768}).to(pdt);
      INFO(dtype_name(dt) << " x, " << dtype_name(pdt) << " parameters, NaN / inf");
      CHECK(test::compare_to_cpu(layer_norm(x.to(test::kCuda), w.to(test::kCuda), b.to(test::kCuda)),
                                 layer_norm(x, w, b), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(rms_norm(x.to(test::kCuda), w.to(test::kCuda)), rms_norm(x, w), row_tol(dt)) == "");
    }
  }
}

// Packable rows run the staged kernels (no silent fallback, e.g. a failed shared-memory, occupancy or cluster
// query), below 2048 elements and from 2048 up (parameters in registers, the cluster backward); unpackable
// rows fall back.
TEST_CASE("layer_norm on CUDA: packable rows launch the staged kernels", "[gpu][rows][norm]") {
  for (const int64_t d : {int64_t{768}, int64_t{4096}}) {
    INFO("D " << d);
    const Tensor x = test::random_input({1000, d}, 7600, DType::bf16, -2.0, 3.0);
    const Tensor w = test::random_input({d}, 7601, DType::bf16, 0.5, 1.5);
    const Tensor b = test::random_input({d}, 7602, DType::bf16, -1.0, 1.0);
    const Tensor xo = test::random_input({1000, d - 1}, 7603, DType::bf16, -2.0, 3.0);  // not a multiple of a pack
    const kernels::NormStagedCounts before = kernels::norm_staged_counts();
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                   DType::bf16) == "");
    const kernels::NormStagedCounts mid = kernels::norm_staged_counts();
    CHECK(mid.forward - before.forward == 1);
    CHECK(mid.backward - before.backward == 1);
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {xo},
                   DType::bf16) == "");
    const kernels::NormStagedCounts after = kernels::norm_staged_counts();
    CHECK(after.forward == mid.forward);
    CHECK(after.backward == mid.backward);
  }
}

// Every staged kernel is deterministic: two runs give the same bits, parameter gradients included (384 wide:
// parameters in shared memory and one partial row per block; 4096 wide: parameters in registers and the
// cluster backward).
TEST_CASE("layer_norm on CUDA: the norm kernels are deterministic", "[gpu][rows][norm]") {
  for (const int64_t d : {int64_t{384}, int64_t{4096}}) {
    INFO("D " << d);
    const int64_t rows = d == 384 ? 20001 : 2003;
    const Tensor x0 = test::random_input({rows, d}, 7500, DType::bf16, -2.0, 3.0).to(test::kCuda);
    const Tensor w0 = test::random_input({d}, 7501, DType::bf16, 0.5, 1.5).to(test::kCuda);
    const Tensor b0 = test::random_input({d}, 7502, DType::bf16, -1.0, 1.0).to(test::kCuda);
    const Tensor g = test::random_input({rows, d}, 7503, DType::bf16, -1.0, 1.0).to(test::kCuda);
    auto run = [&] {
      Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
      x.set_requires_grad(true);
      w.set_requires_grad(true);
      b.set_requires_grad(true);
      Tensor y = layer_norm(x, w, b);
      y.backward(g);
      return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
    };
    const std::vector<Tensor> a = run(), c = run();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("result " << i << " (y, x's gradient, weight's, bias's)");
      CHECK(test::compare_bits(a[i], c[i].to(Device::cpu())) == "");
    }
  }
}

// The cluster backward (Note [Norm backward, clusters] in cuda/kernels/rows_norm.cu) of rows of at least 2048
// elements, on row groups of more than a warp (its named barriers per row group: 64, 128 and 256 threads per
// row) and of less (its shuffled row statistics), and the block backward below 2048 elements: forward, x
// gradient and parameter gradients against the CPU reference; on the 16384 x 4096 bf16 rows of the benchmark
// it writes one partial row per cluster (at most a quarter of a wave of blocks).
TEST_CASE("layer_norm and rms_norm on CUDA: the cluster backward and the block backward", "[gpu][rows][norm]") {
  uint64_t seed = 7900;
  const std::vector<std::pair<DType, Shape>> cases = {
      {DType::bf16, {2003, 4096}}, {DType::bf16, {1001, 8192}}, {DType::bf16, {3001, 2048}}, {DType::f16, {777, 4096}},
      {DType::bf16, {5003, 768}},  {DType::f32, {1003, 1024}},  {DType::f32, {501, 4096}},   {DType::f64, {301, 2048}},
      {DType::bf16, {3, 4096}}};
  for (const auto& [dt, shape] : cases) {
    const int64_t d = shape[1];
    const Tensor x = test::random_input(shape, ++seed, dt, -3.0, 3.0);
    const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
    const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
    const Tensor gy = test::random_input(shape, ++seed, dt, -1.0, 1.0);
    INFO(dtype_name(dt) << " " << to_string(shape));
    for (const bool rms : {false, true}) {
      INFO((rms ? "rms_norm" : "layer_norm"));
      auto run = [&](Device dv) {
        std::vector<Tensor> in = {x.to(dv).detach(), w.to(dv).detach(), b.to(dv).detach()};
        for (Tensor& t : in) t.set_requires_grad(true);
        const Tensor y = rms ? rms_norm(in[0], in[1]) : layer_norm(in[0], in[1], in[2]);
        y.backward(gy.to(dv));
        return std::vector<Tensor>{y.detach(), in[0].grad(), in[1].grad(), rms ? Tensor() : in[2].grad()};
      };
      std::vector<Tensor> got;
      {
        test::PoisonGuard poison;
        got = run(test::kCuda);
      }
      const std::vector<Tensor> cpu = run(Device::cpu());
      const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        if (!cpu[i].defined()) continue;
        INFO("result " << i << " (y, x's gradient, weight's, bias's)");
        CHECK(test::compare_to_cpu(got[i], cpu[i], i == 0 ? row_tol(dt) : gtol) == "");
      }
    }
  }
  // the partial rows of the benchmark's shape (only the pointers' alignment is looked at: small buffers): one per
  // cluster of 2 or 4 blocks of a wave of two blocks per SM; a failed cluster occupancy query would leave one
  // per block
  const Tensor buf = zeros({64}, {DType::bf16, test::kCuda});
  const Tensor stat = zeros({64}, {DType::f32, test::kCuda});
  kernels::NormBackwardArgs ba{DType::bf16, kernels::NormKind::layer, buf.data_ptr(), buf.data_ptr(), buf.data_ptr(),
                               stat.data_ptr(), stat.data_ptr(), buf.data_ptr(), 16384, 4096};
  ba.weight_narrow = true;
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  const int parts = kernels::norm_backward_partials(ba);
  INFO("partial rows " << parts << ", SMs " << sms);
  CHECK(parts > 0);
  CHECK(parts <= sms);  // at most 2 blocks per SM, clusters of at least 2
}

// A residual stream: loss = sum(r * (norm(x) + 2x)). The 2x branch's gradient reaches x first and the norm's
// backward kernel adds g_x into it (Note [Gradients accumulated in place]): every kernel family (the cluster and
// block staged kernels, register-resident rows, the multi-pass rows of unpackable lengths), against the CPU,
// where the engine adds the two.
TEST_CASE("layer_norm and rms_norm backward on CUDA add g_x into the residual stream's gradient",
          "[gpu][rows][norm]") {
  uint64_t seed = 8300;
  const std::vector<std::pair<DType, Shape>> cases = {
      {DType::bf16, {2003, 4096}}, {DType::bf16, {5003, 768}}, {DType::bf16, {1001, 385}}, {DType::bf16, {257, 520}},
      {DType::f16, {129, 1004}},   {DType::f32, {1003, 1024}}, {DType::f32, {33, 4095}},   {DType::f64, {301, 2048}},
      {DType::bf16, {9, 8192}}};
  for (const auto& [dt, shape] : cases) {
    const int64_t d = shape[1];
    const Tensor x = test::random_input(shape, ++seed, dt, -3.0, 3.0);
    const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
    const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
    const Tensor r = test::random_input(shape, ++seed, dt, -1.0, 1.0);
    INFO(dtype_name(dt) << " " << to_string(shape));
    for (const bool rms : {false, true}) {
      INFO((rms ? "rms_norm" : "layer_norm"));
      auto run = [&](Device dv) {
        Tensor xi = x.to(dv).detach();
        xi.set_requires_grad(true);
        const Tensor wd = w.to(dv), bd = b.to(dv);
        const Tensor y = rms ? rms_norm(xi, wd) : layer_norm(xi, wd, bd);
        sum(mul(add(y, mul(xi, 2.0)), r.to(dv))).backward();
        return xi.grad();
      };
      const int64_t before = grads_accumulated_in_place();
      Tensor got;
      {
        test::PoisonGuard poison;
        got = run(test::kCuda);
      }
      CHECK(grads_accumulated_in_place() - before == 1);
      const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
      CHECK(test::compare_to_cpu(got, run(Device::cpu()), gtol) == "");
    }
  }
}

// Rows that start at an offset in their storage: 16-byte aligned (the staged kernels) and not (one element
// further: the multi-pass kernels), forward and backward with parameter gradients, every dtype.
TEST_CASE("layer_norm and rms_norm on CUDA: rows at an offset in their storage", "[gpu][rows][norm]") {
  uint64_t seed = 7700;
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    for (const int64_t d : {int64_t{384}, int64_t{768}, int64_t{4096}}) {
      const int64_t rows = 37;
      for (const int64_t at : {int64_t{5} * d, int64_t{5} * d + 1}) {
        // the rows are elements [at, at + rows d) of a larger flat tensor (a view with a storage offset)
        const Tensor flat = test::random_input({at + rows * d + 3}, ++seed, dt, -3.0, 3.0);
        const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
        const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
        INFO(dtype_name(dt) << " D " << d << ", offset " << at);
        const Tensor gy = test::random_input({rows, d}, ++seed, dt, -1.0, 1.0);
        const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
        // the same graph on both devices: leaves flat, w, b; y = layer_norm(flat[at : at + rows d] as (rows, d))
        auto run = [&](Device dv, bool rms) {
          std::vector<Tensor> in = {flat.to(dv).detach(), w.to(dv).detach(), b.to(dv).detach()};
          for (Tensor& t : in) t.set_requires_grad(true);
          const Tensor x = in[0].narrow(0, at, rows * d).view({rows, d});
          const Tensor y = rms ? rms_norm(x, in[1]) : layer_norm(x, in[1], in[2]);
          y.backward(gy.to(dv));
          return std::vector<Tensor>{y.detach(), in[0].grad(), in[1].grad(), rms ? Tensor() : in[2].grad()};
        };
        for (const bool rms : {false, true}) {
          INFO((rms ? "rms_norm" : "layer_norm"));
          const std::vector<Tensor> cpu = run(Device::cpu(), rms);
          std::vector<Tensor> gpu;
          {
            test::PoisonGuard poison;
            gpu = run(test::kCuda, rms);
          }
          for (std::size_t i = 0; i < cpu.size(); ++i) {
            if (!cpu[i].defined()) continue;
            INFO("result " << i << " (y, flat's gradient, weight's, bias's)");
            CHECK(test::compare_to_cpu(gpu[i], cpu[i], i == 0 ? row_tol(dt) : gtol) == "");
          }
        }
      }
    }
  }
}

// Element indices past 2^31: 2^31 / D + 5 rows (bf16, D 768: the staged kernels with a warp per row; 4096: a
// block-wide reduction per row). All rows but the last five are zero (var 0, results = bias; their g is zero),
// so the last five rows, the x gradient there and the parameter gradients match the CPU reference of those
// five rows alone. About 17 GB of device memory.
TEST_CASE("layer_norm on CUDA: element indices past 2^31", "[gpu][rows][norm]") {
  for (const int64_t d : {int64_t{768}, int64_t{4096}}) {
    const int64_t rows = (int64_t{1} << 31) / d + 5, tail = 5;
    const Tensor xt = test::random_input({tail, d}, 7800 + d, DType::bf16, -2.0, 3.0);
    const Tensor gt = test::random_input({tail, d}, 7801 + d, DType::bf16, -1.0, 1.0);
    const Tensor w = test::random_input({d}, 7802 + d, DType::bf16, 0.5, 1.5);
    const Tensor b = test::random_input({d}, 7803 + d, DType::bf16, -1.0, 1.0);
    // the CPU reference of the last rows
    Tensor xr = xt.detach(), wr = w.detach(), br = b.detach();
    for (Tensor* t : {&xr, &wr, &br}) t->set_requires_grad(true);
    const Tensor yr = layer_norm(xr, wr, br);
    yr.backward(gt);
    INFO("D " << d << ", rows " << rows);
    Tensor x = zeros({rows, d}, {DType::bf16, test::kCuda});
    copy_(x.narrow(0, rows - tail, tail), xt.to(test::kCuda));
    const Tensor g = zeros({rows, d}, {DType::bf16, test::kCuda});
    copy_(g.narrow(0, rows - tail, tail), gt.to(test::kCuda));
    Tensor wc = w.to(test::kCuda).detach(), bc = b.to(test::kCuda).detach();
    for (Tensor* t : {&x, &wc, &bc}) t->set_requires_grad(true);
    const Tensor y = layer_norm(x, wc, bc);
    y.backward(g);
    const test::Tolerance tol = row_tol(DType::bf16);
    CHECK(test::compare_to_cpu(y.detach().narrow(0, rows - tail, tail).contiguous(), yr.detach(), tol) == "");
    CHECK(test::compare_to_cpu(x.grad().narrow(0, rows - tail, tail).contiguous(), xr.grad(), tol) == "");
    CHECK(test::compare_to_cpu(wc.grad(), wr.grad(), tol) == "");
    CHECK(test::compare_to_cpu(bc.grad(), br.grad(), tol) == "");
    // a zero row: var 0, so y = bias there
    CHECK(test::compare_to_cpu(y.detach().narrow(0, 0, 1).view({d}).contiguous(), b, tol) == "");
  }
}
