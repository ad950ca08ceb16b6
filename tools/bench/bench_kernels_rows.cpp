// bench_kernels blocks of the row and batch-norm kernels: bench_norm_gelu, bench_bn_relu,
// bench_bn_gelu_variants (batch norm, fused activations, GELU) and bench_norm_variants (layer_norm / rms_norm).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/ops.h"
#include "cuda/kernels/batchnorm.cuh"  // bench_bn_gelu_variants
#include "cuda/kernels/rows.cuh"       // bench_norm_variants

namespace ht::bench {

// ---- bench_norm_gelu ----
// Batch norm (train, f32 weight / bias / running stats), GELU, layer_norm and softmax backward in bf16 through
// the op API, in the main table's format (ratio to the copy bandwidth). Backward times are (forward +
// backward) - forward, autograd bookkeeping included. Bytes count the passes over the activation that the
// kernels must make: batch_norm forward 3 (statistics read, normalize read + write), backward 5 (the
// per-channel sums read g and x; dx reads g and x, writes dx); gelu, layer_norm and softmax backward 3 (read
// g and x or y, write gx); gelu forward 2.
void bench_norm_gelu(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(11);
  auto bf16_rand = [&](const Shape& s) { return rand(s, gen, {DType::f32, dev}).to(DType::bf16); };
  auto row = [&](const char* name, int64_t numel, double passes, double ms) {
    const double gbs = passes * 2.0 * static_cast<double>(numel) / ms * 1e-6;
    if (csv) std::printf("%s,%lld,%.4f,%.1f,%.3f\n", name, static_cast<long long>(numel), ms, gbs, gbs / copy_gbs);
    else std::printf("%-34s %12lld %10.4f %10.1f %8.3f\n", name, static_cast<long long>(numel), ms, gbs, gbs / copy_gbs);
  };
  if (!csv) std::printf("\n%-34s %12s %10s %10s %8s\n", "norm / gelu kernels (bf16)", "elements", "ms", "GB/s", "vs copy");
  Tensor keep;
  struct BnCase {
    const char *fwd, *bwd;
    Shape shape;
  };
  for (const BnCase& c : {BnCase{"bn fwd train 256x64x32x32", "bn bwd 256x64x32x32", {256, 64, 32, 32}},
                          BnCase{"bn fwd train NHWC [262144,64]", "bn bwd NHWC [262144,64]", {262144, 64}}}) {
    const int64_t C = c.shape[1];
    Tensor x = bf16_rand(c.shape);
    const Tensor g = bf16_rand(c.shape);
    Tensor w = rand({C}, gen, {DType::f32, dev}), b = rand({C}, gen, {DType::f32, dev});
    const Tensor rm = zeros({C}, {DType::f32, dev}), rv = ones({C}, {DType::f32, dev});
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = batch_norm(x, w, b, rm, rv);
    });
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    const double fb = time_ms([&] {
      x.zero_grad();
      w.zero_grad();
      b.zero_grad();
      batch_norm(x, w, b, rm, rv).backward(g);
    });
    row(c.fwd, x.numel(), 3, fwd);
    row(c.bwd, x.numel(), 5, fb - fwd);
  }
  {  // GELU of a ViT-S/4 MLP activation
    Tensor x = bf16_rand({256 * 65, 1536});
    const Tensor g = bf16_rand({256 * 65, 1536});
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = gelu(x);
    });
    x.set_requires_grad(true);
    const double fb = time_ms([&] {
      x.zero_grad();
      gelu(x).backward(g);
    });
    row("gelu fwd 16640x1536", x.numel(), 2, fwd);
    row("gelu bwd 16640x1536", x.numel(), 3, fb - fwd);
  }
  for (const Shape& s : {Shape{16640, 384}, Shape{50432, 768}}) {  // ViT-S/4 and ViT-B-like rows
    Tensor x = bf16_rand(s), w = bf16_rand({s[1]}), b = bf16_rand({s[1]});
    const Tensor g = bf16_rand(s);
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = layer_norm(x, w, b);
    });
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    const double fb = time_ms([&] {
      x.zero_grad();
      w.zero_grad();
      b.zero_grad();
      layer_norm(x, w, b).backward(g);
    });
    const std::string name = "layer_norm bwd " + std::to_string(s[0]) + "x" + std::to_string(s[1]);
    row(name.c_str(), x.numel(), 3, fb - fwd);
  }
  {
    Tensor x = bf16_rand({16384, 4096});
    const Tensor g = bf16_rand({16384, 4096});
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = softmax(x, 1);
    });
    x.set_requires_grad(true);
    const double fb = time_ms([&] {
      x.zero_grad();
      softmax(x, 1).backward(g);
    });
    row("softmax bwd 16384x4096", x.numel(), 3, fb - fwd);
  }
}
// ---- end bench_norm_gelu ----

