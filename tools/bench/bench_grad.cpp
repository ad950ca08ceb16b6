// Per-layer backward benchmark of the gradient pipelines (CUDA builds): the ViT-B/16 linear layers (197
// tokens), the ViT-S/4 ones (65 tokens) and ResNet-50 convolutions, at batch 64 by default. For each layer and
// pipeline the backward (g_x and g_w) is timed as training runs it, inside a recorded CUDA graph (Note [Step
// graphs]; train.cuda_graph is on by default): the forward with what the pipeline saves, and that forward
// followed by the backward, are each recorded once (after 3 eager warm-ups that create and tune the GEMM plans)
// and replayed, with fresh noise per replay through a device step clock; the backward's time is the difference of
// the two medians of 20 replays, the forward's the first median. The backward is also timed eagerly (CUDA events
// around the issued calls: median of 20 after 3 warm-ups), which adds the host's issue time where the GPU waits
// for it (a pipeline's backward issues up to ~20 kernels, exact's two). Linear layers: products of random (B, L,
// I) inputs; the baseline is our exact bf16 backward (two cuBLASLt GEMMs); exact f32 is the paper's baseline.
// Convolutions run as in training: a channels-last image through the pipeline's forward_conv, the image kept for
// backward as a rebuilt batch-norm output would be (acbp_rebuild / acbp_share: HLQ projects and quantises it in
// backward; eagerly, a fresh untimed forward before each timed backward, since backward takes the kept image),
// and the exact rows are the convolution backward itself (cuDNN backward data + backward filter); the g_x of
// pipelines that return the columns' gradient is not folded here. Prints ms per layer and the speed-up over exact
// bf16.
//   bench_grad [batch = 64] [layer filter] [pipeline filter]   (filters: substrings of the names, or =NAME
//   for exactly one pipeline; the exact bf16 baseline always runs)
// HT_BENCH_PHASES=1 adds, below each pipeline's row, the time per phase of one eager forward and backward
// (tools/bench/phase_timer.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/cuda/graph.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/factory.h"
#include "phase_timer.h"
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

// The median ms of replays of body() recorded into a step graph (3 eager warm-ups on the graph's stream first,
// which create and tune the GEMM plans); the clock steps before each replay, so every replay draws fresh noise.
// NaN, with the reason on stderr, when the recording is refused.
double graph_ms(const std::function<void()>& body, grad::StepClock& clock) {
  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  for (int i = 0; i < 3; ++i) body();
  cudaDeviceSynchronize();
  if (const std::string why = graph.record(body); !why.empty()) {
    std::fprintf(stderr, "step graph refused: %s\n", why.c_str());
    return std::nan("");
  }
  int64_t replays = 0;
  return bench::median_ms_on(graph.stream(), [&] {
    clock.set(++replays);
    graph.replay();
  });
}

// One row: layer, pipeline, then the graph-timed backward, the eagerly timed backward and the graph-timed forward,
// each with its speed-up over the exact bf16 row (the first row of the layer, whose times go into *base).
struct Times {
  double bwd = 0, eager = 0, fwd = 0;
};
void print_row(const char* layer, const char* label, const Times& t, Times* base) {
  if (base->bwd == 0) *base = t;
  std::printf("%-18s %-18s %9.3f %7.2fx %9.3f %7.2fx %9.3f %7.2fx\n", layer, label, t.bwd, base->bwd / t.bwd,
              t.eager, base->eager / t.eager, t.fwd, base->fwd / t.fwd);
}

// The graph-timed forward and forward + backward of one variant: run(false) issues the forward with what it saves,
// run(true) that forward and then the backward; each must free what it allocates before it returns.
Times graph_times(const std::function<void(bool)>& run, grad::StepClock& clock) {
  Times t;
  t.fwd = graph_ms([&] { run(false); }, clock);
  t.bwd = graph_ms([&] { run(true); }, clock) - t.fwd;
  return t;
}

// HT_BENCH_PHASES=1: the time per phase of one eager forward and backward of the layer (phase_timer.h).
template <class F>
void print_phases(const char* layer, const std::string& label, F&& forward_backward) {
  if (!bench::PhaseTimer::wanted()) return;
  bench::PhaseTimer phases;
  phases.run_and_print((std::string(layer) + " " + label).c_str(), forward_backward);
}

