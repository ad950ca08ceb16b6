// Batch norm on CUDA on large inputs of both kernel layouts (cuda/kernels/batchnorm*.cu): (M, C) matrices with the
// channel fastest (the channels-last case: an NHWC activation viewed as (N*H*W, C)) and (N, C, H, W) with
// many blocks per channel, vectorized and scalar (odd C or S, an unaligned start) variants, train and eval,
// forward, every gradient and the running statistics, against the CPU in f64 on the same values; the fused
// batch norm + ReLU against the CUDA composition and the CPU; C > 4096 channels first (no ticket slot: the
// separate finalize kernels, Note [Batch-norm kernels]); repeated launches give bit-identical results. The
// channels-first cases run under every channels-first kernel variant (split grids, plane kernels, split grids
// with 16-byte stores); variant 3 gives variant 1's bits. The channels-last cases run under
// both channels-last reduction variants (split + finalize, two-level tickets).
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <algorithm>
#include <cmath>

#include "cuda/kernels/batchnorm.cuh"  // set_bn_cf_variant, set_bn_cl_variant, bn_plane_launches

using namespace ht;

namespace {

// Runs f(v) under every channels-first kernel variant v (cuda/kernels/batchnorm.cuh: 1 split grids, 2 plane kernels,
// 3 split grids with 16-byte stores), with channels-last reduction variant min(v, 2) (1
// split + finalize, 2 tickets: both run in every test using it), then gives the choices back to the
// environment.
struct CfVariantReset {
  ~CfVariantReset() {
    kernels::set_bn_cf_variant(0);
    kernels::set_bn_cl_variant(0);
  }
};
template <class F>
void for_each_cf_variant(F&& f) {
  const CfVariantReset reset;
  for (int v = 1; v <= kernels::kBnCfVariants; ++v) {
    const int cl = std::min(v, kernels::kBnClVariants);
    INFO("channels-first kernel variant " << v << ", channels-last variant " << cl);
    kernels::set_bn_cf_variant(v);
    kernels::set_bn_cl_variant(cl);
    f(v);
  }
}
// Runs f(v) under every channels-last reduction variant v, then gives the choice back to the environment; checks
// that variant 2 took its ticket kernels (f runs at least one train-mode batch norm on (M, C)).
template <class F>
void for_each_cl_variant(F&& f) {
  const CfVariantReset reset;
  for (int v = 1; v <= kernels::kBnClVariants; ++v) {
    INFO("channels-last reduction variant " << v);
    kernels::set_bn_cl_variant(v);
    const int64_t launches0 = kernels::bn_cl_ticket_launches();
    f(v);
    if (v == 2) CHECK(kernels::bn_cl_ticket_launches() > launches0);
    else CHECK(kernels::bn_cl_ticket_launches() == launches0);
  }
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
  for_each_cl_variant([&](int) {
    for (DType dt : {DType::bf16, DType::f32, DType::f64})
      for (int64_t C : {64, 128, 18})  // 18: not a multiple of the bf16 or f32 pack (scalar kernels)
        for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
          INFO(dtype_name(dt) << " C " << C << (mode == BatchNormMode::train ? " train" : " eval"));
          check_bn({256 * 16 * 16, C}, C, dt, mode, seed += 10, same);
        }
  });
}

TEST_CASE("batch_norm on (M, C) starting one element in (unaligned) and on a few rows", "[gpu][batch_norm]") {
  uint64_t seed = 7500;
  // A dense (4099, 64) view starting at element 1 of its storage: contiguous but not 16-byte aligned.
  constexpr int64_t M = 4099, C = 64;
  auto skip_one = [=](const Tensor& t) { return reshape(slice(t, 0, 1, M * C + 1, 1), {M, C}); };
  auto same = [](const Tensor& t) { return t; };
  for_each_cl_variant([&](int) {
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(dtype_name(dt) << " unaligned");
      check_bn({M * C + 1}, C, dt, BatchNormMode::train, seed += 10, skip_one);
    }
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(dtype_name(dt) << " 3 rows");
      check_bn({3, 64}, 64, dt, BatchNormMode::train, seed += 10, same);
    }
  });
}

