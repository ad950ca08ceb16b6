// conv2d (cuDNN), the 2-D pools and batch norm on CUDA against the CPU reference: forward and every
// gradient on random inputs (never zeros), odd sizes, stride, padding, dilation, groups and depthwise,
// non-contiguous inputs, with every CUDA allocation poisoned so unwritten outputs fail. f32 uses a
// tolerance that TF32 would exceed; f64 is tight; bf16 is compared with the f64 CPU result of the same
// bf16 values through a relative norm error (the CPU bf16 path rounds intermediates the GPU keeps wide).
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

#include <cmath>
#include <functional>

using namespace ht;

namespace {

using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

// Leaves with the same values on `dev` (requires grad when `grad`).
std::vector<Tensor> leaves(const std::vector<Tensor>& values, Device dev, DType dt) {
  std::vector<Tensor> out;
  for (const Tensor& v : values) {
    Tensor t = v.to(dt).to(dev).detach();
    t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

struct Tols {
  test::Tolerance fwd, grad;
};

// Runs out = f(inputs) and the backward of sum(out * r) (r random, so every gradient element differs) on
// the CPU and on CUDA in dtype `dt`, and compares the output and the gradient of every input. Narrow dtypes
// (bf16/f16) are compared with the CPU f64 run of the same values: relative norm error <= `narrow_tol`.
std::string check_graph(const Graph& f, const std::vector<Tensor>& values, DType dt, const Tols& tol,
                        uint64_t seed, double narrow_tol = 1e-2) {
  const bool narrow = dt == DType::bf16 || dt == DType::f16;
  const DType ref_dt = narrow ? DType::f64 : dt;
  std::vector<Tensor> rounded;  // the exact values the CUDA run sees, for the CPU reference
  for (const Tensor& v : values) rounded.push_back(v.to(dt).to(ref_dt));
  auto cpu = leaves(rounded, Device::cpu(), ref_dt);
  const Tensor oc = f(cpu);
  const Tensor r = test::random_input(oc.shape(), seed, dt, 0.5, 1.5);  // the same values on both sides
  sum(mul(oc, r.to(ref_dt))).backward();

  Tensor og;
  std::vector<Tensor> gpu;
  {
    test::PoisonGuard poison;
    gpu = leaves(values, test::kCuda, dt);
    og = f(gpu);
    sum(mul(og, r.to(dt).to(test::kCuda))).backward();
  }
  if (!og.is_cuda()) return "output not on CUDA";
  auto compare = [&](const Tensor& a, const Tensor& e, test::Tolerance t) -> std::string {
    if (!narrow) return test::compare_to_cpu(a, e, t);
    if (a.dtype() != dt) return fmt::format("dtype {} instead of {}", dtype_name(a.dtype()), dtype_name(dt));
    const double err = test::rel_error(a, e);
    return err <= narrow_tol ? std::string() : fmt::format("relative error {} > {}", err, narrow_tol);
  };
  std::string msg = compare(og, oc, tol.fwd);
  if (!msg.empty()) return "output: " + msg;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].grad().defined()) {
      if (gpu[i].grad().defined()) return fmt::format("input {}: a gradient on CUDA but none on the CPU", i);
      continue;
    }
    if (!gpu[i].grad().defined()) return fmt::format("input {}: no gradient on CUDA", i);
    if (!gpu[i].grad().is_cuda()) return fmt::format("input {}: gradient not on CUDA", i);
    msg = compare(gpu[i].grad(), cpu[i].grad(), tol.grad);
    if (!msg.empty()) return fmt::format("gradient of input {}: {}", i, msg);
  }
  return {};
}

// ---- conv2d ----------------------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t N, C, H, W, O, KH, KW;
  Conv2dParams p;
  bool bias = true;
};

Conv2dParams conv_params(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups) {
  Conv2dParams p;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.dilation_h = dh;
  p.dilation_w = dw;
  p.groups = groups;
  return p;
}

