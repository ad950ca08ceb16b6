// Kernel benchmark (CUDA builds): times the elementwise, conversion, reduction and row kernels through the op
// API on large tensors and reports achieved bandwidth and its ratio to the measured copy bandwidth (the
// floor: a same-dtype clone reads and writes every byte once). Timing: CUDA events around `iters`
// back-to-back launches after a warm-up, median of `reps` such batches. GEMM rows (bench_gemm) report TFLOP/s.
// Usage: bench_kernels [elements = 268435456] [--csv] [--only BLOCK[,BLOCK...]]
// Blocks: main (the table above), gemm, lowp, conv, attention, attention_packed, grad_quant, hla, norm_gelu,
// norm_variants, bn_relu, bn_gelu, fold, pool; --only (or env HADATRAIN_BENCH_ONLY) runs the listed ones, e.g. to
// profile one block under Nsight Compute. HADATRAIN_BENCH_ATTN="D:T" restricts the attention block to one case.
// This file holds the main table, the gemm and conv blocks, time_ms and main(); the other blocks live in
// bench_kernels_quant.cpp (lowp, grad_quant, hla), bench_kernels_attention.cpp (attention, attention_packed),
// bench_kernels_rows.cpp (norm_gelu, norm_variants, bn_relu, bn_gelu) and bench_kernels_layout.cpp (fold, pool),
// declared in bench_kernels.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"

namespace ht::bench {

double time_ms(const std::function<void()>& fn, int iters, int reps) {
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

}  // namespace ht::bench

using namespace ht;
using namespace ht::bench;

namespace {

struct Row {
  std::string name;
  double bytes;
  double ms;
  int64_t elements = 0;  // 0: the table's element count
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

}  // namespace

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
    // row kernels (cuda/kernels/rows_norm*.cu): read x and write y once each; bf16 (n / 4096, 4096), 65536 x 4096 by default
    const Tensor mb = m.to(DType::bf16);
    const Tensor lw = rand({4096}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor lb = rand({4096}, gen, {DType::f32, dev}).to(DType::bf16);
    rows.push_back({"softmax bf16 (.., 4096)", 2 * f2, time_ms([&] { keep = softmax(mb, 1); })});
    rows.push_back({"layer_norm bf16 (.., 4096)", 2 * f2, time_ms([&] { keep = layer_norm(mb, lw, lb); })});
    // a Linear's bias gradient, the column sums of g_y (rows, out), at ViT-B/16's batch 256 (50432 tokens) for
    // out = 768 (proj, fc2) and 3072 (fc1): bytes read only (the sums are a few KB)
    for (const int64_t out : {int64_t{768}, int64_t{3072}}) {
      const Tensor g = rand({256 * 197, out}, gen, {DType::f32, dev}).to(DType::bf16);
      rows.push_back({"sum bf16 cols (50432, " + std::to_string(out) + ")", 2.0 * static_cast<double>(g.numel()),
                      time_ms([&] { keep = sum(g, {0}); }), g.numel()});
    }
  }
  const double floor_gbs = rows[0].bytes / rows[0].ms * 1e-6;
  if (csv) std::printf("kernel,elements,ms,GB/s,ratio_to_copy\n");
  else std::printf("%-34s %12s %10s %10s %8s\n", "kernel", "elements", "ms", "GB/s", "vs copy");
  for (const auto& r : rows) {
    const double gbs = r.bytes / r.ms * 1e-6;
    const long long elems = r.elements > 0 ? r.elements : static_cast<long long>(n);
    if (csv) std::printf("%s,%lld,%.4f,%.1f,%.3f\n", r.name.c_str(), elems, r.ms, gbs, gbs / floor_gbs);
    else std::printf("%-34s %12lld %10.4f %10.1f %8.3f\n", r.name.c_str(), elems, r.ms, gbs, gbs / floor_gbs);
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