// The channels-last reduction variants on block shapes other than the bench's (cuda/kernels/batchnorm_cl2.cu, Note
// [Batch-norm channels-last tickets]): one pack column a block (C = 8 bf16: 32 rows a warp, added by
// shuffles), 3 and 18 columns (no shuffles), C = 4104 bf16 (513 packs: 3 blocks across C, the last with one
// pack), odd M with one or many ticket groups, 2 rows; plain, fused relu and relu + residual, train and eval.
TEST_CASE("batch_norm channels-last reduction variants on odd shapes match the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 7700;
  auto same = [](const Tensor& t) { return t; };
  const std::vector<Shape> shapes = {{50001, 8}, {3001, 24}, {20011, 18}, {777, 4104}, {2, 64}};
  for_each_cl_variant([&](int) {
    for (DType dt : {DType::bf16, DType::f32})
      for (const Shape& s : shapes)
        for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
          INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval"));
          check_bn(s, s[1], dt, mode, seed += 10, same);
          if (s[0] < 100) continue;  // the fused checks want both signs in bulk
          for (bool res : {false, true}) {
            INFO((res ? "fused relu + residual" : "fused relu"));
            check_fused(s, dt, mode, seed += 10, res);
          }
        }
  });
}

TEST_CASE("batch_norm on large (N, C, H, W) inputs matches the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 8000;
  auto same = [](const Tensor& t) { return t; };
  // The last five have N*C >= 2048 planes of S >= 32: the plane kernels under variant 2 (grids of 2112
  // warps, 4224 for normalize: one plane a warp for the first three).
  const std::vector<Shape> shapes = {{64, 16, 16, 16},   // S = 256: 16-byte packs, several blocks per channel
                                     {48, 8, 7, 7},      // S = 49: scalar kernels
                                     {40, 5, 9, 13},     // odd C and S (117): scalar kernels, several splits
                                     {64, 32, 16, 16},   // planes, S = 256: 16-byte packs
                                     {48, 48, 7, 9},     // planes, S = 63: scalar, lanes past the plane's end
                                     {41, 51, 9, 13},    // planes, odd N, C and S (117 = 3 * 32 + 21)
                                     {128, 96, 8, 8},    // planes, 12288 > 2 * 2112: two planes at once, then one
                                     {32, 64, 13, 11}};  // planes, S = 143 scalar: more than 4 packs a lane
  auto nhwc = [](const Tensor& t) { return t.permute({0, 3, 1, 2}); };
  for_each_cf_variant([&](int variant) {
    const int64_t planes0 = kernels::bn_plane_launches();
    for (DType dt : {DType::bf16, DType::f32, DType::f64})
      for (const Shape& s : shapes)
        for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval}) {
          INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval"));
          check_bn(s, s[1], dt, mode, seed += 10, same);
        }
    // Variant 2 took the plane kernels (normalize, sums, dx and in train mode the statistics; 3 dtypes x 5
    // shapes x 2 modes).
    if (variant == 2) CHECK(kernels::bn_plane_launches() - planes0 >= 3 * 5 * 2 * 3);
    else CHECK(kernels::bn_plane_launches() == planes0);
    // A channels-last tensor (N, H, W, C) viewed as (N, C, H, W).
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(dtype_name(dt) << " NHWC view");
      check_bn({32, 8, 8, 32}, 32, dt, BatchNormMode::train, seed += 10, nhwc);
    }
  });
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
  const std::vector<Shape> shapes = {{256 * 8 * 8, 64},  // (M, C) channels last, 16-byte packs
                                     {4099, 18},         // (M, C) scalar kernels
                                     {64, 16, 16, 16},   // NCHW, S = 256
                                     {48, 8, 7, 7},      // NCHW, scalar kernels
                                     {24, 5, 9, 13},     // NCHW, odd C and S
                                     {64, 32, 16, 16},   // NCHW, plane kernels under variant 2
                                     {48, 48, 7, 9},     // NCHW, scalar plane kernels under variant 2
                                     {128, 96, 8, 8}};   // NCHW, several planes a warp under variant 2
  for_each_cf_variant([&](int) {
    for (DType dt : {DType::bf16, DType::f32})
      for (const Shape& s : shapes)
        for (BatchNormMode mode : {BatchNormMode::train, BatchNormMode::eval})
          for (bool res : {false, true}) {
            INFO(dtype_name(dt) << " " << to_string(s) << (mode == BatchNormMode::train ? " train" : " eval")
                                << (res ? " + residual" : ""));
            check_fused(s, dt, mode, seed += 10, res);
          }
  });
}