const std::vector<ConvCase> kConvCases = {
    {"3x3 pad 1", 2, 3, 7, 9, 4, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 1)},
    {"stride 2, padding (1, 2), 3x5 kernel", 3, 4, 11, 10, 6, 3, 5, conv_params(2, 2, 1, 2, 1, 1, 1)},
    {"dilation (2, 3), padding 2", 2, 3, 13, 11, 5, 3, 3, conv_params(1, 1, 2, 2, 2, 3, 1)},
    {"groups 2, stride 2", 2, 4, 9, 9, 6, 3, 3, conv_params(2, 2, 1, 1, 1, 1, 2)},
    {"depthwise", 2, 6, 8, 7, 6, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 6)},
    {"1x1 stride 2, no bias", 3, 8, 5, 5, 16, 1, 1, conv_params(2, 2, 0, 0, 1, 1, 1), false},
    {"odd everything", 1, 5, 6, 13, 7, 2, 4, conv_params(3, 2, 1, 2, 2, 1, 1)},
};

const Tols kConvF32{{1e-4, 1e-4}, {1e-4, 2e-4}};  // TF32 (10-bit mantissa) would exceed these
// For larger layers cuDNN's heuristics may pick FFT or Winograd weight-gradient algorithms, whose f32 error
// is about 1e-4 relative (3e-4 measured on the H200); still well below what a wrong convolution gives.
// Output atol 5e-4: the 3x3 64-channel sums (K = 576, |y| ~ 8) may run on Winograd, whose f32 error reached
// 1.6e-4 absolute on a few near-zero outputs on the H200 (2e-5 of the output scale).
const Tols kConvF32Large{{1e-4, 5e-4}, {2e-3, 2e-3}};
const Tols kConvF64{{1e-10, 1e-10}, {1e-10, 1e-10}};

std::string check_conv(const ConvCase& cc, DType dt, bool channels_last_input, uint64_t seed,
                       const Tols* f32_tols = nullptr) {
  // x is stored (N, H, W, C) and viewed as (N, C, H, W) when channels_last_input: a non-contiguous leaf.
  const Shape xs = channels_last_input ? Shape{cc.N, cc.H, cc.W, cc.C} : Shape{cc.N, cc.C, cc.H, cc.W};
  std::vector<Tensor> values = {test::random_input(xs, seed, DType::f64, -1, 1),
                                test::random_input({cc.O, cc.C / cc.p.groups, cc.KH, cc.KW}, seed + 1, DType::f64, -1, 1)};
  if (cc.bias) values.push_back(test::random_input({cc.O}, seed + 2, DType::f64, -1, 1));
  const Conv2dParams p = cc.p;
  const bool has_bias = cc.bias;
  auto f = [p, has_bias, channels_last_input](const std::vector<Tensor>& in) {
    const Tensor x = channels_last_input ? in[0].permute({0, 3, 1, 2}) : in[0];
    return conv2d(x, in[1], has_bias ? in[2] : Tensor(), p);
  };
  return check_graph(f, values, dt, dt == DType::f64 ? kConvF64 : (f32_tols ? *f32_tols : kConvF32), seed + 3);
}

}  // namespace

TEST_CASE("conv2d forward and gradients on CUDA match the CPU in f32 and f64", "[gpu][conv]") {
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::f64})
    for (const ConvCase& cc : kConvCases)
      for (bool cl : {false, true}) {
        INFO(cc.name << " " << dtype_name(dt) << (cl ? " channels-last input view" : ""));
        CHECK(check_conv(cc, dt, cl, seed += 10) == "");
      }
}

TEST_CASE("conv2d in bf16 and f16 on CUDA is close to the f64 CPU result", "[gpu][conv]") {
  uint64_t seed = 500;
  for (DType dt : {DType::bf16, DType::f16})
    for (const ConvCase& cc : kConvCases) {
      INFO(cc.name << " " << dtype_name(dt));
      CHECK(check_conv(cc, dt, false, seed += 10) == "");
    }
}

TEST_CASE("conv2d on CUDA: a ResNet-sized layer and repeated calls reuse the cached algorithm", "[gpu][conv]") {
  // 3x3, 64 -> 64 channels on 16x16: large enough for cuDNN to pick its fast algorithms.
  const ConvCase cc{"resnet 3x3", 8, 64, 16, 16, 64, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 1), false};
  CHECK(check_conv(cc, DType::f32, false, 900, &kConvF32Large) == "");
  CHECK(check_conv(cc, DType::f32, false, 910, &kConvF32Large) == "");  // cached choice, fresh values
  CHECK(check_conv(cc, DType::bf16, false, 920) == "");
}

