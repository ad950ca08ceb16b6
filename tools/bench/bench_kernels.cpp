// Kernel benchmark (CUDA builds): times the elementwise, conversion, reduction and row kernels through the op
// API on large tensors and reports achieved bandwidth and its ratio to the measured copy bandwidth (the
// floor: a same-dtype clone reads and writes every byte once). Timing: CUDA events around `iters`
// back-to-back launches after a warm-up, median of `reps` such batches. GEMM rows (bench_gemm) report TFLOP/s.
// Usage: bench_kernels [elements = 268435456] [--csv] [--only BLOCK[,BLOCK...]]
// Blocks: main (the table above), gemm, lowp, conv, attention, attention_packed, grad_quant, hla, norm_gelu,
// norm_variants, bn_relu, bn_gelu; --only (or env HADATRAIN_BENCH_ONLY) runs the listed ones, e.g. to profile
// one block under Nsight Compute. HADATRAIN_BENCH_ATTN="D:T" restricts the attention block to one case.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/cuda/gemm.h"
#include "hadatrain/grad/hla.h"    // bench_hla
#include "hadatrain/grad/quant.h"  // bench_grad_quant
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "kernels/batchnorm.h"        // bench_bn_gelu_variants
#include "kernels/flash_attention.h"  // bench_attention (backward variants)
#include "kernels/rows.h"             // bench_norm_variants
#include "kernels/elementwise.h"      // bench_norm_variants (GELU forward variants)

using namespace ht;

namespace {

double time_ms(const std::function<void()>& fn, int iters = 10, int reps = 7) {
  fn();  // warm-up (and allocator caching)
  cudaDeviceSynchronize();
  std::vector<double> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, nullptr);
    for (int i = 0; i < iters; ++i) fn();
    cudaEventRecord(b, nullptr);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(static_cast<double>(t) / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string name;
  double bytes;
  double ms;
};

// Matrix products through matmul (cuBLASLt), reported in TFLOP/s (2·M·N·K per product). f32 runs without
// TF32 (the default), as the PyTorch side does with allow_tf32 = False.
void bench_gemm(bool csv) {
  struct Shape3 {
    DType dt;
    int64_t m, k, n;
  };
  const Shape3 shapes[] = {{DType::bf16, 8192, 4096, 11008}, {DType::bf16, 8192, 4096, 4096}, {DType::f32, 4096, 4096, 4096}};
  Generator gen(2);
  if (csv) std::printf("gemm,dtype,M,N,K,ms,TFLOP/s\n");
  else std::printf("\n%-34s %10s %10s\n", "gemm (M x K @ K x N)", "ms", "TFLOP/s");
  for (const Shape3& s : shapes) {
    const Tensor a = rand({s.m, s.k}, gen, {DType::f32, Device::cuda(0)}).to(s.dt);
    const Tensor b = rand({s.k, s.n}, gen, {DType::f32, Device::cuda(0)}).to(s.dt);
    Tensor c;
    const double ms = time_ms([&] { c = matmul(a, b); });
    const double tflops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) / ms * 1e-9;
    const std::string name = std::string("matmul ") + std::string(dtype_name(s.dt)) + " " + std::to_string(s.m) + "x" +
                             std::to_string(s.k) + " @ " + std::to_string(s.k) + "x" + std::to_string(s.n);
    if (csv) std::printf("%s,%s,%lld,%lld,%lld,%.4f,%.1f\n", name.c_str(), std::string(dtype_name(s.dt)).c_str(),
                         static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k), ms, tflops);
    else std::printf("%-34s %10.4f %10.1f\n", name.c_str(), ms, tflops);
  }
}

// ---- bench_lowp_gemm (helper lowp) ----
// Low-precision products out (M, N) = a (M, K) · b (N, K)ᵀ: int8 -> int32 (int8_matmul_nt) and fp8 e4m3 ->
// bf16 with device scales (fp8_matmul_nt, precise accumulation; one extra row with cuBLASLt's fast fp8
// accumulation through the raw API), in T(FL)OP/s (2·M·N·K per product) and as a ratio to the bf16 GEMM of
// the same shape and layout (matmul(a, bᵀ view)) measured here. "path" says how cuda::gemm_lowp_nt ran
// (cublaslt = in place, no padding copies). Target: fp8 >= 1.6x bf16 on 8192x4096x11008.
void bench_lowp_gemm(bool csv) {
  struct Mkn {
    int64_t m, k, n;
  };
  const Mkn shapes[] = {{8192, 4096, 11008}, {8192, 4096, 4096}, {8192, 11008, 4096}};
  const Device dev = Device::cuda(0);
  Generator gen(4);
  if (csv) std::printf("lowp gemm,M,K,N,ms,TOP/s,ratio_to_bf16,path\n");
  else std::printf("\n%-44s %10s %10s %8s  %s\n", "lowp gemm (M x K . (N x K)^T)", "ms", "T(FL)OP/s", "vs bf16", "path");
  for (const Mkn& s : shapes) {
    const double ops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const Tensor af = sub(mul(rand({s.m, s.k}, gen, {DType::f32, dev}), 2.0), 1.0);
    const Tensor bf = sub(mul(rand({s.n, s.k}, gen, {DType::f32, dev}), 2.0), 1.0);
    const Tensor a16 = af.to(DType::bf16), b16 = bf.to(DType::bf16);
    const Tensor a8 = mul(af, 127.0).to(DType::i8), b8 = mul(bf, 127.0).to(DType::i8);
    const Tensor af8 = mul(af, 4.0).to(DType::f8e4m3), bf8 = mul(bf, 4.0).to(DType::f8e4m3);
    const Tensor sa = full({1}, 0.25, {DType::f32, dev}), sb = full({1}, 0.25, {DType::f32, dev});
    Tensor keep;
    const double bf16_ms = time_ms([&] { keep = matmul(a16, b16.transpose(0, 1)); });
    const double i8_ms = time_ms([&] { keep = int8_matmul_nt(a8, b8); });
    const double f8_ms = time_ms([&] { keep = fp8_matmul_nt(af8, bf8, sa, sb, DType::bf16); });
    // The raw API: which path each product takes, and fp8 with fast accumulation.
    const Tensor out16 = empty({s.m, s.n}, {DType::bf16, dev}), out32 = empty({s.m, s.n}, {DType::i32, dev});
    auto raw = [&](bool fp8, cuda::Fp8Accum accum) {
      cuda::LowpGemmArgs g;
      g.a_dtype = g.b_dtype = fp8 ? DType::f8e4m3 : DType::i8;
      g.c_dtype = fp8 ? DType::bf16 : DType::i32;
      g.m = s.m;
      g.n = s.n;
      g.k = s.k;
      g.a = fp8 ? af8.data_ptr() : a8.data_ptr();
      g.b = fp8 ? bf8.data_ptr() : b8.data_ptr();
      g.c = fp8 ? out16.data_ptr() : out32.data_ptr();
      g.lda = g.ldb = s.k;
      g.ldc = s.n;
      if (fp8) {
        g.scale_a = static_cast<const float*>(sa.data_ptr());
        g.scale_b = static_cast<const float*>(sb.data_ptr());
        g.accum = accum;
      }
      return cuda::gemm_lowp_nt(g);
    };
    const cuda::LowpPath i8_path = raw(false, cuda::Fp8Accum::precise);
    const cuda::LowpPath f8_path = raw(true, cuda::Fp8Accum::precise);
    const cuda::LowpPath fast_path = raw(true, cuda::Fp8Accum::fast);
    const double fast_ms = time_ms([&] { raw(true, cuda::Fp8Accum::fast); });
    const std::string dims = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    struct R {
      std::string name;
      double ms;
      const char* path;
    };
    const R rows[] = {{"bf16 matmul(a, b^T) " + dims, bf16_ms, "-"},
                      {"int8 -> i32 " + dims, i8_ms, cuda::lowp_path_name(i8_path)},
                      {"fp8 e4m3 -> bf16 " + dims, f8_ms, cuda::lowp_path_name(f8_path)},
                      {"fp8 e4m3 -> bf16 fast-accum " + dims, fast_ms, cuda::lowp_path_name(fast_path)}};
    for (const R& r : rows) {
      const double tops = ops / r.ms * 1e-9, ratio = bf16_ms / r.ms;
      if (csv) std::printf("%s,%lld,%lld,%lld,%.4f,%.1f,%.3f,%s\n", r.name.c_str(), static_cast<long long>(s.m),
                           static_cast<long long>(s.k), static_cast<long long>(s.n), r.ms, tops, ratio, r.path);
      else std::printf("%-44s %10.4f %10.1f %8.3f  %s\n", r.name.c_str(), r.ms, tops, ratio, r.path);
    }
  }
}
// ---- end bench_lowp_gemm ----

