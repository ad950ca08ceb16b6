// Batch norm on CUDA on large inputs of both kernel layouts (cuda/kernels/batchnorm*.cu): (M, C) matrices with the
// channel fastest (the channels-last case: an NHWC activation viewed as (N*H*W, C)) and (N, C, H, W) with
// many blocks per channel, vectorized and scalar (odd C or S, an unaligned start) kernels, train and eval,
// forward, every gradient and the running statistics, against the CPU in f64 on the same values; the fused
// batch norm + ReLU against the CUDA composition and the CPU; C > 4096 channels first (no ticket slot: the
// separate finalize kernels, Note [Batch-norm kernels]); repeated launches give bit-identical results. The
// channels-last cases reach both reduction kernels (cuda/kernels/batchnorm.cuh): the split kernels below 128
// channels, the two-level ticket kernels from 128 channels up; the launch counter checks which ran.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <algorithm>
#include <cmath>

#include "cuda/kernels/batchnorm.cuh"  // bn_cl_ticket_launches

using namespace ht;

namespace {

// The channels-last reductions take the ticket kernels from this many channels up (cuda/kernels/batchnorm.cuh),
// the split kernels below.
constexpr int64_t kClTicketsMinC = 128;

// Runs f (one batch norm, forward and backward, on (M, C) channels last) and checks that it did not take the
// ticket kernels when C is below kClTicketsMinC. Those from kClTicketsMinC up are checked in bulk by the
// callers (a ticket slot can be missing, and then the split kernels run).
template <class F>
void check_cl_kernels(int64_t C, F&& f) {
  const int64_t tickets0 = kernels::bn_cl_ticket_launches();
  f();
  if (C < kClTicketsMinC) CHECK(kernels::bn_cl_ticket_launches() == tickets0);
}

struct BnRun {
  Tensor y, gx, gw, gb, rm, rv;
};

// The fused op on CUDA against the composition and the CPU (defined with the fused tests below).
void check_fused(const Shape& xshape, DType dt, BatchNormMode mode, uint64_t seed, bool with_residual);

// batch_norm of x (a view made by `view` of the leaf) with affine weight / bias and running stats, then the
// backward of sum(y * r); every tensor on `dev` in dtype dt (running stats f32).
template <class View>
BnRun run_bn(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& r0, const Tensor& rm0,
             const Tensor& rv0, const BatchNormOptions& opts, Device dev, DType dt, View view) {
  Tensor x = x0.to(dt).to(dev).detach(), w = w0.to(dt).to(dev).detach(), b = b0.to(dt).to(dev).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  BnRun out;
  out.rm = rm0.to(dev).clone();
  out.rv = rv0.to(dev).clone();
  out.y = batch_norm(view(x), w, b, out.rm, out.rv, opts);
  sum(mul(out.y, r0.to(dt).to(dev))).backward();
  out.gx = x.grad();
  out.gw = w.grad();
  out.gb = b.grad();
  return out;
}

// CUDA in dt against the CPU in f64 on the dt-rounded values.
template <class View>
void check_bn(const Shape& xshape, int64_t C, DType dt, BatchNormMode mode, uint64_t seed, View view) {
  const Tensor x = test::random_input(xshape, seed, dt, -1, 4).to(DType::f64);  // mean far from 0
  const Tensor w = test::random_input({C}, seed + 1, dt, 0.5, 1.5).to(DType::f64);
  const Tensor b = test::random_input({C}, seed + 2, dt, -1, 1).to(DType::f64);
  const Tensor rm = test::random_input({C}, seed + 3, DType::f32, -0.5, 0.5);
  const Tensor rv = test::random_input({C}, seed + 4, DType::f32, 0.5, 1.5);
  BatchNormOptions opts;
  opts.mode = mode;
  opts.momentum = 0.3;
  const Tensor r = test::random_input(view(x).shape(), seed + 5, dt, 0.5, 1.5).to(DType::f64);
  const BnRun ref = run_bn(x, w, b, r, rm, rv, opts, Device::cpu(), DType::f64, view);
  BnRun got;
  {
    test::PoisonGuard poison;
    got = run_bn(x, w, b, r, rm, rv, opts, test::kCuda, dt, view);
  }
  const double tol = dt == DType::f64 ? 1e-12 : (dt == DType::f32 ? 2e-6 : 5e-3);
  // f32 accumulates per thread in f32 (as PyTorch does) before the double partials: over 65536 rows with
  // the cancellation in sum(g x_hat) that leaves a few 1e-5 relative.
  const double gtol = dt == DType::f64 ? 1e-11 : (dt == DType::f32 ? 1e-4 : 1e-2);
  CHECK(test::rel_error(got.y, ref.y) <= tol);
  CHECK(test::rel_error(got.gx, ref.gx) <= gtol);
  CHECK(test::rel_error(got.gw, ref.gw) <= gtol);
  CHECK(test::rel_error(got.gb, ref.gb) <= gtol);
  // The running stats: f32 on both sides, updated from the batch statistics of the same values.
  CHECK(test::compare_to_cpu(got.rm, ref.rm, {1e-5, 1e-6}) == "");
  CHECK(test::compare_to_cpu(got.rv, ref.rv, {1e-5, 1e-6}) == "");
}

}  // namespace

