// Per-layer backward benchmark of the gradient pipelines (CUDA builds): the ViT-B/16 linear layers (197
// tokens) and ResNet-50 convolutions at batch 64. For each layer and pipeline: the forward runs (saving what the
// pipeline keeps), then backward (g_x and g_w) is timed: median of 20 after 3 warm-ups, CUDA events; the forward
// with its saving is timed the same way. Linear layers: products of random (B, L, I) inputs; the baseline is our
// exact bf16 backward (two cuBLASLt GEMMs); exact f32 is the paper's baseline. Convolutions run as in training: a
// channels-last image through the pipeline's forward_conv, the image kept for backward as a rebuilt batch-norm
// output would be (acbp_rebuild / acbp_share: HLQ's conv_gw wgrad and conv_gx dgrad forms; a fresh forward, untimed,
// before each timed backward, since backward takes the kept image), and the exact rows are the convolution backward
// itself (cuDNN backward data + backward filter); the g_x of pipelines that return the columns' gradient is not
// folded here. Prints ms per layer and the speed-up over exact bf16.
//   bench_grad [batch = 64] [layer filter] [pipeline filter]   (filters: substrings of the names, or =NAME
//   for exactly one pipeline; the exact bf16 baseline always runs)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/factory.h"
#include "timing.h"

using namespace ht;