// conv2d and batch norm of a ResNet-18 CIFAR layer in bf16 (N = 256, C = 128, 16x16, 3x3 pad 1, no bias):
// conv through cuDNN, forward alone and forward + backward (data and filter gradients), reported in
// TFLOP/s (forward 2·N·O·OH·OW·C·KH·KW FLOPs, backward twice that); batch norm in train mode with f32
// weight, bias and running stats, forward + backward, reported in GB/s of its minimum traffic (forward
// reads x and writes y, backward reads g and x and writes dx). The PyTorch side runs the same calls.
void bench_conv_bn(bool csv) {
  const Device dev = Device::cuda(0);
  Generator gen(3);
  const int64_t N = 256, C = 128, H = 16, W = 16;
  Tensor x = rand({N, C, H, W}, gen, {DType::f32, dev}).to(DType::bf16);
  Tensor w = mul(rand({C, C, 3, 3}, gen, {DType::f32, dev}), 0.05).to(DType::bf16);
  const Tensor g = rand({N, C, H, W}, gen, {DType::f32, dev}).to(DType::bf16);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const double flops = 2.0 * static_cast<double>(N * C * H * W * C * 9);
  Tensor keep;
  const double fwd_ms = time_ms([&] {
    NoGradGuard no_grad;
    keep = conv2d(x, w, Tensor(), p);
  });
  const double fb_ms = time_ms([&] {
    x.zero_grad();
    w.zero_grad();
    conv2d(x, w, Tensor(), p).backward(g);
  });
  Tensor bw = rand({C}, gen, {DType::f32, dev}), bb = rand({C}, gen, {DType::f32, dev});
  bw.set_requires_grad(true);
  bb.set_requires_grad(true);
  const Tensor rm = zeros({C}, {DType::f32, dev}), rv = ones({C}, {DType::f32, dev});
  const double bn_ms = time_ms([&] {
    x.zero_grad();
    bw.zero_grad();
    bb.zero_grad();
    batch_norm(x, bw, bb, rm, rv).backward(g);
  });
  const double bn_bytes = 5.0 * 2.0 * static_cast<double>(N * C * H * W);
  if (csv) {
    std::printf("layer,ms,TFLOP/s or GB/s\n");
    std::printf("conv2d bf16 fwd (256x128x16x16 3x3),%.4f,%.1f\n", fwd_ms, flops / fwd_ms * 1e-9);
    std::printf("conv2d bf16 fwd+bwd (256x128x16x16 3x3),%.4f,%.1f\n", fb_ms, 3 * flops / fb_ms * 1e-9);
    std::printf("batch_norm bf16 fwd+bwd (256x128x16x16),%.4f,%.1f\n", bn_ms, bn_bytes / bn_ms * 1e-6);
  } else {
    std::printf("\n%-42s %10s %10s\n", "layer (ResNet-18 CIFAR, bf16)", "ms", "TFLOP/s");
    std::printf("%-42s %10.4f %10.1f\n", "conv2d fwd 256x128x16x16 3x3", fwd_ms, flops / fwd_ms * 1e-9);
    std::printf("%-42s %10.4f %10.1f\n", "conv2d fwd+bwd 256x128x16x16 3x3", fb_ms, 3 * flops / fb_ms * 1e-9);
    std::printf("%-42s %10s %10s\n", "", "ms", "GB/s");
    std::printf("%-42s %10.4f %10.1f\n", "batch_norm fwd+bwd 256x128x16x16", bn_ms, bn_bytes / bn_ms * 1e-6);
  }
}

// ---- bench_grad_quant (helper quant) ----
// grad::quantize of a gradient as the HLQ paths run it, bf16 input. g_x path: T = 16 Hadamard blocks, absmax,
// 4 bits, stochastic rounding: (12608, 3072) = ViT-B fc1 g_y at batch 64 (64·197 tokens) with per-token (row)
// scales is the fused kernel (int8 and e4m3 values, and with max |g_y| reported for the g_w path); (64,
// 197·3072) with per-sample scales the two-pass path (x read twice). g_w path (identity HLA plan): 8 bits,
// one absmax scale, stochastic, values written K-major (3072, 12608): two-pass, and with the maximum given
// (one read). Conv g_x path: (256·1024, 64) g_y, T 16, per-row scales, 4 bits, stochastic: e4m3 levels, then
// the dequantised bf16 values level · scale written directly (values_dtype bf16), then the three passes it
// replaces (e4m3 levels, dequantize to f32, conversion to bf16). GB/s counts the minimum traffic, bf16 read
// once (2 B/element) + the values written once (1 B/element, 2 for bf16) + f32 scales, and is compared with
// the copy bandwidth measured in main().
void bench_grad_quant(bool csv, double copy_gbs) {
  struct Case {
    const char* name;
    int64_t rows, cols;
    grad::Granularity granularity;
    int bits;
    int64_t block;
    DType values;
    grad::ValuesLayout layout;
    bool report, known;
  };
  using grad::Granularity;
  using grad::ValuesLayout;
  const Case cases[] = {
      {"quantize bf16 (12608, 3072) row T16 SR4", 12608, 3072, Granularity::row, 4, 16, DType::i8,
       ValuesLayout::natural, false, false},
      {"  e4m3 values", 12608, 3072, Granularity::row, 4, 16, DType::f8e4m3, ValuesLayout::natural, false, false},
      {"  e4m3 values + max |x|", 12608, 3072, Granularity::row, 4, 16, DType::f8e4m3, ValuesLayout::natural, true,
       false},
      {"quantize bf16 (64, 197*3072) sample T16 SR4", 64, 197 * 3072, Granularity::sample, 4, 16, DType::i8,
       ValuesLayout::natural, false, false},
      {"quantize bf16 (12608, 3072) tensor SR8 K-major", 12608, 3072, Granularity::tensor, 8, 1, DType::i8,
       ValuesLayout::transposed, false, false},
      {"  known max |x|", 12608, 3072, Granularity::tensor, 8, 1, DType::i8, ValuesLayout::transposed, false, true},
      {"quantize bf16 (262144, 64) row T16 SR4 e4m3", 256 * 1024, 64, Granularity::row, 4, 16, DType::f8e4m3,
       ValuesLayout::natural, false, false},
      {"  bf16 dequantised values", 256 * 1024, 64, Granularity::row, 4, 16, DType::bf16, ValuesLayout::natural,
       false, false}};
  const Device dev = Device::cuda(0);
  Generator gen(5);
  if (csv) std::printf("grad quant,ms,GB/s,ratio_to_copy\n");
  else std::printf("\n%-46s %10s %10s %8s\n", "grad quant", "ms", "GB/s", "vs copy");
  for (const Case& c : cases) {
    const Tensor x = rand({c.rows, c.cols}, gen, {DType::f32, dev}).to(DType::bf16);
    grad::QuantSpec spec;
    spec.bits = c.bits;
    spec.granularity = c.granularity;
    spec.scale_rule = grad::ScaleRule::absmax;
    spec.rounding = grad::Rounding::stochastic;
    spec.hadamard_block = c.block;
    spec.noise = {7, 1};
    spec.values_dtype = c.values;
    spec.layout = c.layout;
    spec.report_input_absmax = c.report;
    if (c.known) {
      grad::QuantSpec r;
      r.report_input_absmax = true;
      spec.known_absmax = grad::quantize(x, r).input_absmax;
    }
    grad::Quantized keep;
    const double ms = time_ms([&] { keep = grad::quantize(x, spec); });
    const double elems = static_cast<double>(c.rows) * static_cast<double>(c.cols);
    const double bytes = (2.0 + static_cast<double>(itemsize(c.values))) * elems +
                         4.0 * static_cast<double>(keep.scale.numel());
    const double gbs = bytes / ms * 1e-6;
    if (csv) std::printf("%s,%.4f,%.1f,%.3f\n", c.name, ms, gbs, gbs / copy_gbs);
    else std::printf("%-46s %10.4f %10.1f %8.3f\n", c.name, ms, gbs, gbs / copy_gbs);
    if (c.values != DType::bf16) continue;
    // What values_dtype bf16 replaces: e4m3 levels, dequantize (f32), conversion to bf16. Same minimum traffic.
    spec.values_dtype = DType::f8e4m3;
    Tensor d;
    const double ms3 = time_ms([&] { d = grad::dequantize(grad::quantize(x, spec), c.granularity).to(DType::bf16); });
    const double gbs3 = bytes / ms3 * 1e-6;
    const char* name3 = "  e4m3 + dequantize + to bf16 (3 passes)";
    if (csv) std::printf("%s,%.4f,%.1f,%.3f\n", name3, ms3, gbs3, gbs3 / copy_gbs);
    else std::printf("%-46s %10.4f %10.1f %8.3f\n", name3, ms3, gbs3, gbs3 / copy_gbs);
  }
}
// ---- end bench_grad_quant ----