TEST_CASE("batch_norm on a large (M, C) input (channels last) matches the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 7000;
  auto same = [](const Tensor& t) { return t; };
  const int64_t tickets0 = kernels::bn_cl_ticket_launches();
  for (DType dt : {DType::bf16, DType::f32, DType::f64})
    for (int64_t C : {64, 128, 18})  // 18: not a multiple of the bf16 or f32 pack (scalar kernels)
      for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
        INFO(dtype_name(dt) << " C " << C << (mode == BatchNormMode::train ? " train" : " eval"));
        check_cl_kernels(C, [&] { check_bn({256 * 16 * 16, C}, C, dt, mode, seed += 10, same); });
      }
  CHECK(kernels::bn_cl_ticket_launches() > tickets0);  // C 128 took the ticket kernels
}

TEST_CASE("batch_norm on (M, C) starting one element in (unaligned) and on a few rows", "[gpu][batch_norm]") {
  uint64_t seed = 7500;
  // Dense (4099, C) views starting at element 1 of their storage: contiguous but not 16-byte aligned; C 64
  // takes the split kernels, C 136 the ticket kernels.
  constexpr int64_t M = 4099;
  auto same = [](const Tensor& t) { return t; };
  const int64_t tickets0 = kernels::bn_cl_ticket_launches();
  for (const int64_t C : {int64_t{64}, int64_t{136}}) {
    auto skip_one = [=](const Tensor& t) { return reshape(slice(t, 0, 1, M * C + 1, 1), {M, C}); };
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(dtype_name(dt) << " C " << C << " unaligned");
      check_cl_kernels(C, [&] { check_bn({M * C + 1}, C, dt, BatchNormMode::train, seed += 10, skip_one); });
    }
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(dtype_name(dt) << " C " << C << " 3 rows");
      check_cl_kernels(C, [&] { check_bn({3, C}, C, dt, BatchNormMode::train, seed += 10, same); });
    }
  }
  CHECK(kernels::bn_cl_ticket_launches() > tickets0);
}

// Both channels-last reduction kernels on block shapes other than the bench's: the split kernels with one pack
// column a block (C = 8 bf16: 32 rows a warp, added by shuffles), 3 and 18 columns (no shuffles), 2 rows; the
// ticket kernels (cuda/kernels/batchnorm_cl2.cu, Note [Batch-norm channels-last tickets]) on 17 bf16 packs
// (C 136), a C not a multiple of the pack (130, scalar), C = 4104 bf16 (513 packs: 3 blocks across C, the last
// with one pack), odd M with one or many ticket groups, 2 rows; plain, fused relu and relu + residual, train
// and eval.
TEST_CASE("batch_norm channels-last reductions on odd shapes match the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 7700;
  auto same = [](const Tensor& t) { return t; };
  const std::vector<Shape> shapes = {{50001, 8},   {3001, 24},  {20011, 18}, {2, 64},
                                     {50001, 136}, {3001, 130}, {777, 4104}, {2, 128}};
  const int64_t tickets0 = kernels::bn_cl_ticket_launches();
  for (DType dt : {DType::bf16, DType::f32})
    for (const Shape& s : shapes)
      for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
        INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval"));
        check_cl_kernels(s[1], [&] { check_bn(s, s[1], dt, mode, seed += 10, same); });
        if (s[0] < 100) continue;  // the fused checks want both signs in bulk
        for (bool res : {false, true}) {
          INFO((res ? "fused relu + residual" : "fused relu"));
          check_cl_kernels(s[1], [&] { check_fused(s, dt, mode, seed += 10, res); });
        }
      }
  CHECK(kernels::bn_cl_ticket_launches() > tickets0);
}

