// Training-step benchmark (CUDA builds): ResNet-18/34 with the CIFAR stem on random 32x32 inputs, ResNet-50 with
// the ImageNet stem (7x7 stride-2 conv, 3x3 stride-2 max pool) on 224x224 inputs and 1000 classes, ViT-S/4
// (32x32) or ViT-B/16 (224x224); 100 classes but for ResNet-50, SGD momentum 0.9, cross-entropy; forward in f32 or bf16 (f32
// master weights); every Linear / Conv2d through one gradient pipeline (exact: the plain ops). Median of 20
// timed steps after 5 warm-up steps, CUDA events, and the peak allocated memory. Compare with
// tools/bench/bench_train_torch.py in the same run.
//   bench_train [resnet18|resnet34|resnet50|vit_s4|vit_b16] [batch] [f32|bf16]
//               [exact|exact_rc|hlq|hlq_sim|hlq_gx_sim|hlq_gw_sim|hlq_split|hlq_map|hlq_a4|hlq_keep|hlq_a4_keep|
//                hlq_copy|hlq_precise|hlq_fast|hlq_rc|hlq_rc_fc1|lbp_wht|luq]
//               [nhwc|nchw]
// hlq is HLQ's defaults: a Conv2d's g_x and g_w as the specification's low-precision integer products over the
// im2col columns (conv_gx columns, conv_gw columns; fp8 / int8 tensor cores). hlq_sim runs both conv products
// simulated (conv_gx dgrad_simulated, conv_gw wgrad_simulated: bf16 cuDNN over dequantised values), hlq_gx_sim
// only g_x, hlq_gw_sim only g_w: for A/B comparison with hlq only, never a figure for HLQ itself. hlq_split is
// hlq with the split_extra fallback (a class token outside the HLA projection), hlq_map with acbp_conv
// input_map, hlq_a4 with acbp_bits 4 (packed int4 saved activations), hlq_keep and hlq_a4_keep with
// acbp_rebuild off (a Linear whose input its op can rebuild keeps its compressed copy from the forward), hlq_copy
// with acbp_share and acbp_rebuild off (every input compressed in the forward), hlq_precise and hlq_fast with
// fp8_accumulation set either way on g_x's fp8 product; hlq_rc with recompute_output on
// every mlp.fc1 and attn.qkv (the gelu and the attention keep no copy of their outputs: one more GEMM each in
// backward), hlq_rc_fc1 on mlp.fc1 only, exact_rc the same layers on exact (ViTs only). The ResNets use the
// trainer's default layout on CUDA (model.channels_last: auto = channels last, nhwc); nchw compares.
// HT_BENCH_PHASES=1 adds the time per pipeline phase of an eager step (tools/bench/phase_timer.h: HLQ's quantisers,
// projections, products, the conv fold; the rest of the step in one line).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "hadatrain/autograd/profile.h"
#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/graph.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "phase_timer.h"
#include "timing.h"