// ---- bench_hla (helper hla) ----
}  // namespace (the kernel headers below are included at namespace scope)
#include "kernels/hla.h"     // bench_hla: launch_hla_project / launch_hla_project_unfolded
#include "kernels/unfold.h"  // bench_hla: launch_unfold2d for the composition (bench_fold includes it too)
namespace {

kernels::HlaRows hla_rows_of(const grad::HlaPlan& plan) {
  kernels::HlaRows rows{};
  for (int64_t i = 0; i < plan.kept(); ++i) rows.idx[i] = static_cast<int16_t>(plan.rows[static_cast<std::size_t>(i)]);
  return rows;
}

// The HLA projection kernel (kernels/hla.h) through its launchers on preallocated buffers (legacy stream,
// time_ms's events), percentile 50.
// 1. hla_project of a bf16 activation / gradient (B, L, C) as the HLQ g_w path runs it, ResNet shapes:
//    (64, 1024, 256) is a 32x32 map (n = 1024, r = 528), (64, 3136, 64) a 56x56 map (n = 64, r = 36); both
//    output layouts. GB/s counts the minimum traffic, bf16 read once (2 B/element) + the f32 projection written
//    once (4 B per output element). Path "strided" (launch_hla_project). ViT-B token shapes at batch 256: the
//    196 patch tokens of 197 as split_extra projects them (n = 4), and 208 = 197 padded to 16 (n = 16); for
//    n <= 16 in the rows layout the launcher's register kernel ("small", Note [HLA small blocks]) and the slab
//    kernel ("slab").
// 2. hla_project_unfolded (ACBP's projection of a conv's im2col columns) on ResNet-34 CIFAR conv inputs, bf16,
//    channels-last (an (N, H, W, C) buffer read as (N, C, H, W)), batch 256, rows layout (what HLQ uses):
//    "fused" is launch_hla_project_unfolded (the path grad::hla_project_unfolded takes, Note [HLA im2col
//    tiles]), "compose" launch_unfold2d (default unfold variant) + launch_hla_project for comparison. GB/s counts
//    the image read once + the f32 projection written once (the fused path's floor; the composition also
//    writes and reads the columns). Maps of n <= 16 positions per block (4x4, 14x14 = 196) also time the slab
//    kernel ("fused slab") against the register kernel the launcher picks ("fused small").
// "vs copy" compares with the copy bandwidth from main(). HADATRAIN_BENCH_HLA=S runs only the cases whose name
// contains S.
void bench_hla(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(8);
  const char* const only = std::getenv("HADATRAIN_BENCH_HLA");
  auto wanted = [&](const std::string& name) { return only == nullptr || name.find(only) != std::string::npos; };
  auto print_row = [&](const std::string& name, const char* layout, const char* path, const std::string& plan,
                       double ms, double bytes) {
    const double gbs = bytes / ms * 1e-6;
    if (csv) std::printf("%s,%s,%s,%s,%.4f,%.1f,%.3f\n", name.c_str(), layout, path, plan.c_str(), ms, gbs, gbs / copy_gbs);
    else std::printf("%-40s %-9s %-14s %-28s %10.4f %10.1f %8.3f\n", name.c_str(), layout, path, plan.c_str(), ms, gbs,
                     gbs / copy_gbs);
  };
  if (csv) std::printf("hla,layout,path,plan,ms,GB/s,ratio_to_copy\n");
  else std::printf("\n%-40s %-9s %-14s %-28s %10s %10s %8s\n", "hla", "layout", "path", "plan", "ms", "GB/s", "vs copy");

  struct Case {
    const char* name;
    int64_t B, L, C;
    int64_t skip;  // leading tokens of each sample left out (split_extra's view: L of L + skip tokens)
  };
  const Case cases[] = {{"hla_project bf16 (64, 1024, 256)", 64, 1024, 256, 0},
                        {"hla_project bf16 (64, 3136, 64)", 64, 3136, 64, 0},
                        {"hla_project bf16 (256, 196 of 197, 768)", 256, 196, 768, 1},
                        {"hla_project bf16 (256, 196 of 197, 3072)", 256, 196, 3072, 1},
                        {"hla_project bf16 (256, 208, 768)", 256, 208, 768, 0}};
  for (const Case& c : cases) {
    if (!wanted(c.name)) continue;
    const Tensor x = rand({c.B, c.L + c.skip, c.C}, gen, {DType::f32, dev}).to(DType::bf16);
    const grad::HlaPlan plan = grad::hla_plan(c.L, grad::HlaRank{});
    const kernels::HlaRows rows = hla_rows_of(plan);
    const Tensor out = empty({c.B, plan.projected_length(), c.C}, {DType::f32, dev});
    for (grad::HlaLayout layout : {grad::HlaLayout::rows, grad::HlaLayout::channels}) {
      // n <= 16: the register kernel (the launcher's choice), then the slab kernel for comparison
      for (bool slab : {false, true}) {
        const bool small = plan.block <= 16 && layout == grad::HlaLayout::rows;  // the launcher's register kernel
        if (slab && !small) continue;
        kernels::HlaProjectArgs a;
        a.dtype = DType::bf16;
        a.x = static_cast<const bf16*>(x.data_ptr()) + c.skip * c.C;
        a.B = c.B;
        a.L = c.L;
        a.C = c.C;
        a.sb = (c.L + c.skip) * c.C;
        a.sl = c.C;
        a.sc = 1;
        a.block = plan.block;
        a.kept = plan.kept();
        a.channels = layout == grad::HlaLayout::channels;
        a.out = static_cast<float*>(out.data_ptr());
        a.slab_only = slab;
        const double ms = time_ms([&] { kernels::launch_hla_project(a, rows, nullptr); });
        const double bytes = 2.0 * static_cast<double>(c.B * c.L * c.C) + 4.0 * static_cast<double>(out.numel());
        print_row(c.name, layout == grad::HlaLayout::rows ? "rows" : "channels",
                  slab ? "slab" : (small ? "small" : "strided"), plan.describe(), ms, bytes);
      }
    }
  }

  struct ConvCase {
    const char* name;
    int64_t N, C, H, W, k, s, p;
  };
  const ConvCase convs[] = {{"unfolded C64 32x32 3x3 s1 p1", 256, 64, 32, 32, 3, 1, 1},
                            {"unfolded C128 16x16 3x3 s1 p1", 256, 128, 16, 16, 3, 1, 1},
                            {"unfolded C256 8x8 3x3 s1 p1", 256, 256, 8, 8, 3, 1, 1},
                            {"unfolded C512 4x4 3x3 s1 p1", 256, 512, 4, 4, 3, 1, 1},
                            {"unfolded C64 32x32 3x3 s2 p1", 256, 64, 32, 32, 3, 2, 1},
                            {"unfolded C256 14x14 3x3 s1 p1", 128, 256, 14, 14, 3, 1, 1}};
  for (const ConvCase& c : convs) {
    if (!wanted(c.name)) continue;
    kernels::UnfoldGeometry ug;
    ug.N = c.N;
    ug.C = c.C;
    ug.H = c.H;
    ug.W = c.W;
    ug.kh = ug.kw = c.k;
    ug.sh = ug.sw = c.s;
    ug.ph = ug.pw = c.p;
    ug.OH = (c.H + 2 * c.p - c.k) / c.s + 1;
    ug.OW = (c.W + 2 * c.p - c.k) / c.s + 1;
    const int64_t L = ug.OH * ug.OW, K = c.C * c.k * c.k;
    const grad::HlaPlan plan = grad::hla_plan(L, grad::HlaRank{});
    const kernels::HlaRows rows = hla_rows_of(plan);
    const Tensor nhwc = rand({c.N, c.H, c.W, c.C}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor cols = empty({c.N, L, K}, {DType::bf16, dev});
    const Tensor out = empty({c.N, plan.projected_length(), K}, {DType::f32, dev});
    const double bytes = 2.0 * static_cast<double>(nhwc.numel()) + 4.0 * static_cast<double>(out.numel());
    const kernels::UnfoldStrides4 xl{c.H * c.W * c.C, 1, c.W * c.C, c.C};  // (n, c, h, w) strides of NHWC storage
    kernels::HlaProjectArgs a;  // the composition's projection of the materialised columns
    a.dtype = DType::bf16;
    a.x = cols.data_ptr();
    a.B = c.N;
    a.L = L;
    a.C = K;
    a.sb = L * K;
    a.sl = K;
    a.sc = 1;
    a.block = plan.block;
    a.kept = plan.kept();
    a.out = static_cast<float*>(out.data_ptr());
    const double ms_comp = time_ms([&] {
      kernels::launch_unfold2d(DType::bf16, nhwc.data_ptr(), xl, ug, cols.data_ptr(), nullptr);
      kernels::launch_hla_project(a, rows, nullptr);
    });
    print_row(c.name, "rows", "compose", plan.describe(), ms_comp, bytes);
    kernels::HlaUnfoldedArgs u;
    u.dtype = DType::bf16;
    u.x = nhwc.data_ptr();
    u.N = c.N;
    u.C = c.C;
    u.H = c.H;
    u.W = c.W;
    u.sn = xl.n;
    u.sc = xl.c;
    u.sh = xl.h;
    u.sw = xl.w;
    u.OH = ug.OH;
    u.OW = ug.OW;
    u.kh = u.kw = c.k;
    u.stride_h = u.stride_w = c.s;
    u.pad_h = u.pad_w = c.p;
    u.block = plan.block;
    u.kept = plan.kept();
    u.out = static_cast<float*>(out.data_ptr());
    const double ms = time_ms([&] { kernels::launch_hla_project_unfolded(u, rows, nullptr); });
    print_row(c.name, "rows", plan.block > 16 ? "fused" : "fused small", plan.describe(), ms, bytes);
    if (plan.block <= 16) {
      u.slab_only = true;
      const double ms_slab = time_ms([&] { kernels::launch_hla_project_unfolded(u, rows, nullptr); });
      print_row(c.name, "rows", "fused slab", plan.describe(), ms_slab, bytes);
    }
  }
}
// ---- end bench_hla ----

// ---- bench_attention (helper flash) ----
// scaled_dot_product_attention in bf16 with the causal mask, B = 4, H = 16 (no grouping), D 64 and 128,
// T = S in {1024, 2048, 4096}, through the op (the fused kernels of kernels/flash_attention*.cu): forward
// alone (no grad) and forward + backward through autograd. FLOPs: forward 4·B·H·T²·D / 2 (the causal half),
// backward 2.5x the forward, so forward + backward counts 3.5x. Each shape then times forward + backward with
// every backward kernel variant (rows "bwd variant N"; the backward alone is that minus the forward).
// bf16 q, k, v (B, H, T, D) requiring gradients and an upstream gradient g, uniform in [-1, 1).
struct AttentionCase {
  Tensor q, k, v, g;
};
AttentionCase attention_case(Generator& gen, int64_t B, int64_t H, int64_t T, int64_t D) {
  const Device dev = Device::cuda(0);
  auto make = [&] {
    Tensor t = uniform({B, H, T, D}, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16).detach();
    t.set_requires_grad(true);
    return t;
  };
  AttentionCase c{make(), make(), make(), Tensor()};
  c.g = uniform({B, H, T, D}, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16);
  return c;
}

// Causal forward + backward through autograd.
double attention_fwd_bwd_ms(AttentionCase& c) {
  return time_ms([&] {
    c.q.zero_grad();
    c.k.zero_grad();
    c.v.zero_grad();
    scaled_dot_product_attention(c.q, c.k, c.v, {AttnMask::causal, 0.0}).backward(c.g);
  });
}

void bench_attention(bool csv) {
  Generator gen(6);
  if (csv) std::printf("attention bf16 causal,B,H,T,D,fwd_ms,fwd_TFLOP/s,fwd+bwd_ms,fwd+bwd_TFLOP/s\n");
  else
    std::printf("\n%-42s %10s %10s %12s %10s\n", "attention bf16 causal (B=4, H=16)", "fwd ms", "TFLOP/s",
                "fwd+bwd ms", "TFLOP/s");
  const int64_t B = 4, H = 16;
  const char* only_case = std::getenv("HADATRAIN_BENCH_ATTN");  // "D:T", e.g. "128:4096"
  for (int64_t D : {int64_t{64}, int64_t{128}})
    for (int64_t T : {int64_t{1024}, int64_t{2048}, int64_t{4096}}) {
      if (only_case && *only_case && std::to_string(D) + ":" + std::to_string(T) != only_case) continue;
      AttentionCase c = attention_case(gen, B, H, T, D);
      Tensor keep;
      const double fwd_ms = time_ms([&] {
        NoGradGuard no_grad;
        keep = scaled_dot_product_attention(c.q, c.k, c.v, {AttnMask::causal, 0.0});
      });
      const double fb_ms = attention_fwd_bwd_ms(c);
      const double fwd_flops = 4.0 * static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T) *
                               static_cast<double>(D) * 0.5;
      const double fwd_tf = fwd_flops / fwd_ms * 1e-9, fb_tf = 3.5 * fwd_flops / fb_ms * 1e-9;
      if (csv)
        std::printf("attention,%lld,%lld,%lld,%lld,%.4f,%.1f,%.4f,%.1f\n", static_cast<long long>(B),
                    static_cast<long long>(H), static_cast<long long>(T), static_cast<long long>(D), fwd_ms, fwd_tf,
                    fb_ms, fb_tf);
      else
        std::printf("%-42s %10.4f %10.1f %12.4f %10.1f\n",
                    ("T=S=" + std::to_string(T) + " D=" + std::to_string(D)).c_str(), fwd_ms, fwd_tf, fb_ms, fb_tf);
      // every backward kernel variant side by side (kernels::set_flash_backward_variant; 0 lean, 1 split
      // tiles: Note [Backward variants] in kernels/flash_attention.cu); bwd = (fwd + bwd) - fwd
      for (int variant = 0; variant < kernels::kFlashBackwardVariants; ++variant) {
        kernels::set_flash_backward_variant(variant);
        const double v_ms = attention_fwd_bwd_ms(c);
        const char* vname = variant == 0 ? "lean" : "split";
        if (csv)
          std::printf("attention_bwd_variant,%lld,%lld,%lld,%lld,%d,%.4f,%.4f\n", static_cast<long long>(B),
                      static_cast<long long>(H), static_cast<long long>(T), static_cast<long long>(D), variant, v_ms,
                      v_ms - fwd_ms);
        else
          std::printf("  %-40s %10s %10s %12.4f %10.1f   bwd %.4f ms\n",
                      ("bwd variant " + std::to_string(variant) + " (" + vname + ")").c_str(), "", "", v_ms,
                      3.5 * fwd_flops / v_ms * 1e-9, v_ms - fwd_ms);
      }
      kernels::set_flash_backward_variant(-1);
    }
}
// ---- end bench_attention ----

// ---- bench_norm_gelu (helper kernels) ----
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

// ---- bench_bn_relu (helper bnfuse) ----
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

// ---- bench_bn_gelu_variants (helper bn9) ----
// The norm / gelu rows of bench_norm_gelu (bf16, train, f32 weight / bias / running stats; same byte counts:
// bn forward 3 passes, backward 5, gelu forward 2) and the fused bn+relu rows of bench_bn_relu, on the kept
// batch-norm and GELU forward kernels (Note [Batch-norm kernels] in kernels/batchnorm.cu, Note [GELU forward
// kernel] in kernels/elementwise.cu; the old/new variant switch is gone, old numbers in docs/cuda_backend.md).
// Backward = (forward + backward) - forward, autograd bookkeeping included. Rows "bn kernels ...": the
// batch-norm launchers alone (statistics + normalize, sums + dx), without the op layer. Channels-first rows are
// printed once per channels-first kernel variant (set_bn_cf_variant: "[split]" / "[planes]" / "[vstore]",
// helper bn11), channels-last rows once per channels-last reduction variant
// (set_bn_cl_variant: "[split]" / "[tickets]", helper bn12).
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
  // Channels-first shapes run once per channels-first kernel variant (kernels/batchnorm.h; row suffix
  // "[split]" / "[planes]" / "[vstore]"), the others once.
  const char* const cf_names[] = {"", " [split]", " [planes]", " [vstore]"};
  static_assert(sizeof(cf_names) / sizeof(cf_names[0]) == kernels::kBnCfVariants + 1);
  const char* const cl_names[] = {"", " [split]", " [tickets]"};
  static_assert(sizeof(cl_names) / sizeof(cl_names[0]) == kernels::kBnClVariants + 1);
  // Sets variant v of the layout's switch (the other back to its default); the row suffix.
  auto set_variant = [&](bool cf, int v) -> std::string {
    kernels::set_bn_cf_variant(cf ? v : 0);
    kernels::set_bn_cl_variant(cf ? 0 : v);
    return cf ? cf_names[v] : cl_names[v];
  };
  for (const BnCase& c : cases)
  for (int cfv = 1; cfv <= (c.shape.size() == 4 ? kernels::kBnCfVariants : kernels::kBnClVariants); ++cfv) {
    const std::string suffix = set_variant(c.shape.size() == 4, cfv);
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
    print(std::string(c.name) + " fwd train" + suffix, x.numel(), c.residual ? 4 : 3, fwd);
    print(std::string(c.name) + " bwd" + suffix, x.numel(), c.residual ? 7 : 5, bwd);
  }
  kernels::set_bn_cf_variant(0);
  kernels::set_bn_cl_variant(0);
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
  for (const KCase& c : kcases)
  for (int cfv = 1; cfv <= (c.s.S > 1 ? kernels::kBnCfVariants : kernels::kBnClVariants); ++cfv) {
    const std::string suffix = set_variant(c.s.S > 1, cfv);
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
    print(std::string(c.name) + " fwd" + suffix, x.numel(), 3, fwd);
    print(std::string(c.name) + " bwd" + suffix, x.numel(), 5, bwd);
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
    print(std::string(c.name) + "  stats only" + suffix, x.numel(), 1, t_stats);
    print(std::string(c.name) + "  normalize only" + suffix, x.numel(), 2, t_norm);
    print(std::string(c.name) + "  bwd sums only" + suffix, x.numel(), 2, t_sums);
    print(std::string(c.name) + "  dx only" + suffix, x.numel(), 3, t_dx);
  }
  kernels::set_bn_cf_variant(0);
  kernels::set_bn_cl_variant(0);
}
// ---- end bench_bn_gelu_variants ----