TEST_CASE("conv2d's input gradient is added into a residual input's gradient on CUDA", "[gpu][conv]") {
  // out = conv(x) + 2x, loss = sum(out * r): the 2x branch's gradient reaches x first, and the convolution's
  // backward data adds into it (beta = 1, Note [Gradients accumulated in place]). x, w: f64 on the CPU as
  // reference, the device run in f32 and bf16 from the same (rounded) values, both layouts.
  const ConvCase cc{"residual 3x3", 4, 16, 9, 9, 16, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 1), false};
  uint64_t seed = 990;
  for (const DType dt : {DType::f32, DType::bf16})
    for (const bool nhwc : {false, true}) {
      INFO(dtype_name(dt) << (nhwc ? " nhwc" : " nchw"));
      Conv2dParams p = cc.p;
      if (nhwc) p.layout = ConvLayout::nhwc;
      const Shape xs = nhwc ? Shape{cc.N, cc.H, cc.W, cc.C} : Shape{cc.N, cc.C, cc.H, cc.W};
      const Tensor x0 = test::random_input(xs, ++seed, DType::f64).to(dt).to(DType::f64);
      const Tensor w0 = test::random_input({cc.O, cc.C, cc.KH, cc.KW}, ++seed, DType::f64).to(dt).to(DType::f64);
      const Tensor r0 = test::random_input(xs, ++seed, DType::f64).to(dt).to(DType::f64);
      auto grad_x = [&](Device dev, DType t) {
        Tensor x = x0.to(t).to(dev).detach();  // a leaf of its own (the f64 CPU run would otherwise mark x0)
        x.set_requires_grad(true);
        const Tensor w = w0.to(t).to(dev), r = r0.to(t).to(dev);
        sum(mul(add(conv2d(x, w, Tensor(), p), mul(x, 2.0)), r)).backward();
        return x.grad();
      };
      const Tensor expect = grad_x(Device::cpu(), DType::f64);  // the CPU runs nhwc through NCHW permutes
      const int64_t before = grads_accumulated_in_place();
      Tensor got;
      {
        test::PoisonGuard poison;
        got = grad_x(test::kCuda, dt);
      }
      CHECK(grads_accumulated_in_place() - before == 1);
      REQUIRE(got.is_cuda());
      CHECK(got.shape() == xs);
      CHECK(test::rel_error(got.to(Device::cpu()), expect) < (dt == DType::bf16 ? 1e-2 : 1e-5));
    }
}

TEST_CASE("conv2d_input_grad on CUDA matches the CPU in both layouts", "[gpu][conv]") {
  uint64_t seed = 950;
  for (const ConvCase& cc : kConvCases)
    for (bool nhwc : {false, true}) {
      INFO(cc.name << (nhwc ? " nhwc" : " nchw"));
      Conv2dParams p = cc.p;
      const Tensor w = test::random_input({cc.O, cc.C / p.groups, cc.KH, cc.KW}, ++seed, DType::f32);
      const Tensor y = conv2d(test::random_input({cc.N, cc.C, cc.H, cc.W}, ++seed, DType::f32), w, Tensor(), p);
      Tensor g = test::random_input(y.shape(), ++seed, DType::f32);  // (N, O, OH, OW)
      if (nhwc) {
        p.layout = ConvLayout::nhwc;
        g = permute(g, {0, 2, 3, 1}).contiguous();
      }
      const Tensor expect = conv2d_input_grad(g, w, cc.H, cc.W, p);
      Tensor got;
      {
        test::PoisonGuard poison;
        got = conv2d_input_grad(g.to(test::kCuda), w.to(test::kCuda), cc.H, cc.W, p);
      }
      REQUIRE(got.is_cuda());
      CHECK(got.shape() == expect.shape());
      CHECK(test::rel_error(got.to(Device::cpu()), expect) < 1e-5);
    }
}