using namespace ht;

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "resnet18";
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : 256;
  const DType dt = (argc > 3 && std::string(argv[3]) == "f32") ? DType::f32 : DType::bf16;
  const std::string pipeline = argc > 4 ? argv[4] : "exact";
  const ConvLayout layout = (argc > 5 && std::string(argv[5]) == "nchw") ? ConvLayout::nchw : ConvLayout::nhwc;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  Generator gen(0);
  std::shared_ptr<nn::Module> model;
  int64_t image = 32;
  if (name == "vit_s4" || name == "vit_b16") {
    const auto cfg = name == "vit_s4" ? models::VitConfig::vit_s4(100) : models::VitConfig::vit_b16(100);
    image = cfg.image_size;
    model = std::make_shared<models::VisionTransformer>(cfg, gen, std::make_shared<Generator>(1));
  } else {
    models::ResNetConfig rc;
    rc.depth = models::resnet_depth_from_name(name);
    const bool imagenet = name == "resnet50";
    rc.stem = imagenet ? models::ResNetStem::imagenet : models::ResNetStem::cifar;
    rc.num_classes = imagenet ? 1000 : 100;
    if (imagenet) image = 224;
    rc.in_channels = 3;
    rc.layout = layout;
    model = std::make_shared<models::ResNet>(rc, gen);
  }
  model->to(dev);
  grad::PipelineConfig pc;
  pc.default_spec.name = pipeline.rfind("hlq", 0) == 0 ? "hlq" : pipeline == "exact_rc" ? "exact" : pipeline;
  // The hlq variants (see the header): each name and what it changes in the HLQ options.
  using Set = void (*)(grad::HlqOptions&);
  const std::vector<std::pair<std::string, Set>> hlq_variants = {
      {"hlq", [](grad::HlqOptions&) {}},
      {"hlq_split", [](grad::HlqOptions& o) { o.fallback = grad::HlaFallback::split_extra; }},
      {"hlq_sim", [](grad::HlqOptions& o) {
         o.conv_gx = grad::ConvGx::dgrad_simulated;
         o.conv_gw = grad::ConvGw::wgrad_simulated;
       }},
      {"hlq_gx_sim", [](grad::HlqOptions& o) { o.conv_gx = grad::ConvGx::dgrad_simulated; }},
      {"hlq_gw_sim", [](grad::HlqOptions& o) { o.conv_gw = grad::ConvGw::wgrad_simulated; }},
      {"hlq_map", [](grad::HlqOptions& o) { o.acbp_conv = grad::AcbpConv::input_map; }},
      {"hlq_a4", [](grad::HlqOptions& o) { o.acbp_bits = 4; }},
      {"hlq_copy", [](grad::HlqOptions& o) { o.acbp_rebuild = o.acbp_share = false; }},
      {"hlq_keep", [](grad::HlqOptions& o) { o.acbp_rebuild = false; }},
      {"hlq_a4_keep", [](grad::HlqOptions& o) {
         o.acbp_bits = 4;
         o.acbp_rebuild = false;
       }},
      {"hlq_precise", [](grad::HlqOptions& o) { o.fp8_accumulation = Fp8Accumulation::precise; }},
      {"hlq_fast", [](grad::HlqOptions& o) { o.fp8_accumulation = Fp8Accumulation::fast; }},
      {"hlq_rc", [](grad::HlqOptions&) {}},
      {"hlq_rc_fc1", [](grad::HlqOptions&) {}},
  };
  if (pipeline.rfind("hlq", 0) == 0) {
    const auto it = std::find_if(hlq_variants.begin(), hlq_variants.end(),
                                 [&](const auto& v) { return v.first == pipeline; });
    if (it == hlq_variants.end()) {
      std::string names;
      for (const auto& v : hlq_variants) names += (names.empty() ? "" : ", ") + v.first;
      std::fprintf(stderr, "bench_train: unknown pipeline '%s' (hlq variants: %s)\n", pipeline.c_str(), names.c_str());
      return 2;
    }
    it->second(pc.default_spec.options_as<grad::HlqOptions>());
  }
  if (pipeline == "hlq_rc" || pipeline == "hlq_rc_fc1" || pipeline == "exact_rc") {
    grad::PipelineSpec rc = pc.default_spec;  // Note [Recomputed outputs]
    rc.recompute_output = true;
    pc.overrides.emplace_back("*.mlp.fc1", rc);
    if (pipeline != "hlq_rc_fc1") pc.overrides.emplace_back("*.attn.qkv", rc);
  }
  auto clock = std::make_shared<grad::StepClock>();
  // as the trainer: a pipeline's noise step is read on the device (recordable HLQ steps)
  if (nn::any_draws_noise(nn::bind_pipelines(*model, pc, clock))) clock->keep_on_device(dev);
  auto opt = optim::make_sgd(optim::make_param_refs(model->named_parameters()), {.momentum = 0.9});
  // The image arrives in f32, as the loader hands it over, and the step casts it to the compute dtype as the
  // trainer's task does: for a channels-last ResNet into channels-last memory in the same pass (PyTorch's side
  // gets an f32 channels-last input and casts it under autocast).
  const Tensor x = randn({batch, 3, image, image}, gen, {DType::f32, dev});
  const bool cl_input = name.rfind("resnet", 0) == 0 && layout == ConvLayout::nhwc;
  auto input = [&] { return cl_input ? to_dtype_in_order(x, dt, {0, 2, 3, 1}) : x.to(dt); };
  const Tensor y = from_vector(std::vector<int64_t>(static_cast<std::size_t>(batch), 7), {batch}, {DType::i64, dev});
  const CrossEntropyOptions ce{.target_check = TargetCheck::deferred};  // as the trainer: no sync per step
  auto step = [&] {
    const Tensor loss = cross_entropy(model->forward(input()), y, ce);
    opt->zero_grad();
    loss.backward();
    opt->step(0.1);
  };
  const double med = bench::median_ms(step, 5, 20, [] { cuda::reset_peak(); });
  const auto mem = cuda::memory_stats();
  const bool is_vit = name == "vit_s4" || name == "vit_b16";
  std::printf("hadatrain %s batch %lld %s forward, %s, %s: %.2f ms/step, %.0f img/s, peak allocated %.2f GiB\n",
              name.c_str(), static_cast<long long>(batch), dtype_name(dt).data(), pipeline.c_str(),
              is_vit ? "tokens" : (layout == ConvLayout::nhwc ? "nhwc" : "nchw"), med,
              batch / med * 1000.0,
              static_cast<double>(mem.peak_allocated_bytes) / (1 << 30));
  // Where a step's time goes: forward, backward and optimiser phases between device synchronisations
  // (median of 5 steps), and with HADATRAIN_PROFILE_BACKWARD=1 the backward time per node type
  // (Note [Backward profile]; the step time above is then distorted by the synchronisations).
  std::vector<double> fw, bw, op;
  backward_profile_reset();  // the table covers the 5 phase steps below, after every one-off first call
  auto now = [] {
    cudaDeviceSynchronize();
    return std::chrono::steady_clock::now();
  };
  auto ms_between = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  // Where the peak is (last phase step): the memory live before the step (parameters, gradients, optimiser
  // state), after the forward (plus what the forward saved for backward and the loss), and the peaks
  // reached inside the forward and inside the backward (saved tensors plus the backward's temporaries).
  auto gib = [](std::size_t b) { return static_cast<double>(b) / (1 << 30); };
  std::size_t before = 0, after_fw = 0, peak_fw = 0, peak_bw = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = now();
    before = cuda::memory_stats().allocated_bytes;
    cuda::reset_peak();
    const Tensor loss = cross_entropy(model->forward(input()), y, ce);
    const auto t1 = now();
    const cuda::MemoryStats fw_stats = cuda::memory_stats();
    after_fw = fw_stats.allocated_bytes;
    peak_fw = fw_stats.peak_allocated_bytes;
    opt->zero_grad();
    cuda::reset_peak();
    loss.backward();
    const auto t2 = now();
    peak_bw = cuda::memory_stats().peak_allocated_bytes;
    opt->step(0.1);
    const auto t3 = now();
    fw.push_back(ms_between(t0, t1));
    bw.push_back(ms_between(t1, t2));
    op.push_back(ms_between(t2, t3));
  }
  for (auto* v : {&fw, &bw, &op}) std::sort(v->begin(), v->end());
  std::printf("  phases: forward %.2f ms, backward %.2f ms, optimiser %.2f ms\n", fw[2], bw[2], op[2]);
  std::printf("  memory: before step %.2f GiB, after forward %.2f GiB (saved for backward %.2f), forward peak %.2f "
              "GiB, backward peak %.2f GiB\n",
              gib(before), gib(after_fw), gib(after_fw - before), gib(peak_fw), gib(peak_bw));
  // Host time to issue one whole step (no synchronisation inside; the device drained before): when it is
  // close to the step time, the GPU waits for the CPU (launch and dispatch overhead), not for kernels.
  // Median host time of 5 calls of f, each issued on a drained device.
  auto host_ms = [&](auto&& f) {
    std::vector<double> host;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = now();
      f();
      host.push_back(ms_between(t0, std::chrono::steady_clock::now()));
      now();
    }
    std::sort(host.begin(), host.end());
    return host[2];
  };
  std::printf("  host issue time per step: %.2f ms (vs %.2f ms step)\n", host_ms(step), med);
  const std::string prof = backward_profile_report();
  if (!prof.empty() && prof.find('\n') != prof.size() - 1) std::printf("%s", prof.c_str());
  // HT_BENCH_PHASES=1: the step's time per pipeline phase (phase_timer.h; eager, before the graph is recorded).
  if (bench::PhaseTimer::wanted()) {
    bench::PhaseTimer phases;
    phases.run_and_print((name + " batch " + std::to_string(batch) + " " + pipeline).c_str(), step);
  }

  // The same step recorded once into a CUDA graph and replayed (cuda/graph.h): what the trainer runs with
  // train.cuda_graph. Warm-up steps on the graph's stream first (workspaces there, buffers exist). Not with
  // HADATRAIN_PROFILE_BACKWARD: its per-node synchronisations cannot be recorded.
  if (backward_profiling()) {
    std::printf("  step graph: not recorded (HADATRAIN_PROFILE_BACKWARD synchronises after every backward node)\n");
  } else {
    cuda::StepGraph graph(0);
    cuda::StreamGuard on(graph.stream(), 0);
    auto body = [&] {
      const Tensor loss = cross_entropy(model->forward(input()), y, ce);
      loss.backward();
      opt->apply();
      opt->zero_grad();
    };
    opt->zero_grad();
    for (int i = 0; i < 3; ++i) {
      opt->begin_step(0.1);
      body();
    }
    cuda::empty_cache(0);  // the eager steps' cached blocks go back: the graph allocates its own memory
    const std::string why = graph.record(body);
    if (!why.empty()) {
      std::printf("  step graph: not used: %s\n", why.c_str());
    } else {
      int64_t replays = 0;
      auto replay = [&] {
        clock->set(++replays);  // each replay draws its own noise, as in training
        opt->begin_step(0.1);
        graph.replay();
      };
      const double gmed = bench::median_ms_on(graph.stream(), replay, 5, 20);
      size_t graph_mem = 0;
      cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &graph_mem);
      const double ghost = host_ms(replay);
      std::printf("hadatrain %s batch %lld %s forward, %s, step graph: %.2f ms/step, %.0f img/s, graph memory %.2f GiB, "
                  "host issue %.3f ms, %zu nodes (%s)\n",
                  name.c_str(), static_cast<long long>(batch), dtype_name(dt).data(), pipeline.c_str(), gmed,
                  batch / gmed * 1000.0, static_cast<double>(graph_mem) / (1 << 30), ghost, graph.nodes(),
                  graph.node_kinds().c_str());
    }
  }
  return 0;
}