// ---- bench_attention_packed (helper attn) ----
// ViT self-attention from a packed projection qkv (B, N, 3 dim) in bf16, forward + backward through
// autograd: attention_qkv_packed (strided fused kernels, one (B, N, 3 dim) gradient) against the composition
// SelfAttention ran before (reshape/permute, three selects, scaled_dot_product_attention, transpose/reshape).
void bench_attention_packed(bool csv) {
  const Device dev = Device::cuda(0);
  Generator gen(7);
  struct Case {
    const char* name;
    int64_t B, N, H, D;
  };
  if (csv) std::printf("attention packed bf16,B,N,H,D,unpacked_ms,packed_ms\n");
  else std::printf("\n%-42s %14s %12s\n", "attention from qkv bf16, fwd+bwd", "unpacked ms", "packed ms");
  const Case cases[] = {{"ViT-S/4 (B=256, N=65, 6x64)", 256, 65, 6, 64}, {"ViT-B/16 (B=64, N=197, 12x64)", 64, 197, 12, 64}};
  for (const Case& c : cases) {
    const int64_t dim = c.H * c.D;
    Tensor qkv = uniform({c.B, c.N, 3 * dim}, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16).detach();
    qkv.set_requires_grad(true);
    const Tensor g = uniform({c.B, c.N, dim}, -1.0, 1.0, gen, {DType::f32, dev}).to(DType::bf16);
    const double unpacked_ms = time_ms([&] {
      qkv.zero_grad();
      const Tensor t = qkv.reshape({c.B, c.N, 3, c.H, c.D}).permute({2, 0, 3, 1, 4});
      scaled_dot_product_attention(select(t, 0, 0), select(t, 0, 1), select(t, 0, 2))
          .transpose(1, 2)
          .reshape({c.B, c.N, dim})
          .backward(g);
    });
    const double packed_ms = time_ms([&] {
      qkv.zero_grad();
      attention_qkv_packed(qkv, c.H).backward(g);
    });
    if (csv)
      std::printf("attention_packed,%lld,%lld,%lld,%lld,%.4f,%.4f\n", static_cast<long long>(c.B),
                  static_cast<long long>(c.N), static_cast<long long>(c.H), static_cast<long long>(c.D), unpacked_ms,
                  packed_ms);
    else std::printf("%-42s %14.4f %12.4f\n", c.name, unpacked_ms, packed_ms);
  }
}
// ---- end bench_attention_packed ----

}  // namespace

