// bench_kernels blocks of attention: bench_attention (causal scaled_dot_product_attention, forward and
// backward) and bench_attention_packed (attention from a packed qkv projection).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_kernels.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/ops.h"

namespace ht::bench {

// ---- bench_attention ----
// scaled_dot_product_attention in bf16 with the causal mask, B = 4, H = 16 (no grouping), D 64 and 128,
// T = S in {1024, 2048, 4096}, through the op (the fused kernels of cuda/kernels/flash_attention*.cu): forward
// alone (no grad) and forward + backward through autograd. FLOPs: forward 4·B·H·T²·D / 2 (the causal half),
// backward 2.5x the forward, so forward + backward counts 3.5x (the backward runs the lean kernel at D 64 and the
// split kernel at D 128: Note [Backward variants] in cuda/kernels/flash_attention.cu).
namespace {

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

}  // namespace

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
    }
}
// ---- end bench_attention ----

// ---- bench_attention_packed ----
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

}  // namespace ht::bench