namespace {

struct LayerShape {
  const char* name;
  int64_t L, I, O, grid;  // grid: side of the L = grid² map (0 for token layers)
  int64_t k = 0;          // a convolution's kernel side (I = C·k², stride 1, padding k / 2); 0 for token layers
};

struct Variant {
  const char* label;
  grad::PipelineSpec spec;
  DType dtype;
};


bool selected(const std::string& filter, const char* label) {
  if (!filter.empty() && filter[0] == '=') return filter.substr(1) == label;
  return std::string(label).find(filter) != std::string::npos;
}

// A convolution as training runs it (see the header): image (B, C, H, W) as the view of a channels-last map.
void run_conv(const LayerShape& l, int64_t B, const std::vector<Variant>& variants, const std::string& filter,
              Generator& gen, const Device& dev) {
  const int64_t C = l.I / (l.k * l.k), H = l.grid;
  const Tensor x32 = randn({B, H, H, C}, gen, {DType::f32, dev});  // (N, H, W, C)
  const Tensor w32 = mul(randn({l.O, l.I}, gen, {DType::f32, dev}), 0.02);
  const Tensor g32 = mul(randn({B, l.L, l.O}, gen, {DType::f32, dev}), 1e-3);
  Unfold2dParams u;
  u.kernel_h = u.kernel_w = l.k;
  u.pad_h = u.pad_w = l.k / 2;
  Conv2dParams p;
  p.pad_h = p.pad_w = l.k / 2;
  p.layout = ConvLayout::nhwc;
  double base = 0, fbase = 0;
  for (const Variant& v : variants) {
    if (base != 0 && !selected(filter, v.label)) continue;
    const Tensor x = x32.to(v.dtype), w = w32.to(v.dtype), g = g32.to(v.dtype);
    double fms = 0, ms = 0;
    if (v.spec.name == "exact") {  // the convolution and its backward (cuDNN), as an unbound Conv2d trains
      const Tensor w4 = reshape(w, {l.O, C, l.k, l.k}), g4 = reshape(g, {B, H, H, l.O});
      fms = bench::median_ms([&] { (void)conv2d(x, w4, Tensor(), p); });
      ms = bench::median_ms([&] {
        (void)conv2d_input_grad(g4, w4, H, H, p);
        (void)conv2d_weight_grad(x, g4, l.k, l.k, p);
      });
    } else {
      auto pipe = grad::make_pipeline(v.spec);
      grad::ProductInfo info;
      info.grid_h = info.grid_w = H;
      info.image = permute(x, {0, 3, 1, 2});
      info.window = u;
      const SavedTensor kept(info.image);  // as a batch norm keeps (and rebuilds) its output for backward
      auto forward = [&] { return pipe->forward_conv(w, info, grad::NoiseKey{1, 0, 0}, grad::SaveForBackward::yes); };
      fms = bench::median_ms([&] { (void)forward(); });
      grad::ForwardResult f;
      ms = bench::median_ms_prepared([&] { f = forward(); }, [&] { pipe->backward(*f.saved, g, {true, true}); });
    }
    if (base == 0) base = ms;
    if (fbase == 0) fbase = fms;
    std::printf("%-18s %-18s %10.3f %9.2fx %10.3f %9.2fx\n", l.name, v.label, ms, base / ms, fms, fbase / fms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t B = argc > 1 ? std::stoll(argv[1]) : 64;
  const std::string layer_filter = argc > 2 ? argv[2] : "", variant_filter = argc > 3 ? argv[3] : "";
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  const std::vector<LayerShape> layers = {
      {"vit_b.qkv", 197, 768, 2304, 0},        {"vit_b.proj", 197, 768, 768, 0},
      {"vit_b.fc1", 197, 768, 3072, 0},        {"vit_b.fc2", 197, 3072, 768, 0},
      {"r50.layer1.conv1", 3136, 256, 64, 56, 1}, {"r50.layer1.conv2", 3136, 576, 64, 56, 3},
      {"r50.layer2.conv1", 784, 512, 128, 28, 1}, {"r50.layer2.conv2", 784, 1152, 128, 28, 3},
      {"r50.layer3.conv2", 196, 2304, 256, 14, 3}, {"r50.layer4.conv2", 49, 4608, 512, 7, 3},
  };
  std::vector<Variant> variants;
  variants.push_back({"exact bf16", {}, DType::bf16});
  variants.push_back({"exact f32", {}, DType::f32});
  grad::PipelineSpec hlq;
  hlq.name = "hlq";
  variants.push_back({"hlq", hlq, DType::bf16});
  grad::PipelineSpec hlq_int8 = hlq;  // the 4-bit g_x product on int8 tensor cores instead of fp8
  hlq_int8.hlq.carrier = grad::Carrier::int8;
  variants.push_back({"hlq int8 carrier", hlq_int8, DType::bf16});
  grad::PipelineSpec hlq_pad = hlq;  // 197 tokens padded to 256: HLA rank reduction on the ViT layers
  hlq_pad.hlq.fallback = grad::HlaFallback::pad;
  variants.push_back({"hlq pad", hlq_pad, DType::bf16});
  grad::PipelineSpec hlq_split = hlq;
  hlq_split.hlq.fallback = grad::HlaFallback::split_extra;
  variants.push_back({"hlq split_extra", hlq_split, DType::bf16});
  grad::PipelineSpec hlq_ref = hlq;
  hlq_ref.hlq.gw_scale = grad::ScaleGranularity::sample;
  variants.push_back({"hlq sample scales", hlq_ref, DType::bf16});
  grad::PipelineSpec lbp;
  lbp.name = "lbp_wht";
  variants.push_back({"lbp_wht", lbp, DType::bf16});
  grad::PipelineSpec luq;
  luq.name = "luq";
  variants.push_back({"luq", luq, DType::bf16});

  std::printf("%-18s %-18s %10s %10s %10s %10s\n", "layer", "pipeline", "bwd ms", "vs bf16", "fwd ms", "vs bf16");
  Generator gen(0);
  for (const LayerShape& l : layers) {
    if (std::string(l.name).find(layer_filter) == std::string::npos) continue;
    if (l.k > 0) {
      run_conv(l, B, variants, variant_filter, gen, dev);
      continue;
    }
    const Tensor x32 = randn({B, l.L, l.I}, gen, {DType::f32, dev});
    const Tensor w32 = mul(randn({l.O, l.I}, gen, {DType::f32, dev}), 0.02);
    const Tensor g32 = mul(randn({B, l.L, l.O}, gen, {DType::f32, dev}), 1e-3);
    double base = 0, fbase = 0;
    for (const Variant& v : variants) {
      if (base != 0 && !selected(variant_filter, v.label)) continue;
      const Tensor x = x32.to(v.dtype), w = w32.to(v.dtype), g = g32.to(v.dtype);
      auto p = grad::make_pipeline(v.spec);
      grad::ProductInfo info;
      info.grid_h = info.grid_w = l.grid;
      // The forward with what it saves (the product, and ACBP's projection and quantisation for hlq).
      const double fms = bench::median_ms([&] {
        (void)p->forward(x, w, info, grad::NoiseKey{1, 0, 0}, grad::SaveForBackward::yes);
      });
      grad::ForwardResult f = p->forward(x, w, info, grad::NoiseKey{1, 0, 0}, grad::SaveForBackward::yes);
      const double ms = bench::median_ms([&] { p->backward(*f.saved, g, {true, true}); });
      if (base == 0) base = ms;
      if (fbase == 0) fbase = fms;
      std::printf("%-18s %-18s %10.3f %9.2fx %10.3f %9.2fx\n", l.name, v.label, ms, base / ms, fms, fbase / fms);
    }
  }
  return 0;
}