// More channels than a ticket slot (C > 4096, channels first: the statistics and backward sums fall back to
// the separate finalize kernels) against the CPU, plain and with the fused relu (and residual).
TEST_CASE("batch_norm with C > 4096 channels first (finalize-kernel fallback) matches the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 9400;
  auto same = [](const Tensor& t) { return t; };
  const std::vector<Shape> shapes = {{2, 4100, 4, 4},   // S = 16: 16-byte packs
                                     {3, 4100, 5, 7}};  // S = 35: scalar kernels
  for_each_cf_variant([&](int) {  // variant 2 falls back to variant 1's kernels here (C > 4096)
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
  });
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
                                   {{20011, 24}, DType::bf16, true},       {{30001, 64}, DType::f32, false}};
  // (the first two and two after {2, 4100, 3, 1}: plane kernels under variant 2; the (M, C) ones run both
  // channels-last variants)
  for_each_cf_variant([&](int) {
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
  });
}

// Variant 3 is variant 1 with 16-byte stores (cuda/kernels/batchnorm.cuh): the same bits in every output and
// gradient, bf16 with 16-byte packs, plain and with the fused relu + residual.
TEST_CASE("batch_norm channels-first variant 3 (16-byte stores) gives variant 1's bits", "[gpu][batch_norm]") {
  const CfVariantReset reset;
  const Shape shape{32, 64, 16, 16};
  const int64_t C = shape[1];
  const Tensor x = test::random_input(shape, 9700, DType::bf16, -1, 4).to(test::kCuda);
  const Tensor w = test::random_input({C}, 9701, DType::bf16, 0.5, 1.5).to(test::kCuda);
  const Tensor b = test::random_input({C}, 9702, DType::bf16, -1, 1).to(test::kCuda);
  const Tensor g = test::random_input(shape, 9703, DType::bf16, -1, 1).to(test::kCuda);
  const Tensor res = test::random_input(shape, 9704, DType::bf16, -1, 1).to(test::kCuda);
  for (bool fused : {false, true}) {
    INFO((fused ? "relu + residual" : "plain"));
    Tensor out[2][5];
    for (int k = 0; k < 2; ++k) {
      kernels::set_bn_cf_variant(k == 0 ? 1 : 3);
      Tensor xl = x.detach(), wl = w.detach(), bl = b.detach(), rl = res.detach();
      for (Tensor* t : {&xl, &wl, &bl, &rl}) t->set_requires_grad(true);
      Tensor rm = zeros({C}, {DType::f32, test::kCuda}), rv = ones({C}, {DType::f32, test::kCuda});
      BatchNormOptions opts;
      opts.activation = fused ? BatchNormActivation::relu : BatchNormActivation::none;
      const Tensor y =
          fused ? batch_norm_add_relu(xl, rl, {wl, bl, rm, rv}, opts) : batch_norm(xl, wl, bl, rm, rv, opts);
      y.backward(g);
      out[k][0] = y.detach().to(Device::cpu());
      out[k][1] = xl.grad().to(Device::cpu());
      out[k][2] = wl.grad().to(Device::cpu());
      out[k][3] = bl.grad().to(Device::cpu());
      out[k][4] = fused ? rl.grad().to(Device::cpu()) : rm.to(Device::cpu());
    }
    for (int i = 0; i < 5; ++i) {
      INFO("output " << i << " (y, gx, gw, gb, residual gradient or running mean)");
      CHECK(test::compare_bits(out[1][i].to(test::kCuda), out[0][i]) == "");
    }
  }
}
