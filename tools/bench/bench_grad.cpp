// Per-layer backward benchmark of the gradient pipelines (CUDA builds): the ViT-B/16 linear layers (197
// tokens) and ResNet-50 convolutions (as im2col products) at batch 64. For each layer and pipeline: the
// forward runs once (saving what the pipeline keeps), then backward (g_x and g_w) is timed: median of 20
// after 3 warm-ups, CUDA events; the forward with its saving is timed the same way. The baseline is our exact bf16
// backward (two cuBLASLt GEMMs); exact f32 is the paper's baseline. Prints ms per layer and the speed-up over exact
// bf16.
//   bench_grad [batch = 64] [layer filter] [pipeline filter]   (filters: substrings of the names, or =NAME
//   for exactly one pipeline; the exact bf16 baseline always runs)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

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
};

struct Variant {
  const char* label;
  grad::PipelineSpec spec;
  DType dtype;
};


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
      {"r50.layer1.conv1", 3136, 256, 64, 56}, {"r50.layer1.conv2", 3136, 576, 64, 56},
      {"r50.layer2.conv1", 784, 512, 128, 28}, {"r50.layer2.conv2", 784, 1152, 128, 28},
      {"r50.layer3.conv2", 196, 2304, 256, 14}, {"r50.layer4.conv2", 49, 4608, 512, 7},
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
    const Tensor x32 = randn({B, l.L, l.I}, gen, {DType::f32, dev});
    const Tensor w32 = mul(randn({l.O, l.I}, gen, {DType::f32, dev}), 0.02);
    const Tensor g32 = mul(randn({B, l.L, l.O}, gen, {DType::f32, dev}), 1e-3);
    double base = 0, fbase = 0;
    for (const Variant& v : variants) {
      const bool exact_name = !variant_filter.empty() && variant_filter[0] == '=';
      const bool match = exact_name ? variant_filter.substr(1) == v.label
                                    : std::string(v.label).find(variant_filter) != std::string::npos;
      if (base != 0 && !match) continue;
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