TEST_CASE("batch_norm on large (N, C, H, W) inputs matches the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 8000;
  auto same = [](const Tensor& t) { return t; };
  const std::vector<Shape> shapes = {{64, 16, 16, 16},   // S = 256: 16-byte packs, several blocks per channel
                                     {48, 8, 7, 7},      // S = 49: scalar kernels
                                     {40, 5, 9, 13},     // odd C and S (117): scalar kernels, several splits
                                     {64, 32, 16, 16},   // S = 256: 16-byte packs
                                     {48, 48, 7, 9},     // S = 63: scalar kernels
                                     {41, 51, 9, 13},    // odd N, C and S (117)
                                     {128, 96, 8, 8},    // S = 64: 16-byte packs, many channels
                                     {32, 64, 13, 11}};  // S = 143: scalar kernels
  auto nhwc = [](const Tensor& t) { return t.permute({0, 3, 1, 2}); };
  for (DType dt : {DType::bf16, DType::f32, DType::f64})
    for (const Shape& s : shapes)
      for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
        INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval"));
        check_bn(s, s[1], dt, mode, seed += 10, same);
      }
  // A channels-last tensor (N, H, W, C) viewed as (N, C, H, W).
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt) << " NHWC view");
    check_bn({32, 8, 8, 32}, 32, dt, BatchNormMode::train, seed += 10, nhwc);
  }
}

// ---- fused batch norm + ReLU ------------------------------------------------------------------------------
// On CUDA in dt: the fused op (BatchNormActivation::relu; batch_norm_add_relu with a residual) against the
// composition batch_norm -> relu (relu(batch_norm + residual)) on CUDA
// (same kernels: the forward is bit-identical, the gradients agree to rounding) and against the CPU in f64
// on the same values, the CPU's gradient taken through the CUDA output's mask (y > 0): that is relu's
// derivative wherever the two agree on the sign, and keeps the comparison meaningful for the few values
// within rounding of zero, whose sign may differ between the two.

