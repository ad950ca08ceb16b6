// bench_kernels blocks of the low-precision paths: bench_lowp_gemm (int8 / fp8 GEMM), bench_grad_quant
// (grad::quantize as the HLQ paths run it) and bench_hla (the HLA projection kernels).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_kernels.h"
#include "hadatrain/cuda/cublaslt_gemm.h"
#include "hadatrain/grad/hla.h"    // bench_hla
#include "hadatrain/grad/quant.h"  // bench_grad_quant
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/ops.h"
#include "cuda/kernels/hla.cuh"     // bench_hla: launch_hla_project / launch_hla_project_unfolded
#include "cuda/kernels/unfold.cuh"  // bench_hla: launch_unfold2d for the composition

namespace ht::bench {

// ---- bench_lowp_gemm ----
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

// ---- bench_grad_quant ----
// grad::quantize of a gradient as the HLQ paths run it, bf16 input. g_x path: T = 16 Hadamard blocks, absmax,
// 4 bits, stochastic rounding: (12608, 3072) = ViT-B fc1 g_y at batch 64 (64·197 tokens) with per-token (row)
// scales is the fused kernel (int8 and e4m3 values, and with max |g_y| reported for the g_w path); (64,
// 197·3072) with per-sample scales the two-pass path (x read twice). g_w path (identity HLA plan): 8 bits,
// one absmax scale, stochastic, values written K-major (3072, 12608): two-pass, and with the maximum given
// (one read). ACBP rows: HLQ's forward quantiser of a saved ViT-B input at batch 256 (SAWB, round to nearest,
// K-major; qkv / fc1 inputs 768 wide, fc2's 3072). Conv g_x path: (256·1024, 64) g_y, T 16, per-row scales, 4 bits, stochastic: e4m3 levels, then
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
    bool acbp = false;  // HLQ's forward quantiser of x: SAWB scale, round to nearest (else absmax, stochastic)
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
      {"quantize bf16 (50432, 768) ACBP SAWB RN8 K-major", 50432, 768, Granularity::tensor, 8, 1, DType::i8,
       ValuesLayout::transposed, false, false, true},
      {"quantize bf16 (50432, 3072) ACBP SAWB RN8 K-major", 50432, 3072, Granularity::tensor, 8, 1, DType::i8,
       ValuesLayout::transposed, false, false, true},
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
    spec.scale_rule = c.acbp ? grad::ScaleRule::sawb : grad::ScaleRule::absmax;
    spec.rounding = c.acbp ? grad::Rounding::nearest : grad::Rounding::stochastic;
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

// ---- bench_hla ----
namespace {

kernels::HlaRows hla_rows_of(const grad::HlaPlan& plan) {
  kernels::HlaRows rows{};
  for (int64_t i = 0; i < plan.kept(); ++i) rows.idx[i] = static_cast<int16_t>(plan.rows[static_cast<std::size_t>(i)]);
  return rows;
}

}  // namespace

// The HLA projection kernel (cuda/kernels/hla.cuh) through its launchers on preallocated buffers (legacy stream,
// time_ms's events), percentile 50.
// 1. hla_project of a bf16 activation / gradient (B, L, C) as the HLQ g_w path runs it, ResNet shapes:
//    (64, 1024, 256) is a 32x32 map (n = 1024, r = 528), (64, 3136, 64) a 56x56 map (n = 64, r = 36); both
//    output layouts. GB/s counts the minimum traffic, bf16 read once (2 B/element) + the f32 projection written
//    once (4 B per output element). Path "strided" (launch_hla_project). ViT-B token shapes at batch 256: the
//    196 patch tokens of 197 as split_extra projects them (n = 4), and 208 = 197 padded to 16 (n = 16); for
//    n <= 16 in the rows layout the launcher's register kernel ("small", Note [HLA small blocks]) and the slab
//    kernel ("slab"). LLaMA token shapes, 4 sequences of 2048 tokens (n = 2048: HLQ's projection of g_y and x on
//    Llama-3-8B's q_proj and up_proj): the wide kernel ("wide", Note [HLA wide blocks]) and the slab kernel.
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
                        {"hla_project bf16 (256, 208, 768)", 256, 208, 768, 0},
                        {"hla_project bf16 (4, 2048, 4096)", 4, 2048, 4096, 0},
                        {"hla_project bf16 (4, 2048, 14336)", 4, 2048, 14336, 0}};
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
        const bool wide = plan.block >= 256 && plan.block <= 2048 && layout == grad::HlaLayout::rows && c.C % 8 == 0;
        if (slab && !small && !wide) continue;
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
                  slab ? "slab" : (small ? "small" : (wide ? "wide" : "strided")), plan.describe(), ms, bytes);
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

}  // namespace ht::bench