// ---- bench_norm_variants (helpers rows8, rows11, rows12) ----
// layer_norm / rms_norm in bf16 (bf16 weight and bias) with each norm kernel variant (kernels::
// set_norm_kernel_variant: 1 "old", the register-resident kernels; 2 "staged" (the default), the staged ones,
// parameters in shared memory; 3 "reg", the staged ones with the parameters in registers; 4 "cluster", the
// default's forward and a staged backward adding its dgamma / dbeta partial sums in thread block clusters;
// Note [Norm kernel variants] in kernels/rows_norm.cu), side by side.
// Op rows: through the op API. Forward: 2 passes (read x, write y) over the forward time; backward: 3 passes
// (read x and g, write gx) over (forward + backward) - forward, as bench_norm_gelu counts them: that time also
// holds the parameter gradients' partial sums and finalize launch, autograd's bookkeeping, the output and
// gradient allocations and zero_grad's memsets, which weigh at the smaller shapes.
// "kernels" rows: the launchers alone on preallocated buffers (forward: launch_norm; backward:
// launch_norm_backward with the fused partial sums, or launch_norm_param_grad where there are none, then
// launch_norm_param_finalize), the legacy stream, as time_ms's events.
// Columns: per variant the time, the ratio to the copy floor (the 1 GB clone of the main table) and "vs same":
// the ratio to a device-to-device copy (cudaMemcpyAsync) of the same traffic (bytes read + written: forward
// D elements per row, backward 1.5 D), timed the same way; "copy ms" is that copy's time. At these sizes the
// L2 (50 MB on the H200) holds part of the data between back-to-back launches, for the copy as for the norm:
// "vs same" compares like with like, "vs copy" against HBM streaming.
// Last row: the bf16 GELU forward at 16640 x 1536 with GELU forward kernel 1 and 2 (set_gelu_fwd_variant).
// HADATRAIN_BENCH_NORM=S runs only the cases whose "op RxD" name contains S (e.g. 16640x384; "gelu");
// HADATRAIN_BENCH_NORM_PROFILE=1 (for Nsight Compute) skips the op rows and times nothing: per case and variant
// the launchers run once each (forward, forward again for the statistics, backward, finalize).
void bench_norm_variants(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(12);
  auto bf16_rand = [&](const Shape& s) { return rand(s, gen, {DType::f32, dev}).to(DType::bf16); };
  constexpr int kV = kernels::kNormKernelVariants;
  static_assert(kV == 4, "one column triple per variant");
  const char* const names[kV] = {"old", "staged", "reg", "cluster"};
  if (csv) {
    std::printf("norm variant,elements,copy ms");
    for (const char* v : names) std::printf(",%s ms,%s ratio_to_copy,%s ratio_to_same_size_copy", v, v, v);
    std::printf("\n");
  } else {
    std::printf("\n%-38s %10s %8s", "norm kernels (bf16): variants 1-4", "elements", "copy ms");
    for (const char* v : names) std::printf(" %7s ms %7s %7s", v, "vs copy", "vs same");
    std::printf("\n");
  }
  // bytes: traffic of the row (read + write); same_ms: the same-size copy's time
  auto print = [&](const std::string& name, int64_t numel, double passes, double same_ms, const double (&ms)[kV]) {
    const double bytes = passes * 2.0 * static_cast<double>(numel);
    if (csv) std::printf("%s,%lld,%.4f", name.c_str(), static_cast<long long>(numel), same_ms);
    else std::printf("%-38s %10lld %8.4f", name.c_str(), static_cast<long long>(numel), same_ms);
    for (int v = 0; v < kV; ++v) {
      const double ratio = bytes / ms[v] * 1e-6 / copy_gbs, same = same_ms / ms[v];
      if (csv) std::printf(",%.4f,%.3f,%.3f", ms[v], ratio, same);
      else std::printf(" %10.4f %7.3f %7.3f", ms[v], ratio, same);
    }
    std::printf("\n");
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
    double fwd[kV], bwd[kV];
    for (int v = 1; v <= kV; ++v) {
      kernels::set_norm_kernel_variant(v);
      x.set_requires_grad(false);
      w.set_requires_grad(false);
      b.set_requires_grad(false);
      Tensor keep;
      fwd[v - 1] = time_ms([&] {
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
      bwd[v - 1] = fb - fwd[v - 1];
    }
    kernels::set_norm_kernel_variant(0);
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
    double fwd[kV], bwd[kV];
    for (int v = 1; v <= kV; ++v) {
      kernels::set_norm_kernel_variant(v);
      fwd[v - 1] = timed([&] { kernels::launch_norm(fa, nullptr); });
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
      bwd[v - 1] = timed([&] {
        kernels::launch_norm_backward(ba, nullptr);
        if (fused == 0)
          kernels::launch_norm_param_grad({DType::bf16, kind, pw.data_ptr(), pb.defined() ? pb.data_ptr() : nullptr,
                                           g.data_ptr(), x.data_ptr(), c.rms ? nullptr : mean.data_ptr(),
                                           rstd.data_ptr(), rows, d},
                                          nullptr);
        kernels::launch_norm_param_finalize(fin, nullptr);
      });
    }
    kernels::set_norm_kernel_variant(0);
    if (profile) continue;
    const std::string shape = std::to_string(rows) + "x" + std::to_string(d);
    print(std::string("kernels ") + c.op + " fwd " + shape, numel, 2, copy_ms(2 * 2.0 * numel), fwd);
    print(std::string("kernels ") + c.op + " bwd " + shape, numel, 3, copy_ms(3 * 2.0 * numel), bwd);
  }
  // The bf16 GELU (erf) forward of a ViT-S/4 MLP activation with each GELU forward kernel (kernels::
  // set_gelu_fwd_variant: 1 rounds per element, the default; 2 per pair; Note [GELU forward kernel] in
  // kernels/elementwise.cu), through the op API; 2 passes.
  if (profile || (only != nullptr && std::string("gelu 16640x1536").find(only) == std::string::npos)) return;
  {
    constexpr int kG = kernels::kGeluFwdVariants;
    const Tensor x = bf16_rand({256 * 65, 1536});
    double ms[kG];
    for (int v = 1; v <= kG; ++v) {
      kernels::set_gelu_fwd_variant(v);
      Tensor keep;
      ms[v - 1] = time_ms([&] {
        NoGradGuard no_grad;
        keep = gelu(x);
      });
    }
    kernels::set_gelu_fwd_variant(0);
    const double numel = static_cast<double>(x.numel()), same = copy_ms(2 * 2.0 * numel);
    if (csv) std::printf("gelu fwd 16640x1536,%lld,%.4f", static_cast<long long>(x.numel()), same);
    else std::printf("%-38s %10lld %8.4f", "gelu fwd 16640x1536 (1 / 2)", static_cast<long long>(x.numel()), same);
    for (int v = 0; v < kG; ++v) {
      const double ratio = 2 * 2.0 * numel / ms[v] * 1e-6 / copy_gbs;
      if (csv) std::printf(",%.4f,%.3f,%.3f", ms[v], ratio, same / ms[v]);
      else std::printf(" %10.4f %7.3f %7.3f", ms[v], ratio, same / ms[v]);
    }
    std::printf("\n");
  }
}
// ---- end bench_norm_variants ----

// ---- bench_fold (helper fold12) ----
#include "kernels/unfold.h"  // bench_fold: launch_fold2d / launch_unfold2d, set_fold_variant

// fold2d (col2im, unfold2d's backward) and unfold2d (im2col) kernels on ResNet / ViT shapes at batch 256 (one
// ImageNet-like stage-1 shape at batch 64), bf16, through the launchers on preallocated buffers (legacy stream,
// time_ms's events). fold: contiguous (N, L, C·kh·kw) columns -> (N, C, H, W) with each fold variant
// (kernels::set_fold_variant; 1 old, 2 tiles: Note [Fold, tiles kernel] in kernels/unfold.cu; 3 tiles2: Note
// [Fold, tiles2], the halo stage on the 3x3 stride-1 rows, tiles on the others); unfold with each unfold variant
// (set_unfold_variant; 1 old, 2 staged, 3 vec: Note [Unfold, vec kernel]; vec takes every row here) from an
// (N, C, H, W) contiguous image and from a channels-last (N, H, W, C) image viewed as NCHW (the HLQ convolutions'
// layout) -> columns. Bytes: columns + image, each once (the ideal traffic); "vs copy" is the ratio of that rate
// to the copy floor (the 1 GB clone of the main table). HADATRAIN_BENCH_FOLD=S runs only the cases whose name
// contains S.
void bench_fold(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(21);
  constexpr int kV = kernels::kFoldVariants;
  constexpr int kU = kernels::kUnfoldVariants;
  static_assert(kV == 3 && kU == 3, "one column pair per variant");
  struct Case {
    const char* name;
    int64_t N, C, H, W, k, s, p;
  };
  const Case cases[] = {
      {"C64 32x32 3x3 s1 p1", 256, 64, 32, 32, 3, 1, 1},    {"C128 16x16 3x3 s1 p1", 256, 128, 16, 16, 3, 1, 1},
      {"C256 8x8 3x3 s1 p1", 256, 256, 8, 8, 3, 1, 1},      {"C512 4x4 3x3 s1 p1", 256, 512, 4, 4, 3, 1, 1},
      {"C64 32x32 3x3 s2 p1", 256, 64, 32, 32, 3, 2, 1},    {"C128 16x16 1x1 s2", 256, 128, 16, 16, 1, 2, 0},
      {"C3 32x32 4x4 s4 (ViT-S/4)", 256, 3, 32, 32, 4, 4, 0}, {"C64 56x56 3x3 s1 p1 N64", 64, 64, 56, 56, 3, 1, 1},
  };
  const char* const only = std::getenv("HADATRAIN_BENCH_FOLD");
  if (csv) {
    std::printf("fold case (bf16 N 256 unless named),MB");
    for (const char* c : {"fold old", "fold tiles", "fold tiles2", "unfold nchw old", "unfold nchw staged",
                          "unfold nchw vec", "unfold nhwc-view old", "unfold nhwc-view staged", "unfold nhwc-view vec"})
      std::printf(",%s ms,%s ratio_to_copy", c, c);
    std::printf("\n");
  } else {
    std::printf("\n%-30s %8s", "fold / unfold (bf16, N 256)", "MB");
    for (const char* c : {"fold old", "fold tiles", "fold tiles2", "unf-nchw v1", "unf-nchw v2", "unf-nchw v3",
                          "unf-nhwc v1", "unf-nhwc v2", "unf-nhwc v3"})
      std::printf(" %11s %7s", c, "vs copy");
    std::printf("\n");
  }
  for (const Case& c : cases) {
    if (only != nullptr && std::string(c.name).find(only) == std::string::npos) continue;
    const int64_t N = c.N;
    kernels::UnfoldGeometry g;
    g.N = N;
    g.C = c.C;
    g.H = c.H;
    g.W = c.W;
    g.kh = g.kw = c.k;
    g.sh = g.sw = c.s;
    g.ph = g.pw = c.p;
    g.OH = (c.H + 2 * c.p - c.k) / c.s + 1;
    g.OW = (c.W + 2 * c.p - c.k) / c.s + 1;
    const int64_t L = g.OH * g.OW, K = c.C * c.k * c.k;
    const Tensor cols = rand({N, L, K}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor img = rand({N, c.C, c.H, c.W}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor nhwc = rand({N, c.H, c.W, c.C}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor out_img = empty({N, c.C, c.H, c.W}, {DType::bf16, dev});
    const Tensor out_cols = empty({N, L, K}, {DType::bf16, dev});
    const kernels::FoldStrides3 cs{L * K, K, 1};
    double ms[kV + 2 * kU];
    for (int v = 1; v <= kV; ++v) {
      kernels::set_fold_variant(v);
      ms[v - 1] = time_ms([&] {
        kernels::launch_fold2d(DType::bf16, cols.data_ptr(), cs, g, out_img.data_ptr(), nullptr);
      });
    }
    kernels::set_fold_variant(0);
    const kernels::UnfoldStrides4 xs{c.C * c.H * c.W, c.H * c.W, c.W, 1};
    const kernels::UnfoldStrides4 xl{c.H * c.W * c.C, 1, c.W * c.C, c.C};  // (n, c, h, w) strides of NHWC storage
    for (int v = 1; v <= kU; ++v) {
      kernels::set_unfold_variant(v);
      ms[kV + v - 1] =
          time_ms([&] { kernels::launch_unfold2d(DType::bf16, img.data_ptr(), xs, g, out_cols.data_ptr(), nullptr); });
      ms[kV + kU + v - 1] =
          time_ms([&] { kernels::launch_unfold2d(DType::bf16, nhwc.data_ptr(), xl, g, out_cols.data_ptr(), nullptr); });
    }
    kernels::set_unfold_variant(0);
    const double bytes = 2.0 * static_cast<double>(N * L * K + N * c.C * c.H * c.W);
    if (csv) std::printf("%s,%.1f", c.name, bytes * 1e-6);
    else std::printf("%-30s %8.1f", c.name, bytes * 1e-6);
    for (double t : ms) {
      const double ratio = bytes / t * 1e-6 / copy_gbs;
      if (csv) std::printf(",%.4f,%.3f", t, ratio);
      else std::printf(" %11.4f %7.3f", t, ratio);
    }
    std::printf("\n");
  }
}
// ---- end bench_fold ----

// ---- bench_pool ----
// Pooling through the ops (forward without autograd; forward + backward through autograd), bf16, on the
// ResNet shapes PyTorch is compared with (tools/bench/bench_kernels_torch.py, block "pool", same names): the
// ImageNet stem's 3x3 stride-2 max pool and the heads' global average pools, each on an NCHW tensor and on a
// channels-last one (an (N, H, W, C) tensor viewed as (N, C, H, W), as the channels-last ResNets call it; its
// output and gradient stay channels last, and grad_out is made in the output's layout, as torch.rand_like).
// Issue 3 asks for pooling through cuDNN or own kernels, whichever is faster: ours are own kernels
// (kernels/pool.cu); the cuDNN columns time cudnnPoolingForward and cudnnPoolingForward + cudnnPoolingBackward
// (which needs x, y and dy) on dense buffers of the same shapes and layout (CUDNN_POOLING_MAX 3x3 s2 p1;
// CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING with the whole plane as the window for the global pools), bare
// calls without autograd or allocation. cuDNN runs bf16 when it accepts it, else f16 (the "cuDNN dt" column).
// "max|diff|" compares cuDNN's forward output with ours (0 for max; one bf16 rounding for average).
// Bytes: input + output once each (forward); "GB/s" is ours over the forward time.
#include "hadatrain/cuda/cudnn.h"  // bench_pool only

namespace {

struct PoolBenchCase {
  const char* name;
  int64_t N, C, H, W;
  bool max;  // 3x3 s2 p1 max pool; else adaptive average pool to 1x1
};

struct CudnnPoolTimes {
  double fwd = 0, both = 0, max_diff = 0;
  DType dtype = DType::bf16;
};

// Times cuDNN's pooling of x (logical (N, C, H, W), dense in its layout: NCHW, or channels last when cl) in
// x's dtype. Throws when cuDNN rejects the problem.
CudnnPoolTimes cudnn_pool_times(const PoolBenchCase& c, bool cl, const Tensor& x, const Tensor& ours, Generator& gen) {
  const cuda::TensorFormat fmt = cl ? cuda::TensorFormat::nhwc : cuda::TensorFormat::nchw;
  const cudnnDataType_t cdt = cuda::cudnn_dtype(x.dtype(), "bench_pool");
  const int64_t OH = ours.size(2), OW = ours.size(3);
  const int kh = c.max ? 3 : static_cast<int>(c.H), kw = c.max ? 3 : static_cast<int>(c.W);
  const int sh = c.max ? 2 : kh, sw = c.max ? 2 : kw, pad = c.max ? 1 : 0;
  cudnnPoolingDescriptor_t pd = nullptr;
  HT_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pd));
  CudnnPoolTimes r;
  r.dtype = x.dtype();
  try {
    HT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
        pd, c.max ? CUDNN_POOLING_MAX : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, CUDNN_PROPAGATE_NAN, kh, kw, pad,
        pad, sh, sw));
    cuda::TensorDesc xd, yd;
    xd.set_4d(cdt, fmt, c.N, c.C, c.H, c.W);
    yd.set_4d(cdt, fmt, c.N, c.C, OH, OW);
    int on = 0, oc = 0, oh = 0, ow = 0;
    HT_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pd, xd.get(), &on, &oc, &oh, &ow));
    HT_CHECK(oh == OH && ow == OW, "bench_pool: cuDNN output {}x{}, ours {}x{}", oh, ow, OH, OW);
    // Dense buffers in the layout: y, dy (N, OH, OW, C) or (N, C, OH, OW); dx like x.
    const Shape ys = cl ? Shape{c.N, OH, OW, c.C} : Shape{c.N, c.C, OH, OW};
    const Shape xs = cl ? Shape{c.N, c.H, c.W, c.C} : Shape{c.N, c.C, c.H, c.W};
    Tensor y = empty(ys, {x.dtype(), x.device()}), dx = empty(xs, {x.dtype(), x.device()});
    const Tensor dy = rand(ys, gen, {DType::f32, x.device()}).to(x.dtype());
    const float alpha = 1.0f, beta = 0.0f;
    cudnnHandle_t h = cuda::cudnn_handle();
    auto fwd = [&] {
      HT_CUDNN_CHECK(cudnnPoolingForward(h, pd, &alpha, xd.get(), x.data_ptr(), &beta, yd.get(), y.data_ptr()));
    };
    auto bwd = [&] {
      HT_CUDNN_CHECK(cudnnPoolingBackward(h, pd, &alpha, yd.get(), y.data_ptr(), yd.get(), dy.data_ptr(), xd.get(),
                                          x.data_ptr(), &beta, xd.get(), dx.data_ptr()));
    };
    r.fwd = time_ms(fwd);
    r.both = time_ms([&] {
      fwd();
      bwd();
    });
    fwd();
    const Tensor yl = cl ? y.permute({0, 3, 1, 2}) : y;  // (N, C, OH, OW)
    const std::vector<float> a = yl.to(DType::f32).to_vector<float>(), b = ours.to(DType::f32).to_vector<float>();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
      r.max_diff = std::max(r.max_diff, d < 0 ? -d : d);
    }
  } catch (...) {
    cudnnDestroyPoolingDescriptor(pd);
    throw;
  }
  cudnnDestroyPoolingDescriptor(pd);
  return r;
}

}  // namespace