// A convolution as training runs it (see the header): image (B, C, H, W) as the view of a channels-last map.
void run_conv(const LayerShape& l, int64_t B, const std::vector<Variant>& variants, const std::string& filter,
              Generator& gen, const Device& dev, grad::StepClock& clock) {
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
  Times base;
  for (const Variant& v : variants) {
    if (base.bwd != 0 && !selected(filter, v.label)) continue;
    const Tensor x = x32.to(v.dtype), w = w32.to(v.dtype), g = g32.to(v.dtype);
    Times t;
    auto pipe = grad::make_pipeline(v.spec);
    if (pipe->exact_forward() && pipe->exact_backward()) {  // the convolution and its backward (cuDNN), as an
                                                             // exact Conv2d trains
      const Tensor w4 = reshape(w, {l.O, C, l.k, l.k}), g4 = reshape(g, {B, H, H, l.O});
      auto backward = [&] {
        (void)conv2d_input_grad(g4, w4, H, H, p);
        (void)conv2d_weight_grad(x, g4, l.k, l.k, p);
      };
      t = graph_times(
          [&](bool with_backward) {
            (void)conv2d(x, w4, Tensor(), p);
            if (with_backward) backward();
          },
          clock);
      t.eager = bench::median_ms(backward);
    } else {
      grad::ProductInfo info;
      info.grid_h = info.grid_w = H;
      info.image = permute(x, {0, 3, 1, 2});
      info.window = u;
      const SavedTensor kept(info.image);  // as a batch norm keeps (and rebuilds) its output for backward
      grad::NoiseKey key{1, 0, 0, clock.word.data<int64_t>()};
      auto forward = [&] { return pipe->forward_conv(w, info, key, grad::SaveForBackward::yes); };
      t = graph_times(
          [&](bool with_backward) {
            grad::ForwardResult f = forward();
            if (with_backward) (void)pipe->backward(*f.saved, g, {true, true});
          },
          clock);
      grad::ForwardResult f;
      t.eager = bench::median_ms_prepared([&] { f = forward(); }, [&] { pipe->backward(*f.saved, g, {true, true}); });
      print_row(l.name, v.label, t, &base);
      print_phases(l.name, v.label, [&] {
        grad::ForwardResult fp = forward();
        (void)pipe->backward(*fp.saved, g, {true, true});
      });
      continue;
    }
    print_row(l.name, v.label, t, &base);
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
      {"vit_s4.qkv", 65, 384, 1152, 0},        {"vit_s4.proj", 65, 384, 384, 0},
      {"vit_s4.fc1", 65, 384, 1536, 0},        {"vit_s4.fc2", 65, 1536, 384, 0},
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
  hlq_int8.options_as<grad::HlqOptions>().carrier = grad::Carrier::int8;
  variants.push_back({"hlq int8 carrier", hlq_int8, DType::bf16});
  grad::PipelineSpec hlq_pad = hlq;  // 197 tokens padded to 256: HLA rank reduction on the ViT layers
  hlq_pad.options_as<grad::HlqOptions>().fallback = grad::HlaFallback::pad;
  variants.push_back({"hlq pad", hlq_pad, DType::bf16});
  grad::PipelineSpec hlq_split = hlq;
  hlq_split.options_as<grad::HlqOptions>().fallback = grad::HlaFallback::split_extra;
  variants.push_back({"hlq split_extra", hlq_split, DType::bf16});
  grad::PipelineSpec hlq_ref = hlq;
  hlq_ref.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::sample;
  variants.push_back({"hlq sample scales", hlq_ref, DType::bf16});
  grad::PipelineSpec lbp;
  lbp.name = "lbp_wht";
  variants.push_back({"lbp_wht", lbp, DType::bf16});
  grad::PipelineSpec luq;
  luq.name = "luq";
  variants.push_back({"luq", luq, DType::bf16});

  std::printf("%-18s %-18s %9s %8s %9s %8s %9s %8s\n", "layer", "pipeline", "bwd ms", "vs bf16", "eager", "vs bf16",
              "fwd ms", "vs bf16");
  Generator gen(0);
  grad::StepClock clock;  // the noise's step in device memory, as a step graph reads it (Note [Step graphs])
  clock.keep_on_device(dev);
  for (const LayerShape& l : layers) {
    if (std::string(l.name).find(layer_filter) == std::string::npos) continue;
    if (l.k > 0) {
      run_conv(l, B, variants, variant_filter, gen, dev, clock);
      continue;
    }
    const Tensor x32 = randn({B, l.L, l.I}, gen, {DType::f32, dev});
    const Tensor w32 = mul(randn({l.O, l.I}, gen, {DType::f32, dev}), 0.02);
    const Tensor g32 = mul(randn({B, l.L, l.O}, gen, {DType::f32, dev}), 1e-3);
    Times base;
    for (const Variant& v : variants) {
      if (base.bwd != 0 && !selected(variant_filter, v.label)) continue;
      const Tensor x = x32.to(v.dtype), w = w32.to(v.dtype), g = g32.to(v.dtype);
      auto p = grad::make_pipeline(v.spec);
      grad::ProductInfo info;
      info.grid_h = info.grid_w = l.grid;
      // The forward with what it saves (the product, and ACBP's projection and quantisation for hlq).
      grad::NoiseKey key{1, 0, 0, clock.word.data<int64_t>()};
      auto forward = [&] { return p->forward(x, w, info, key, grad::SaveForBackward::yes); };
      Times t = graph_times(
          [&](bool with_backward) {
            grad::ForwardResult f = forward();
            if (with_backward) (void)p->backward(*f.saved, g, {true, true});
          },
          clock);
      grad::ForwardResult f = forward();
      t.eager = bench::median_ms([&] { p->backward(*f.saved, g, {true, true}); });
      print_row(l.name, v.label, t, &base);
      if (v.spec.name != "exact")
        print_phases(l.name, v.label, [&] {
          grad::ForwardResult fp = forward();
          (void)p->backward(*fp.saved, g, {true, true});
        });
    }
  }
  return 0;
}