TEST_CASE("conv2d_weight_grad on CUDA matches the CPU in both layouts", "[gpu][conv]") {
  uint64_t seed = 970;
  for (const ConvCase& cc : kConvCases)
    for (bool nhwc : {false, true}) {
      INFO(cc.name << (nhwc ? " nhwc" : " nchw"));
      Conv2dParams p = cc.p;
      Tensor x = test::random_input({cc.N, cc.C, cc.H, cc.W}, ++seed, DType::f32);
      const Tensor w = test::random_input({cc.O, cc.C / p.groups, cc.KH, cc.KW}, ++seed, DType::f32);
      Tensor g = test::random_input(conv2d(x, w, Tensor(), p).shape(), ++seed, DType::f32);  // (N, O, OH, OW)
      if (nhwc) {
        p.layout = ConvLayout::nhwc;
        x = permute(x, {0, 2, 3, 1}).contiguous();
        g = permute(g, {0, 2, 3, 1}).contiguous();
      }
      const Tensor expect = conv2d_weight_grad(x, g, cc.KH, cc.KW, p);
      Tensor got;
      {
        test::PoisonGuard poison;
        got = conv2d_weight_grad(x.to(test::kCuda), g.to(test::kCuda), cc.KH, cc.KW, p);
      }
      REQUIRE(got.is_cuda());
      CHECK(got.shape() == expect.shape());
      CHECK(test::rel_error(got.to(Device::cpu()), expect) < 1e-5);
    }
}

TEST_CASE("conv2d on CUDA rejects a mixed-device call", "[gpu][conv]") {
  const Tensor x = test::random_input({1, 2, 5, 5}, 1, DType::f32).to(test::kCuda);
  const Tensor w = test::random_input({3, 2, 3, 3}, 2, DType::f32);
  CHECK_THROWS(conv2d(x, w, Tensor()));
}

// ---- pools -----------------------------------------------------------------------------------------------

namespace {

Pool2dParams pool_params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Pool2dParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  return p;
}

struct PoolCase {
  const char* name;
  Shape x;  // (N, C, H, W)
  Pool2dParams p;
};

const std::vector<PoolCase> kPoolCases = {
    {"3x3 stride 2 pad 1 (ResNet stem)", {2, 3, 9, 11}, pool_params(3, 3, 2, 2, 1, 1)},
    {"2x2 stride 2 on odd sizes", {3, 2, 7, 9}, pool_params(2, 2, 2, 2, 0, 0)},
    {"3x2 stride (1, 2) pad (1, 0): overlapping windows", {1, 4, 6, 7}, pool_params(3, 2, 1, 2, 1, 0)},
    {"5x5 stride 3 pad 2", {2, 1, 13, 8}, pool_params(5, 5, 3, 3, 2, 2)},
};

Tols pool_tols(DType dt) { return {test::tolerance(dt), test::tolerance(dt)}; }

}  // namespace

TEST_CASE("max_pool2d and avg_pool2d forward and backward on CUDA match the CPU", "[gpu][pool]") {
  uint64_t seed = 1000;
  for (DType dt : test::kFloatDTypes)
    for (const PoolCase& pc : kPoolCases)
      for (bool permuted : {false, true}) {
        const Pool2dParams p = pc.p;
        // permuted: x stored (N, H, C, W) and viewed as (N, C, H, W)
        const Shape xs = permuted ? Shape{pc.x[0], pc.x[2], pc.x[1], pc.x[3]} : pc.x;
        const std::vector<Tensor> values = {test::random_input(xs, seed += 3, DType::f64)};
        auto view = [permuted](const Tensor& t) { return permuted ? t.permute({0, 2, 1, 3}) : t; };
        INFO(pc.name << " " << dtype_name(dt) << (permuted ? " permuted" : ""));
        // Narrow dtypes run on the CPU in the same dtype here: the pools round once from double on both sides.
        auto max_f = [p, view](const std::vector<Tensor>& in) { return max_pool2d(view(in[0]), p); };
        auto avg_f = [p, view](const std::vector<Tensor>& in) { return avg_pool2d(view(in[0]), p); };
        CHECK(check_graph(max_f, values, dt, pool_tols(dt), seed + 1, 1e-2) == "");
        CHECK(check_graph(avg_f, values, dt, pool_tols(dt), seed + 2, 1e-2) == "");
      }
}