void bench_pool(bool csv) {
  const Device dev = Device::cuda(0);
  Generator gen(23);
  const PoolBenchCase cases[] = {{"max_pool 3x3 s2 64x64x112x112", 64, 64, 112, 112, true},
                                 {"avg_pool global 64x2048x7x7", 64, 2048, 7, 7, false},
                                 {"avg_pool global 256x512x4x4", 256, 512, 4, 4, false}};
  if (csv)
    std::printf("pool bf16,layout,fwd_ms,fwd_bwd_ms,cudnn_fwd_ms,cudnn_fwd_bwd_ms,fwd_GB/s,cudnn_dtype,max_diff\n");
  else
    std::printf("\n%-34s %-8s %10s %12s %11s %15s %10s %9s %9s\n", "pool (bf16)", "layout", "fwd ms", "fwd+bwd ms",
                "cuDNN fwd", "cuDNN fwd+bwd", "fwd GB/s", "cuDNN dt", "max|diff|");
  Tensor keep;
  for (const PoolBenchCase& c : cases) {
    for (const bool cl : {false, true}) {
      const Tensor xbuf = cl ? rand({c.N, c.H, c.W, c.C}, gen, {DType::f32, dev}).to(DType::bf16)
                             : rand({c.N, c.C, c.H, c.W}, gen, {DType::f32, dev}).to(DType::bf16);
      Tensor x = (cl ? permute(xbuf, {0, 3, 1, 2}) : xbuf).detach();
      Pool2dParams p;
      p.kernel_h = p.kernel_w = 3;
      p.stride_h = p.stride_w = 2;
      p.pad_h = p.pad_w = 1;
      auto run = [&] { return c.max ? max_pool2d(x, p) : adaptive_avg_pool2d(x, 1, 1); };
      Tensor y;
      {
        NoGradGuard no_grad;
        y = run();
      }
      // grad_out in the output's layout (torch.rand_like keeps channels_last)
      const Tensor g = cl ? permute(rand({c.N, y.size(2), y.size(3), c.C}, gen, {DType::f32, dev}).to(DType::bf16),
                                    {0, 3, 1, 2})
                          : rand(y.shape(), gen, {DType::f32, dev}).to(DType::bf16);
      const double fwd = time_ms([&] {
        NoGradGuard no_grad;
        keep = run();
      });
      x.set_requires_grad(true);
      const double both = time_ms([&] {
        x.zero_grad();
        run().backward(g);
      });
      x.set_requires_grad(false);
      CudnnPoolTimes cd;
      bool cudnn_ok = true;
      try {
        cd = cudnn_pool_times(c, cl, xbuf, y, gen);
      } catch (const std::exception& e) {
        try {  // cuDNN without bf16 pooling: f16, labelled
          cd = cudnn_pool_times(c, cl, xbuf.to(DType::f16), y, gen);
        } catch (const std::exception& e2) {
          std::fprintf(stderr, "bench_pool: cuDNN failed: %s / %s\n", e.what(), e2.what());
          cudnn_ok = false;
        }
      }
      const double bytes = 2.0 * static_cast<double>(x.numel() + y.numel());
      const std::string cdt = cudnn_ok ? std::string(dtype_name(cd.dtype)) : std::string("failed");
      if (csv)
        std::printf("%s,%s,%.4f,%.4f,%.4f,%.4f,%.1f,%s,%.3g\n", c.name, cl ? "nhwc" : "nchw", fwd, both, cd.fwd,
                    cd.both, bytes / fwd * 1e-6, cdt.c_str(), cd.max_diff);
      else
        std::printf("%-34s %-8s %10.4f %12.4f %11.4f %15.4f %10.1f %9s %9.3g\n", c.name, cl ? "nhwc" : "nchw", fwd,
                    both, cd.fwd, cd.both, bytes / fwd * 1e-6, cdt.c_str(), cd.max_diff);
    }
  }
}
// ---- end bench_pool ----

