// Layer-level benchmark (CUDA builds): forward and backward time of the pieces of a ViT-S/4 block at
// batch 256 (65 tokens, 384 dim, 6 heads) in bf16, each alone: Linear, scaled-dot-product attention (dense
// inputs, and the strided q/k/v views SelfAttention passes), LayerNorm, GELU, SelfAttention and Mlp modules.
// Median of 20 after 3 warm-ups, CUDA events. Used to find where a model's step time goes.
//   bench_layers [batch = 256]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/factory.h"
#include "timing.h"

using namespace ht;

namespace {


// forward alone and forward + backward (sum of the output times a fixed gradient-like tensor).
void row(const char* name, const std::function<Tensor()>& fwd) {
  const double f = bench::median_ms([&] {
    NoGradGuard g;
    fwd();
  });
  const double fb = bench::median_ms([&] {
    const Tensor y = fwd();
    sum(y).backward();
  });
  std::printf("%-44s %9.3f %11.3f\n", name, f, fb);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t B = argc > 1 ? std::stoll(argv[1]) : 256, N = 65, C = 384, H = 6, D = 64;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  Generator gen(0);
  auto leaf = [&](const Shape& s) {
    Tensor t = randn(s, gen, {DType::f32, dev}).to(DType::bf16);
    t.set_requires_grad(true);
    return t;
  };
  const Tensor x = leaf({B, N, C});
  const Tensor w = leaf({3 * C, C}), bias = leaf({3 * C});
  const Tensor q = leaf({B, H, N, D}), k = leaf({B, H, N, D}), v = leaf({B, H, N, D});
  const Tensor qkv = leaf({B, N, 3 * C});
  const Tensor lnw = leaf({C}), lnb = leaf({C});
  const Tensor h = leaf({B, N, 4 * C});
  std::printf("%-44s %9s %11s\n", "ViT-S/4 piece (bf16)", "fwd ms", "fwd+bwd ms");
  row("linear (B,65,384)->1152 + bias", [&] { return linear(x, w, bias); });
  row("linear (B*65,384)->1152, 2-D input", [&] { return linear(reshape(x, {B * N, C}), w, bias); });
  row("sdpa dense (B,6,65,64)", [&] { return scaled_dot_product_attention(q, k, v); });
  row("sdpa from qkv views (as SelfAttention)", [&] {
    const Tensor t = reshape(qkv, {B, N, 3, H, D}).permute({2, 0, 3, 1, 4});
    return scaled_dot_product_attention(select(t, 0, 0), select(t, 0, 1), select(t, 0, 2));
  });
  row("layer_norm (B,65,384)", [&] { return layer_norm(x, lnw, lnb, 1e-6); });
  row("gelu (B,65,1536)", [&] { return gelu(h); });
  row("merge heads: o.transpose(1,2).reshape", [&] { return reshape(q.transpose(1, 2), {B, N, C}); });
  Generator g2(1);
  auto attn = std::make_shared<nn::SelfAttention>(C, H, nn::Bias::yes, 0.0, g2, std::make_shared<Generator>(2));
  auto mlp = std::make_shared<nn::Mlp>(C, 4 * C, nn::ActivationKind::gelu, 0.0, g2, std::make_shared<Generator>(3));
  attn->to(dev);
  mlp->to(dev);
  row("SelfAttention module", [&] { return attn->forward(x); });
  row("Mlp module", [&] { return mlp->forward(x); });
  return 0;
}