TEST_CASE("max_pool2d on CUDA selects the first maximum and routes each gradient to it", "[gpu][pool]") {
  // Integer-valued input with many ties: the CPU and CUDA must pick the same element, so the gradients
  // (summed where overlapping windows pick the same element) agree exactly.
  const Tensor x = test::random_input({2, 3, 8, 9}, 77, DType::i32, 0, 3).to(DType::f32);
  const Pool2dParams p = pool_params(3, 3, 1, 2, 1, 1);
  Tensor xc = x.detach(), xg = x.to(test::kCuda).detach();
  xc.set_requires_grad(true);
  xg.set_requires_grad(true);
  const Tensor r = test::random_input({2, 3, 8, 5}, 78, DType::f32, 0.5, 1.5);
  sum(mul(max_pool2d(xc, p), r)).backward();
  {
    test::PoisonGuard poison;
    const Tensor out = max_pool2d(xg, p);
    CHECK(test::compare_bits(out, max_pool2d(x, p)) == "");
    sum(mul(out, r.to(test::kCuda))).backward();
  }
  CHECK(test::compare_bits(xg.grad(), xc.grad()) == "");
}

TEST_CASE("adaptive_avg_pool2d forward and backward on CUDA match the CPU", "[gpu][pool]") {
  struct Case {
    Shape x;
    int64_t oh, ow;
  };
  const std::vector<Case> cases = {{{2, 3, 7, 9}, 1, 1},   {{2, 3, 7, 9}, 3, 4},  {{1, 2, 7, 9}, 5, 7},
                                   {{1, 2, 5, 4}, 9, 11},  {{3, 1, 13, 6}, 4, 6}, {{4, 5, 4, 4}, 1, 1}};
  uint64_t seed = 2000;
  for (DType dt : test::kFloatDTypes)
    for (const Case& c : cases) {
      const int64_t oh = c.oh, ow = c.ow;
      INFO(to_string(c.x) << " -> (" << oh << ", " << ow << ") " << dtype_name(dt));
      const std::vector<Tensor> values = {test::random_input(c.x, seed += 2, DType::f64)};
      auto f = [oh, ow](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], oh, ow); };
      CHECK(check_graph(f, values, dt, pool_tols(dt), seed + 1, 1e-2) == "");
      // and through a transposed (non-contiguous) view
      auto ft = [oh, ow](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0].transpose(2, 3), oh, ow); };
      const std::vector<Tensor> tv = {test::random_input({c.x[0], c.x[1], c.x[3], c.x[2]}, seed + 7, DType::f64)};
      CHECK(check_graph(ft, tv, dt, pool_tols(dt), seed + 8, 1e-2) == "");
    }
}

// ---- batch norm ------------------------------------------------------------------------------------------

namespace {

const Tols kBnF32{{2e-6, 1e-6}, {1e-4, 5e-5}};  // backward: the CPU computes the formula in f32 ops
const Tols kBnF64{{1e-10, 1e-12}, {1e-9, 1e-10}};

struct BnCase {
  const char* name;
  Shape x;
};
const std::vector<BnCase> kBnCases = {
    {"(N, C, H, W)", {4, 5, 7, 3}},
    {"(N, C)", {9, 6}},
    {"(N, C, L)", {3, 4, 10}},
    {"one sample", {1, 3, 5, 5}},
};

}  // namespace