int main(int argc, char** argv) {
  int64_t n = 1LL << 28;
  bool csv = false;
  std::string only = std::getenv("HADATRAIN_BENCH_ONLY") ? std::getenv("HADATRAIN_BENCH_ONLY") : "";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0) csv = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else n = std::stoll(argv[i]);
  }
  const char* const blocks[] = {"main",       "gemm", "lowp",      "conv",          "attention", "attention_packed",
                                "grad_quant", "hla",  "norm_gelu", "norm_variants", "bn_relu",   "bn_gelu",
                                "fold",       "pool"};
  std::vector<std::string> selected;
  {
    std::istringstream in(only);
    for (std::string b; std::getline(in, b, ',');) {
      if (b.empty()) continue;
      if (std::find(std::begin(blocks), std::end(blocks), b) == std::end(blocks)) {
        std::fprintf(stderr, "bench_kernels: unknown block '%s' in --only / HADATRAIN_BENCH_ONLY\n", b.c_str());
        return 2;
      }
      selected.push_back(b);
    }
  }
  auto want = [&](const char* b) { return selected.empty() || std::find(selected.begin(), selected.end(), b) != selected.end(); };
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  Generator gen(1);
  const Tensor x = rand({n}, gen, {DType::f32, dev});
  const Tensor y = rand({n}, gen, {DType::f32, dev});
  const Tensor xb = x.to(DType::bf16), yb = y.to(DType::bf16);
  const Tensor m = rand({n / 4096, 4096}, gen, {DType::f32, dev});
  const double f4 = 4.0 * static_cast<double>(n), f2 = 2.0 * static_cast<double>(n);
  std::vector<Row> rows;
  Tensor keep;
  rows.push_back({"copy f32 (clone)", 2 * f4, time_ms([&] { keep = x.clone(); })});
  // the copy row is the floor every block divides by, so it is always measured
  if (want("main")) {
    rows.push_back({"add f32", 3 * f4, time_ms([&] { keep = add(x, y); })});
    rows.push_back({"mul f32 by scalar", 2 * f4, time_ms([&] { keep = mul(x, 1.5); })});
    rows.push_back({"add bf16", 3 * f2, time_ms([&] { keep = add(xb, yb); })});
    rows.push_back({"relu f32", 2 * f4, time_ms([&] { keep = relu(x); })});
    rows.push_back({"gelu (erf) bf16", 2 * f2, time_ms([&] { keep = gelu(xb); })});
    rows.push_back({"convert f32->bf16", f4 + f2, time_ms([&] { keep = x.to(DType::bf16); })});
    rows.push_back({"convert f32->f8e4m3", f4 + n, time_ms([&] { keep = x.to(DType::f8e4m3); })});
    rows.push_back({"sum f32 (all)", f4, time_ms([&] { keep = sum(x); })});
    rows.push_back({"sum f32 rows (.., 4096)", f4, time_ms([&] { keep = sum(m, {1}); })});
    rows.push_back({"sum f32 cols (4096 of ..)", f4, time_ms([&] { keep = sum(m, {0}); })});
    rows.push_back({"transpose copy f32 (.., 4096)^T", 2 * f4, time_ms([&] { keep = m.transpose(0, 1).contiguous(); })});
    // row kernels (kernels/rows_norm*.cu): read x and write y once each; bf16 (n / 4096, 4096), 65536 x 4096 by default
    const Tensor mb = m.to(DType::bf16);
    const Tensor lw = rand({4096}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor lb = rand({4096}, gen, {DType::f32, dev}).to(DType::bf16);
    rows.push_back({"softmax bf16 (.., 4096)", 2 * f2, time_ms([&] { keep = softmax(mb, 1); })});
    rows.push_back({"layer_norm bf16 (.., 4096)", 2 * f2, time_ms([&] { keep = layer_norm(mb, lw, lb); })});
  }
  const double floor_gbs = rows[0].bytes / rows[0].ms * 1e-6;
  if (csv) std::printf("kernel,elements,ms,GB/s,ratio_to_copy\n");
  else std::printf("%-34s %12s %10s %10s %8s\n", "kernel", "elements", "ms", "GB/s", "vs copy");
  for (const auto& r : rows) {
    const double gbs = r.bytes / r.ms * 1e-6;
    if (csv) std::printf("%s,%lld,%.4f,%.1f,%.3f\n", r.name.c_str(), static_cast<long long>(n), r.ms, gbs, gbs / floor_gbs);
    else std::printf("%-34s %12lld %10.4f %10.1f %8.3f\n", r.name.c_str(), static_cast<long long>(n), r.ms, gbs, gbs / floor_gbs);
  }
  if (want("gemm")) bench_gemm(csv);
  if (want("lowp")) bench_lowp_gemm(csv);
  if (want("conv")) bench_conv_bn(csv);
  if (want("attention")) bench_attention(csv);
  if (want("attention_packed")) bench_attention_packed(csv);
  if (want("grad_quant")) bench_grad_quant(csv, floor_gbs);
  if (want("hla")) bench_hla(csv, floor_gbs);
  if (want("norm_gelu")) bench_norm_gelu(csv, floor_gbs);
  if (want("norm_variants")) bench_norm_variants(csv, floor_gbs);
  if (want("bn_relu")) bench_bn_relu(csv);
  if (want("bn_gelu")) bench_bn_gelu_variants(csv, floor_gbs);
  if (want("fold")) bench_fold(csv, floor_gbs);
  if (want("pool")) bench_pool(csv);
  return 0;
}