namespace {

struct FusedRun {
  Tensor y, gx, gw, gb, gr, rm, rv;
};

enum class BnFusion { fused, composed };

// relu(batch_norm(x) [+ res]) on dev in dt (running stats f32), then the backward of sum(y * r * extra) where
// extra is a constant mask (or undefined); with extra the relu is left out (its derivative is the mask).
FusedRun run_fused(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& r0, const Tensor& rm0,
                   const Tensor& rv0, BatchNormOptions opts, BnFusion fusion, Device dev, DType dt,
                   const Tensor& extra, const Tensor& res0) {
  Tensor x = x0.to(dt).to(dev).detach(), w = w0.to(dt).to(dev).detach(), b = b0.to(dt).to(dev).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor res;
  if (res0.defined()) {
    res = res0.to(dt).to(dev).detach();
    res.set_requires_grad(true);
  }
  FusedRun out;
  out.rm = rm0.to(dev).clone();
  out.rv = rv0.to(dev).clone();
  opts.activation = fusion == BnFusion::fused ? BatchNormActivation::relu : BatchNormActivation::none;
  Tensor y;
  if (fusion == BnFusion::fused && res.defined()) {
    y = batch_norm_add_relu(x, res, {w, b, out.rm, out.rv}, opts);
  } else {
    y = batch_norm(x, w, b, out.rm, out.rv, opts);
    if (fusion == BnFusion::composed && res.defined()) y = add(y, res);
    if (fusion == BnFusion::composed && !extra.defined()) y = relu(y);
  }
  out.y = y;
  Tensor r = r0.to(dt).to(dev);
  if (extra.defined()) r = mul(r, extra.to(dt).to(dev));
  sum(mul(y, r)).backward();
  out.gx = x.grad();
  out.gw = w.grad();
  out.gb = b.grad();
  if (res.defined()) out.gr = res.grad();
  return out;
}

void check_fused(const Shape& xshape, DType dt, BatchNormMode mode, uint64_t seed, bool with_residual) {
  const int64_t C = xshape[1];
  const Tensor x = test::random_input(xshape, seed, dt, -1, 4).to(DType::f64);
  const Tensor w = test::random_input({C}, seed + 1, dt, 0.5, 1.5).to(DType::f64);
  const Tensor b = test::random_input({C}, seed + 2, dt, -1, 1).to(DType::f64);
  const Tensor rm = test::random_input({C}, seed + 3, DType::f32, 1.0, 2.0);  // eval: about half negative
  const Tensor rv = test::random_input({C}, seed + 4, DType::f32, 0.5, 1.5);
  const Tensor r = test::random_input(xshape, seed + 5, dt, -1.5, 1.5).to(DType::f64);
  const Tensor res = with_residual ? test::random_input(xshape, seed + 6, dt, -1, 1).to(DType::f64) : Tensor();
  BatchNormOptions opts;
  opts.mode = mode;
  opts.momentum = 0.3;
  FusedRun got;
  {
    test::PoisonGuard poison;
    got = run_fused(x, w, b, r, rm, rv, opts, BnFusion::fused, test::kCuda, dt, Tensor(), res);
  }
  const FusedRun comp = run_fused(x, w, b, r, rm, rv, opts, BnFusion::composed, test::kCuda, dt, Tensor(), res);
  REQUIRE(got.y.dtype() == dt);
  CHECK(test::compare_bits(got.y, comp.y.to(Device::cpu())) == "");
  const double ctol = dt == DType::f32 ? 1e-6 : 4e-3;
  CHECK(test::rel_error(got.gx, comp.gx.to(Device::cpu())) <= ctol);
  CHECK(test::rel_error(got.gw, comp.gw.to(Device::cpu())) <= ctol);
  CHECK(test::rel_error(got.gb, comp.gb.to(Device::cpu())) <= ctol);
  if (with_residual) {
    REQUIRE(got.gr.defined());
    CHECK(got.gr.dtype() == dt);
    CHECK(test::compare_bits(got.gr, comp.gr.to(Device::cpu())) == "");
  }
  CHECK(test::compare_bits(got.rm, comp.rm.to(Device::cpu())) == "");
  CHECK(test::compare_bits(got.rv, comp.rv.to(Device::cpu())) == "");

  const Tensor yc = got.y.to(Device::cpu()).to(DType::f64);
  const Tensor mask = gt(yc, 0.0).to(DType::f64);
  const double zeros_frac = 1.0 - sum(mask).item() / static_cast<double>(mask.numel());
  CHECK(zeros_frac > 0.05);
  CHECK(zeros_frac < 0.95);
  const FusedRun ref = run_fused(x, w, b, r, rm, rv, opts, BnFusion::composed, Device::cpu(), DType::f64, mask, res);
  const double tol = dt == DType::f32 ? 2e-6 : 5e-3, gtol = dt == DType::f32 ? 1e-4 : 1e-2;
  CHECK(test::rel_error(got.y, relu(ref.y)) <= tol);
  CHECK(test::rel_error(got.gx, ref.gx) <= gtol);
  CHECK(test::rel_error(got.gw, ref.gw) <= gtol);
  CHECK(test::rel_error(got.gb, ref.gb) <= gtol);
  if (with_residual) CHECK(test::rel_error(got.gr, ref.gr) <= tol);  // r * mask, rounded once
  CHECK(test::compare_to_cpu(got.rm, ref.rm, {1e-5, 1e-6}) == "");
  CHECK(test::compare_to_cpu(got.rv, ref.rv, {1e-5, 1e-6}) == "");
}

}  // namespace

TEST_CASE("batch_norm with a fused relu (and residual) on CUDA matches the composition and the CPU",
          "[gpu][batch_norm][fused]") {
  uint64_t seed = 9000;
  const std::vector<Shape> shapes = {{256 * 8 * 8, 64},   // (M, C) channels last, 16-byte packs, split kernels
                                     {4099, 18},          // (M, C) scalar kernels
                                     {256 * 8 * 8, 128},  // (M, C) ticket kernels
                                     {64, 16, 16, 16},    // NCHW, S = 256
                                     {48, 8, 7, 7},       // NCHW, scalar kernels
                                     {24, 5, 9, 13},      // NCHW, odd C and S
                                     {64, 32, 16, 16},    // NCHW, 16-byte packs
                                     {48, 48, 7, 9},      // NCHW, scalar kernels
                                     {128, 96, 8, 8}};    // NCHW, many channels
  for (DType dt : {DType::bf16, DType::f32})
    for (const Shape& s : shapes)
      for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval})
        for (bool res : {false, true}) {
          INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval")
                              << (res ? " + residual" : ""));
          check_fused(s, dt, mode, seed += 10, res);
        }
}