// ---- bench_bn_relu ----
// Batch norm + ReLU in bf16 (train, f32 weight / bias / running stats) through the op API: batch_norm then a
// separate relu against batch_norm with BatchNormActivation::relu (one normalize pass; the backward masks g
// inside the batch-norm kernels), and relu(batch_norm + residual) against batch_norm_add_relu (rows "+ add").
// Backward = (forward + backward) - forward, autograd bookkeeping included.
void bench_bn_relu(bool csv) {
  const Device dev = Device::cuda(0);
  Generator gen(13);
  Tensor keep;
  if (csv) std::printf("bn+relu bf16,shape,separate_fwd_ms,fused_fwd_ms,separate_bwd_ms,fused_bwd_ms\n");
  else std::printf("\n%-34s %12s %10s %12s %10s\n", "bn+relu bf16 (train)", "sep fwd ms", "fused fwd", "sep bwd ms",
                   "fused bwd");
  struct Case {
    const char* name;
    Shape shape;
  };
  for (const Case& c : {Case{"NCHW 256x64x32x32", {256, 64, 32, 32}}, Case{"NHWC [262144,64]", {262144, 64}},
                        Case{"NHWC [16384,256]", {16384, 256}}}) {
    const int64_t C = c.shape[1];
    Tensor x = uniform(c.shape, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16).detach();
    const Tensor g = uniform(c.shape, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16);
    Tensor w = rand({C}, gen, {DType::f32, dev}), b = uniform({C}, -0.5, 0.5, gen, {DType::f32, dev});
    const Tensor rm = zeros({C}, {DType::f32, dev}), rv = ones({C}, {DType::f32, dev});
    Tensor res = uniform(c.shape, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16).detach();
    BatchNormOptions fused;
    fused.activation = BatchNormActivation::relu;
    for (const bool add_res : {false, true}) {
      const std::function<Tensor()> separate = [&] {
        return add_res ? relu(add(batch_norm(x, w, b, rm, rv), res)) : relu(batch_norm(x, w, b, rm, rv));
      };
      const std::function<Tensor()> one = [&] {
        return add_res ? batch_norm_add_relu(x, res, {w, b, rm, rv}, fused) : batch_norm(x, w, b, rm, rv, fused);
      };
      const double sep_fwd = time_ms([&] {
        NoGradGuard no_grad;
        keep = separate();
      });
      const double fus_fwd = time_ms([&] {
        NoGradGuard no_grad;
        keep = one();
      });
      for (Tensor* t : {&x, &w, &b, &res}) t->set_requires_grad(true);
      auto fb = [&](const std::function<Tensor()>& f) {
        return time_ms([&] {
          for (Tensor* t : {&x, &w, &b, &res}) t->zero_grad();
          f().backward(g);
        });
      };
      const double sep_bwd = fb(separate) - sep_fwd, fus_bwd = fb(one) - fus_fwd;
      for (Tensor* t : {&x, &w, &b, &res}) t->set_requires_grad(false);
      const std::string name = std::string(add_res ? "+ add " : "") + c.name;
      if (csv) std::printf("bn+relu,%s,%.4f,%.4f,%.4f,%.4f\n", name.c_str(), sep_fwd, fus_fwd, sep_bwd, fus_bwd);
      else std::printf("%-34s %12.4f %10.4f %12.4f %10.4f\n", name.c_str(), sep_fwd, fus_fwd, sep_bwd, fus_bwd);
    }
  }
}
// ---- end bench_bn_relu ----