TEST_CASE("batch_norm train forward, backward and running stats on CUDA match the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 3000;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (const BnCase& bc : kBnCases)
      for (bool affine : {true, false}) {
        const int64_t C = bc.x[1];
        INFO(bc.name << " " << dtype_name(dt) << (affine ? " affine" : " no affine"));
        // Forward and gradients (running stats off: they are checked below).
        std::vector<Tensor> values = {test::random_input(bc.x, seed += 5, DType::f64, -2, 3)};
        if (affine) {
          values.push_back(test::random_input({C}, seed + 1, DType::f64, 0.5, 1.5));
          values.push_back(test::random_input({C}, seed + 2, DType::f64, -1, 1));
        }
        auto f = [affine](const std::vector<Tensor>& in) {
          return batch_norm(in[0], affine ? in[1] : Tensor(), affine ? in[2] : Tensor(), Tensor(), Tensor());
        };
        CHECK(check_graph(f, values, dt, dt == DType::f64 ? kBnF64 : kBnF32, seed + 3, 1e-2) == "");

        // Two train steps update the running stats on the device as on the CPU.
        Tensor rm_c = test::random_input({C}, seed + 4, DType::f32, -0.5, 0.5);
        Tensor rv_c = test::random_input({C}, seed + 5, DType::f32, 0.5, 1.5);
        Tensor rm_g = rm_c.to(test::kCuda), rv_g = rv_c.to(test::kCuda);
        BatchNormOptions opts, opts_g;
        opts.momentum = opts_g.momentum = 0.3;
        opts.num_batches_tracked = full({}, 5.0, {DType::i64});  // counted by the op, on CUDA by the stats kernel
        opts_g.num_batches_tracked = full({}, 5.0, {DType::i64, test::kCuda});
        for (int step = 0; step < 2; ++step) {
          const Tensor x = test::random_input(bc.x, seed + 10 + step, dt, -2, 3);
          const Tensor w = affine ? test::random_input({C}, seed + 20, dt, 0.5, 1.5) : Tensor();
          const Tensor b = affine ? test::random_input({C}, seed + 21, dt) : Tensor();
          const Tensor yc = batch_norm(x, w, b, rm_c, rv_c, opts);
          test::PoisonGuard poison;
          const Tensor yg = batch_norm(x.to(test::kCuda), affine ? w.to(test::kCuda) : Tensor(),
                                       affine ? b.to(test::kCuda) : Tensor(), rm_g, rv_g, opts_g);
          if (dt != DType::bf16) CHECK(test::compare_to_cpu(yg, yc) == "");
        }
        CHECK(test::compare_to_cpu(rm_g, rm_c, {1e-5, 1e-6}) == "");
        CHECK(test::compare_to_cpu(rv_g, rv_c, {1e-5, 1e-6}) == "");
        CHECK(opts.num_batches_tracked.item() == 7);
        CHECK(opts_g.num_batches_tracked.item() == 7);
      }
}

TEST_CASE("batch_norm train on CUDA through a permuted input and f64 running stats", "[gpu][batch_norm]") {
  // x stored (N, H, C, W), viewed as (N, C, H, W).
  const Tensor base = test::random_input({3, 5, 4, 6}, 4000, DType::f32, -1, 2);
  const Tensor w = test::random_input({4}, 4001, DType::f32, 0.5, 1.5), b = test::random_input({4}, 4002, DType::f32);
  auto f = [](const std::vector<Tensor>& in) {
    return batch_norm(in[0].permute({0, 2, 1, 3}), in[1], in[2], Tensor(), Tensor());
  };
  CHECK(check_graph(f, {base, w, b}, DType::f32, kBnF32, 4003) == "");

  Tensor rm_c = zeros({4}, {DType::f64}), rv_c = ones({4}, {DType::f64});
  Tensor rm_g = rm_c.to(test::kCuda), rv_g = rv_c.to(test::kCuda);
  const Tensor x = base.to(DType::f64).permute({0, 2, 1, 3});
  batch_norm(x, Tensor(), Tensor(), rm_c, rv_c);
  batch_norm(x.to(test::kCuda), Tensor(), Tensor(), rm_g, rv_g);
  CHECK(test::compare_to_cpu(rm_g, rm_c) == "");
  CHECK(test::compare_to_cpu(rv_g, rv_c) == "");
}

TEST_CASE("batch_norm eval forward and backward on CUDA match the CPU", "[gpu][batch_norm]") {
  uint64_t seed = 5000;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (const BnCase& bc : kBnCases)
      for (bool affine : {true, false}) {
        const int64_t C = bc.x[1];
        INFO(bc.name << " " << dtype_name(dt) << (affine ? " affine" : " no affine"));
        const Tensor rm = test::random_input({C}, seed + 1, DType::f32, -0.5, 0.5);
        const Tensor rv = test::random_input({C}, seed + 2, DType::f32, 0.5, 1.5);
        std::vector<Tensor> values = {test::random_input(bc.x, seed += 5, DType::f64, -2, 3)};
        if (affine) {
          values.push_back(test::random_input({C}, seed + 3, DType::f64, 0.5, 1.5));
          values.push_back(test::random_input({C}, seed + 4, DType::f64, -1, 1));
        }
        BatchNormOptions opts;
        opts.mode = BatchNormMode::eval;
        auto f = [affine, rm, rv, opts](const std::vector<Tensor>& in) {
          const Device d = in[0].device();
          return batch_norm(in[0], affine ? in[1] : Tensor(), affine ? in[2] : Tensor(), rm.to(d), rv.to(d), opts);
        };
        CHECK(check_graph(f, values, dt, dt == DType::f64 ? kBnF64 : kBnF32, seed + 5, 1e-2) == "");
      }
}