// More channels than a ticket slot (C > 4096, channels first: the statistics and backward sums fall back to
// the separate finalize kernels) against the CPU, plain and with the fused relu (and residual).
TEST_CASE("batch_norm with C > 4096 channels first (finalize-kernel fallback) matches the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 9400;
  auto same = [](const Tensor& t) { return t; };
  const std::vector<Shape> shapes = {{2, 4100, 4, 4},   // S = 16: 16-byte packs
                                     {3, 4100, 5, 7}};  // S = 35: scalar kernels
  for (DType dt : {DType::bf16, DType::f32})
    for (const Shape& s : shapes)
      for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
        INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval"));
        check_bn(s, s[1], dt, mode, seed += 10, same);
        for (bool res : {false, true}) {
          INFO((res ? "fused relu + residual" : "fused relu"));
          check_fused(s, dt, mode, seed += 10, res);
        }
      }
}

// Repeated launches give bit-identical results (every output and gradient and the running stats): the
// partial sums are added in a fixed order whichever block takes the last ticket, and every slot of the
// ticket ring is reused several times (its counters must come back to 0); with and without the fused relu,
// both layouts, C = 4100 channels first on the fallback.
TEST_CASE("batch_norm kernels are deterministic across repeated launches", "[gpu][batch_norm]") {
  uint64_t seed = 9500;
  struct Case {
    Shape shape;
    DType dt;
    bool relu;
  };
  const std::vector<Case> cases = {{{32, 64, 16, 16}, DType::bf16, false}, {{32, 64, 16, 16}, DType::bf16, true},
                                   {{16, 24, 8, 8}, DType::f32, false},    {{24, 7, 5, 3}, DType::f32, true},
                                   {{4096, 64}, DType::bf16, false},       {{2, 4100, 3, 1}, DType::f32, false},
                                   {{48, 48, 7, 9}, DType::f32, true},     {{128, 96, 8, 8}, DType::bf16, false},
                                   {{20011, 24}, DType::bf16, true},       {{30001, 64}, DType::f32, false},
                                   {{8192, 256}, DType::bf16, true},       {{30001, 136}, DType::f32, false}};
  // (the (M, C) ones with C >= 128 take the channels-last ticket kernels, the others the split kernels)
  for (const Case& c : cases) {
    const int64_t C = c.shape[1];
    const Tensor x = test::random_input(c.shape, seed, c.dt, -1, 4).to(test::kCuda);
    const Tensor w = test::random_input({C}, seed + 1, c.dt, 0.5, 1.5).to(test::kCuda);
    const Tensor b = test::random_input({C}, seed + 2, c.dt, -1, 1).to(test::kCuda);
    const Tensor g = test::random_input(c.shape, seed + 3, c.dt, -1, 1).to(test::kCuda);
    seed += 10;
    BatchNormOptions opts;
    opts.activation = c.relu ? BatchNormActivation::relu : BatchNormActivation::none;
    Tensor first[6];
    for (int rep = 0; rep < 12; ++rep) {
      INFO(to_string(c.shape) << " " << dtype_name(c.dt) << (c.relu ? " relu" : "") << " repetition " << rep);
      Tensor xl = x.detach(), wl = w.detach(), bl = b.detach();
      for (Tensor* t : {&xl, &wl, &bl}) t->set_requires_grad(true);
      Tensor rm = zeros({C}, {DType::f32, test::kCuda}), rv = ones({C}, {DType::f32, test::kCuda});
      const Tensor y = batch_norm(xl, wl, bl, rm, rv, opts);
      y.backward(g);
      const Tensor out[6] = {y.detach(), xl.grad(), wl.grad(), bl.grad(), rm, rv};
      for (int k = 0; k < 6; ++k) {
        if (rep == 0) {
          first[k] = out[k].to(Device::cpu());  // the comparisons take (CUDA, CPU)
          continue;
        }
        INFO("output " << k << " (y, gx, gw, gb, running mean, running var)");
        CHECK(test::compare_bits(out[k], first[k]) == "");
      }
    }
  }
}