// ---- bench_bn_gelu_variants ----
// The norm / gelu rows of bench_norm_gelu (bf16, train, f32 weight / bias / running stats; same byte counts:
// bn forward 3 passes, backward 5, gelu forward 2) and the fused bn+relu rows of bench_bn_relu, on the kept
// batch-norm and GELU forward kernels (Note [Batch-norm kernels] in cuda/kernels/batchnorm.cu, Note [GELU forward
// kernel] in cuda/kernels/elementwise.cu).
// Backward = (forward + backward) - forward, autograd bookkeeping included. Rows "bn kernels ...": the
// batch-norm launchers alone (statistics + normalize, sums + dx), without the op layer.
void bench_bn_gelu_variants(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(17);
  auto bf16_rand = [&](const Shape& s) {
    return uniform(s, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16).detach();
  };
  auto ratio = [&](int64_t numel, double passes, double ms) {
    return passes * 2.0 * static_cast<double>(numel) / ms * 1e-6 / copy_gbs;
  };
  if (csv) std::printf("bn/gelu kernels,elements,ms,ratio_to_copy\n");
  else std::printf("\n%-36s %12s %9s %7s\n", "bn / gelu kernels (bf16)", "elements", "ms", "vs copy");
  auto print = [&](const std::string& name, int64_t numel, double passes, double ms) {
    const double r = ratio(numel, passes, ms);
    if (csv) std::printf("%s,%lld,%.4f,%.3f\n", name.c_str(), static_cast<long long>(numel), ms, r);
    else std::printf("%-36s %12lld %9.4f %7.3f\n", name.c_str(), static_cast<long long>(numel), ms, r);
  };
  Tensor keep;
  struct BnCase {
    const char* name;
    Shape shape;
    BatchNormActivation act;
    bool residual;
  };
  const BnCase cases[] = {
      {"bn 256x64x32x32", {256, 64, 32, 32}, BatchNormActivation::none, false},
      {"bn NHWC [262144,64]", {262144, 64}, BatchNormActivation::none, false},
      {"bn+relu 256x64x32x32", {256, 64, 32, 32}, BatchNormActivation::relu, false},
      {"bn+relu NHWC [262144,64]", {262144, 64}, BatchNormActivation::relu, false},
      {"bn+relu NHWC [16384,256]", {16384, 256}, BatchNormActivation::relu, false},
      {"bn+add+relu 256x64x32x32", {256, 64, 32, 32}, BatchNormActivation::relu, true},
      {"bn+add+relu NHWC [262144,64]", {262144, 64}, BatchNormActivation::relu, true},
  };
  for (const BnCase& c : cases) {
    const int64_t C = c.shape[1];
    Tensor x = bf16_rand(c.shape), res = bf16_rand(c.shape);
    const Tensor g = bf16_rand(c.shape);
    Tensor w = rand({C}, gen, {DType::f32, dev}), b = uniform({C}, -0.5, 0.5, gen, {DType::f32, dev});
    const Tensor rm = zeros({C}, {DType::f32, dev}), rv = ones({C}, {DType::f32, dev});
    BatchNormOptions opts;
    opts.activation = c.act;
    auto fwd_op = [&] {
      return c.residual ? batch_norm_add_relu(x, res, {w, b, rm, rv}, opts) : batch_norm(x, w, b, rm, rv, opts);
    };
    for (Tensor* t : {&x, &w, &b, &res}) t->set_requires_grad(false);
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = fwd_op();
    });
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    res.set_requires_grad(c.residual);
    const double fb = time_ms([&] {
      for (Tensor* t : {&x, &w, &b, &res}) t->zero_grad();
      fwd_op().backward(g);
    });
    const double bwd = fb - fwd;
    // passes: fwd 3 (+1 residual read), bwd 5 (+1 residual read, +1 residual gradient write)
    print(std::string(c.name) + " fwd train", x.numel(), c.residual ? 4 : 3, fwd);
    print(std::string(c.name) + " bwd", x.numel(), c.residual ? 7 : 5, bwd);
  }
  {  // GELU of a ViT-S/4 MLP activation, as bench_norm_gelu
    const Tensor x = bf16_rand({256 * 65, 1536});
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = gelu(x);
    });
    print("gelu fwd 16640x1536", x.numel(), 2, fwd);
  }
  // The batch-norm launchers alone on preallocated buffers (no op, allocation or autograd work; the legacy
  // stream, as time_ms's events): forward = statistics + normalize, backward = sums + dx. Against the rows
  // above, the difference is the op layer's host and allocation cost.
  struct KCase {
    const char* name;
    Shape shape;
    kernels::BnShape s;
  };
  // channels-last: the four stages of a ResNet-34 CIFAR at batch 256 (the tickets threshold, kClTicketsMinC)
  const KCase kcases[] = {{"bn kernels 256x64x32x32", {256, 64, 32, 32}, {256, 64, 1024}},
                          {"bn kernels NHWC [262144,64]", {262144, 64}, {262144, 64, 1}},
                          {"bn kernels NHWC [65536,128]", {65536, 128}, {65536, 128, 1}},
                          {"bn kernels NHWC [16384,256]", {16384, 256}, {16384, 256, 1}},
                          {"bn kernels NHWC [4096,512]", {4096, 512}, {4096, 512, 1}}};
  for (const KCase& c : kcases) {
    const int64_t C = c.s.C;
    const Tensor x = bf16_rand(c.shape), g = bf16_rand(c.shape);
    const Tensor y = empty(c.shape, {DType::bf16, dev}), gx = empty(c.shape, {DType::bf16, dev});
    const Tensor w = rand({C}, gen, {DType::f32, dev}), b = uniform({C}, -0.5, 0.5, gen, {DType::f32, dev});
    const Tensor rm = zeros({C}, {DType::f32, dev}), rv = ones({C}, {DType::f32, dev});
    const Tensor gw = empty({C}, {DType::f32, dev}), gb = empty({C}, {DType::f32, dev});
    const Tensor stats = empty({4, C}, {DType::f64, dev});  // mean, invstd, sum_g, sum_gxhat
    auto* st = static_cast<double*>(stats.data_ptr());
    kernels::BnChannels ch;
    ch.mean = st;
    ch.invstd = st + C;
    ch.weight = {w.data_ptr(), DType::f32};
    ch.bias = {b.data_ptr(), DType::f32};
    const kernels::BnRunning run{rm.data_ptr(), rv.data_ptr(), DType::f32, 0.1};
    kernels::BnBackwardSums sums;
    sums.sum_g = st + 2 * C;
    sums.sum_gxhat = st + 3 * C;
    sums.grad_weight = {gw.data_ptr(), DType::f32};
    sums.grad_bias = {gb.data_ptr(), DType::f32};
    const double fwd = time_ms([&] {
      kernels::launch_bn_stats(DType::bf16, x.data_ptr(), c.s, 1e-5, run, st, st + C, nullptr);
      kernels::launch_bn_normalize(DType::bf16, x.data_ptr(), c.s, ch, y.data_ptr(), nullptr);
    });
    const double bwd = time_ms([&] {
      kernels::launch_bn_backward_reduce(DType::bf16, g.data_ptr(), x.data_ptr(), c.s, ch, sums, nullptr);
      kernels::launch_bn_backward_dx(DType::bf16, kernels::BnMode::train, g.data_ptr(), x.data_ptr(), c.s, ch,
                                     sums.sum_g, sums.sum_gxhat, gx.data_ptr(), nullptr);
    });
    print(std::string(c.name) + " fwd", x.numel(), 3, fwd);
    print(std::string(c.name) + " bwd", x.numel(), 5, bwd);
    // Each launcher alone (passes: statistics 1, normalize 2, sums 2, dx 3; the elementwise passes then read
    // x from DRAM, not from the L2 the reduction left it in).
    const double t_stats = time_ms(
        [&] { kernels::launch_bn_stats(DType::bf16, x.data_ptr(), c.s, 1e-5, run, st, st + C, nullptr); });
    const double t_norm =
        time_ms([&] { kernels::launch_bn_normalize(DType::bf16, x.data_ptr(), c.s, ch, y.data_ptr(), nullptr); });
    const double t_sums = time_ms([&] {
      kernels::launch_bn_backward_reduce(DType::bf16, g.data_ptr(), x.data_ptr(), c.s, ch, sums, nullptr);
    });
    const double t_dx = time_ms([&] {
      kernels::launch_bn_backward_dx(DType::bf16, kernels::BnMode::train, g.data_ptr(), x.data_ptr(), c.s, ch,
                                     sums.sum_g, sums.sum_gxhat, gx.data_ptr(), nullptr);
    });
    print(std::string(c.name) + "  stats only", x.numel(), 1, t_stats);
    print(std::string(c.name) + "  normalize only", x.numel(), 2, t_norm);
    print(std::string(c.name) + "  bwd sums only", x.numel(), 2, t_sums);
    print(std::string(c.name) + "  dx only", x.numel(), 3, t_dx);
  }
}
// ---- end bench_bn_gelu_variants ----

// ---- bench_norm_variants ----
// layer_norm / rms_norm in bf16 (bf16 weight and bias) on the kernels launch_norm and launch_norm_backward pick
// (Note [Norm kernels] in cuda/kernels/rows_norm.cu).
// Op rows: through the op API. Forward: 2 passes (read x, write y) over the forward time; backward: 3 passes
// (read x and g, write gx) over (forward + backward) - forward, as bench_norm_gelu counts them: that time also
// holds the parameter gradients' partial sums and finalize launch, autograd's bookkeeping, the output and
// gradient allocations and zero_grad's memsets, which weigh at the smaller shapes.
// "kernels" rows: the launchers alone on preallocated buffers (forward: launch_norm; backward:
// launch_norm_backward with the fused partial sums, or launch_norm_param_grad where there are none, then
// launch_norm_param_finalize), the legacy stream, as time_ms's events.
// Columns: the time, the ratio to the copy floor (the 1 GB clone of the main table) and "vs same":
// the ratio to a device-to-device copy (cudaMemcpyAsync) of the same traffic (bytes read + written: forward
// D elements per row, backward 1.5 D), timed the same way; "copy ms" is that copy's time. At these sizes the
// L2 (50 MB on the H200) holds part of the data between back-to-back launches, for the copy as for the norm:
// "vs same" compares like with like, "vs copy" against HBM streaming.
// Last row: the bf16 GELU forward at 16640 x 1536.
// HADATRAIN_BENCH_NORM=S runs only the cases whose "op RxD" name contains S (e.g. 16640x384; "gelu");
// HADATRAIN_BENCH_NORM_PROFILE=1 (for Nsight Compute) skips the op rows and times nothing: per case the
// launchers run once each (forward, forward again for the statistics, backward, finalize).
void bench_norm_variants(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(12);
  auto bf16_rand = [&](const Shape& s) { return rand(s, gen, {DType::f32, dev}).to(DType::bf16); };
  if (csv) std::printf("norm kernels,elements,copy ms,ms,ratio_to_copy,ratio_to_same_size_copy\n");
  else std::printf("\n%-38s %10s %8s %10s %7s %7s\n", "norm kernels (bf16)", "elements", "copy ms", "ms", "vs copy",
                   "vs same");
  // bytes: traffic of the row (read + write); same_ms: the same-size copy's time
  auto print = [&](const std::string& name, int64_t numel, double passes, double same_ms, double ms) {
    const double bytes = passes * 2.0 * static_cast<double>(numel);
    const double ratio = bytes / ms * 1e-6 / copy_gbs, same = same_ms / ms;
    if (csv) std::printf("%s,%lld,%.4f,%.4f,%.3f,%.3f\n", name.c_str(), static_cast<long long>(numel), same_ms, ms, ratio, same);
    else std::printf("%-38s %10lld %8.4f %10.4f %7.3f %7.3f\n", name.c_str(), static_cast<long long>(numel), same_ms, ms,
                     ratio, same);
  };
  // a device-to-device copy moving `bytes` in all (bytes / 2 read, bytes / 2 written)
  auto copy_ms = [&](double bytes) {
    const int64_t half = static_cast<int64_t>(bytes / 2);
    const Tensor src = empty({half}, {DType::u8, dev}), dst = empty({half}, {DType::u8, dev});
    cudaMemsetAsync(src.data_ptr(), 0, static_cast<std::size_t>(half), nullptr);
    return time_ms([&] {
      cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<std::size_t>(half), cudaMemcpyDeviceToDevice, nullptr);
    });
  };
  struct Case {
    const char* op;
    Shape shape;
    bool rms;
  };
  const char* const only = std::getenv("HADATRAIN_BENCH_NORM");
  const bool profile = std::getenv("HADATRAIN_BENCH_NORM_PROFILE") != nullptr;
  std::vector<Case> cases;
  for (const Case& c : {Case{"layer_norm", {16384, 4096}, false}, Case{"layer_norm", {50432, 768}, false},
                        Case{"layer_norm", {16640, 384}, false}, Case{"rms_norm", {16384, 4096}, true},
                        Case{"rms_norm", {50432, 768}, true}}) {
    const std::string name = std::string(c.op) + " " + std::to_string(c.shape[0]) + "x" + std::to_string(c.shape[1]);
    if (only == nullptr || name.find(only) != std::string::npos) cases.push_back(c);
  }
  // time_ms, or (profile) one run
  auto timed = [&](const std::function<void()>& fn) {
    if (!profile) return time_ms(fn);
    fn();
    cudaDeviceSynchronize();
    return 0.0;
  };
  for (const Case& c : cases) {
    if (profile) break;
    Tensor x = bf16_rand(c.shape), w = bf16_rand({c.shape[1]}), b = bf16_rand({c.shape[1]});
    const Tensor g = bf16_rand(c.shape);
    auto fwd_op = [&] { return c.rms ? rms_norm(x, w) : layer_norm(x, w, b); };
    x.set_requires_grad(false);
    w.set_requires_grad(false);
    b.set_requires_grad(false);
    Tensor keep;
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      keep = fwd_op();
    });
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(!c.rms);
    const double fb = time_ms([&] {
      x.zero_grad();
      w.zero_grad();
      b.zero_grad();
      fwd_op().backward(g);
    });
    const double bwd = fb - fwd;
    const int64_t numel = c.shape[0] * c.shape[1];
    const std::string shape = std::to_string(c.shape[0]) + "x" + std::to_string(c.shape[1]);
    print(std::string(c.op) + " fwd " + shape, numel, 2, copy_ms(2 * 2.0 * numel), fwd);
    print(std::string(c.op) + " bwd " + shape, numel, 3, copy_ms(3 * 2.0 * numel), bwd);
  }
  // The launchers alone on preallocated buffers.
  for (const Case& c : cases) {
    const int64_t rows = c.shape[0], d = c.shape[1], numel = rows * d;
    const kernels::NormKind kind = c.rms ? kernels::NormKind::rms : kernels::NormKind::layer;
    const Tensor x = bf16_rand(c.shape), g = bf16_rand(c.shape), w = bf16_rand({d}), b = bf16_rand({d});
    const Tensor y = empty(c.shape, {DType::bf16, dev}), gx = empty(c.shape, {DType::bf16, dev});
    const Tensor mean = empty({rows}, {DType::f32, dev}), rstd = empty({rows}, {DType::f32, dev});
    const Tensor gw = empty({d}, {DType::bf16, dev}), gb = empty({d}, {DType::bf16, dev});
    kernels::NormArgs fa{DType::bf16, kind, y.data_ptr(), c.rms ? nullptr : mean.data_ptr(), rstd.data_ptr(),
                         x.data_ptr(), w.data_ptr(), c.rms ? nullptr : b.data_ptr(), rows, d, 1e-5};
    fa.weight_narrow = true;
    fa.bias_narrow = !c.rms;
    const double fwd = timed([&] { kernels::launch_norm(fa, nullptr); });
    kernels::launch_norm(fa, nullptr);  // the statistics for the backward
    kernels::NormBackwardArgs ba{DType::bf16, kind, gx.data_ptr(), g.data_ptr(), x.data_ptr(),
                                 c.rms ? nullptr : mean.data_ptr(), rstd.data_ptr(), w.data_ptr(), rows, d};
    ba.weight_narrow = true;
    const int fused = kernels::norm_backward_partials(ba);
    const int64_t parts = fused > 0 ? fused : kernels::norm_param_splits(rows, d);
    const Tensor pw = empty({parts, d}, {DType::f32, dev});
    const Tensor pb = c.rms ? Tensor() : empty({parts, d}, {DType::f32, dev});
    if (fused > 0) {
      ba.gw_partial = pw.data_ptr();
      ba.gb_partial = pb.defined() ? pb.data_ptr() : nullptr;
    }
    const kernels::NormParamFinalizeArgs fin{DType::f32, pw.data_ptr(), pb.defined() ? pb.data_ptr() : nullptr,
                                             gw.data_ptr(), DType::bf16, pb.defined() ? gb.data_ptr() : nullptr,
                                             DType::bf16, parts, d};
    const double bwd = timed([&] {
      kernels::launch_norm_backward(ba, nullptr);
      if (fused == 0)
        kernels::launch_norm_param_grad({DType::bf16, kind, pw.data_ptr(), pb.defined() ? pb.data_ptr() : nullptr,
                                         g.data_ptr(), x.data_ptr(), c.rms ? nullptr : mean.data_ptr(),
                                         rstd.data_ptr(), rows, d},
                                        nullptr);
      kernels::launch_norm_param_finalize(fin, nullptr);
    });
    if (profile) continue;
    const std::string shape = std::to_string(rows) + "x" + std::to_string(d);
    print(std::string("kernels ") + c.op + " fwd " + shape, numel, 2, copy_ms(2 * 2.0 * numel), fwd);
    print(std::string("kernels ") + c.op + " bwd " + shape, numel, 3, copy_ms(3 * 2.0 * numel), bwd);
  }
  // The bf16 GELU (erf) forward of a ViT-S/4 MLP activation (Note [GELU forward kernel] in
  // cuda/kernels/elementwise.cu), through the op API; 2 passes.
  if (profile || (only != nullptr && std::string("gelu 16640x1536").find(only) == std::string::npos)) return;
  {
    const Tensor x = bf16_rand({256 * 65, 1536});
    Tensor keep;
    const double ms = time_ms([&] {
      NoGradGuard no_grad;
      keep = gelu(x);
    });
    print("gelu fwd 16640x1536", x.numel(), 2, copy_ms(2 * 2.0 * static_cast<double>(x.numel())), ms);
  }
}
// ---- end bench_norm_variants ----

}  // namespace ht::bench
