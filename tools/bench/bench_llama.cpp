// LLaMA training-step benchmark (CUDA builds): a LlamaConfig preset with random weights, fp32 master weights,
// bf16 forward and backward, next-token cross-entropy in fp32 over all positions, AdamW (lr 1e-5, weight decay
// 0.1); the seven projections (`*_proj`) through one gradient pipeline (exact: the plain ops), lm_head and LoRA
// adapters exact, as the LLaMA configs bind them. Full fine-tuning, or --lora: LoRA rank 16 (alpha 32) on
// q_proj,k_proj,v_proj,o_proj with the base frozen and held in bf16 (no f32 master, as the trainer holds it with
// train.precision bf16; the adapters f32). Median of 12 timed steps after 4 warm-up steps, eager and the whole
// step recorded into one CUDA graph (what the trainer runs with train.cuda_graph: auto), CUDA events, peak
// allocated memory. tools/bench/bench_llama_torch.py is the PyTorch side (transformers LlamaForCausalLM) with the
// same shapes and the same model-FLOPs count.
//   bench_llama [llama32_1b|llama3_8b|sotu_small|tiny] [batch] [seq]
//               [exact|hlq|hlq_precise|hlq_fast|hlq_full|halo<L>_<int8|fp8|fp8_precise>|<pipeline>] [--lora] [--peak-tflops T]
//               [--phases]
// --phases also prints the eager step split into forward (loss included), backward (zero_grad included, which the
// step issues first) and the AdamW update, each the median over 12 steps of the time between CUDA events.
// halo2_fp8 is the halo pipeline at level 2 with the fp8 carrier (halo0_int8, halo1_fp8, ... likewise);
// halo2_fp8_precise the same with `fp8_accumulation: precise` (the default is fast); hlq_precise and hlq_fast are
// hlq with that key set either way, hlq_full hlq with `rank: full`. After the step graph's replays the loss of one
// more forward is printed with its bits (same seeds and steps in every run; the step itself is not bitwise
// reproducible: flash attention's dq and the embedding gradient add with f32 atomics, docs/cuda_backend.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/graph.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "timing.h"

using namespace ht;

namespace {

// The PaLM count, as bench_llama_torch.py: 6 * (parameters outside the embedding, lm_head included)
// + 12 * layers * heads * head_dim * sequence, per token.
double model_flops_per_token(const models::LlamaConfig& c, int64_t seq) {
  const double hd = static_cast<double>(c.resolved_head_dim());
  const double h = static_cast<double>(c.hidden_size);
  const double attn = h * hd * static_cast<double>(2 * c.num_attention_heads + 2 * c.num_key_value_heads);
  const double mlp = 3.0 * h * static_cast<double>(c.intermediate_size);
  const double n = static_cast<double>(c.num_hidden_layers) * (attn + mlp) + static_cast<double>(c.vocab_size) * h;
  return 6.0 * n + 12.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads) * hd *
                       static_cast<double>(seq);
}

// Times `reps` eager steps phase by phase on the default stream: forward (the loss), zero_grad and backward, the
// optimiser's update; prints each phase's median.
template <class Loss, class Zero, class Update>
void print_phases(Loss&& loss_of, Zero&& zero_grad, Update&& update, int reps) {
  cudaEvent_t ev[4];
  for (auto& e : ev) cudaEventCreate(&e);
  std::vector<float> fwd, bwd, opt;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(ev[0], nullptr);
    const Tensor loss = loss_of();
    cudaEventRecord(ev[1], nullptr);
    zero_grad();
    loss.backward();
    cudaEventRecord(ev[2], nullptr);
    update();
    cudaEventRecord(ev[3], nullptr);
    cudaEventSynchronize(ev[3]);
    float a = 0, b = 0, c = 0;
    cudaEventElapsedTime(&a, ev[0], ev[1]);
    cudaEventElapsedTime(&b, ev[1], ev[2]);
    cudaEventElapsedTime(&c, ev[2], ev[3]);
    fwd.push_back(a);
    bwd.push_back(b);
    opt.push_back(c);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("  eager phases (median of %d steps): forward %.2f ms, backward %.2f ms, optimiser %.2f ms\n", reps,
              median(fwd), median(bwd), median(opt));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  bool lora = false, phases = false;
  double peak_tflops = 989.0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--lora") {
      lora = true;
    } else if (a == "--phases") {
      phases = true;
    } else if (a == "--peak-tflops" && i + 1 < argc) {
      peak_tflops = std::atof(argv[++i]);
    } else {
      pos.push_back(a);
    }
  }
  const std::string preset = pos.size() > 0 ? pos[0] : "llama32_1b";
  const int64_t batch = pos.size() > 1 ? std::stoll(pos[1]) : 8;
  const int64_t seq = pos.size() > 2 ? std::stoll(pos[2]) : 2048;
  const std::string pipeline = pos.size() > 3 ? pos[3] : "exact";
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  const models::LlamaConfig cfg = models::LlamaConfig::preset(preset);
  Generator gen(0);
  models::LlamaBuild build{.init = models::LlamaInit::normal, .gen = &gen};
  std::unique_ptr<nn::LoraFactory> lora_factory;
  if (lora) {
    nn::LoraConfig lc;
    lc.rank = 16;
    lc.alpha = 32.0;
    lc.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
    lora_factory = std::make_unique<nn::LoraFactory>(lc, std::make_shared<Generator>(1), std::make_shared<Generator>(2));
    build.make_linear = lora_factory->factory();
  }
  auto model = std::make_shared<models::Llama>(cfg, build);
  if (lora) {
    lora_factory->check_targets();
    nn::freeze_non_lora(*model);
    // What the trainer does with train.precision bf16 (Note [Frozen base in the compute dtype], nn/lora.h): the
    // frozen matrices held in bf16, no f32 master and no per-step cast; before the move, so the device never
    // holds the f32 base.
    const nn::FrozenStore f = nn::store_frozen_in(*model, DType::bf16);
    std::printf("bench_llama: %lld frozen matrices held in bf16: %.2f GiB (f32 masters: %.2f GiB)\n",
                static_cast<long long>(f.params), static_cast<double>(f.bytes_after) / (1 << 30),
                static_cast<double>(f.bytes_before) / (1 << 30));
  }
  model->compute_dtype = DType::bf16;
  model->to(dev);

  // As the LLaMA configs bind it: the seven projections (`*_proj`) through the pipeline, everything else exact
  // (lm_head, and with --lora the adapters `*_proj.lora_A` / `lora_B`, which the pattern does not match).
  grad::PipelineSpec spec;
  spec.name = pipeline;
  if (pipeline.size() > 6 && pipeline.rfind("halo", 0) == 0 && pipeline[5] == '_') {  // halo<L>_<carrier>
    spec.name = "halo";
    auto& o = spec.options_as<grad::HaloOptions>();
    o.level = pipeline[4] - '0';
    const std::string carrier = pipeline.substr(6);
    if (carrier != "int8" && carrier != "fp8" && carrier != "fp8_precise") {
      std::fprintf(stderr, "bench_llama: '%s': the carrier is int8, fp8 or fp8_precise\n", pipeline.c_str());
      return 2;
    }
    o.carrier = carrier == "int8" ? grad::Carrier::int8 : grad::Carrier::fp8;
    if (carrier == "fp8_precise") o.fp8_accumulation = Fp8Accumulation::precise;
  }
  if (pipeline == "hlq_full") {  // HLA keeping every sequency row (docs/language_models.md, HLQ on LLaMA)
    spec.name = "hlq";
    spec.options_as<grad::HlqOptions>().rank = grad::HlaRank::all();
  }
  if (pipeline == "hlq_precise" || pipeline == "hlq_fast") {
    spec.name = "hlq";
    spec.options_as<grad::HlqOptions>().fp8_accumulation =
        pipeline == "hlq_fast" ? Fp8Accumulation::fast : Fp8Accumulation::precise;
  }
  grad::PipelineConfig pc;
  pc.default_spec.name = "exact";
  pc.overrides.emplace_back("*_proj", spec);
  auto clock = std::make_shared<grad::StepClock>();
  if (nn::any_draws_noise(nn::bind_pipelines(*model, pc, clock))) clock->keep_on_device(dev);

  std::vector<optim::ParamRef> params;
  int64_t trainable = 0;
  for (auto& p : optim::make_param_refs(model->named_parameters())) {
    if (!p.param->requires_grad()) continue;
    trainable += p.param->numel();
    params.push_back(p);
  }
  auto opt = optim::make_adamw(params, {.weight_decay = 0.1});
  // token ids uniform in [0, vocab - 1) (f32 holds these integers exactly; the cast truncates)
  auto random_ids = [&](Shape shape) {
    return uniform(shape, 0.0, static_cast<double>(cfg.vocab_size - 1), gen, {DType::f32, dev}).to(DType::i64);
  };
  const Tensor ids = random_ids({batch, seq});
  const Tensor labels = random_ids({batch * seq});
  const CrossEntropyOptions ce{.target_check = TargetCheck::deferred};
  auto loss_of = [&] { return cross_entropy(reshape(model->forward(ids), {batch * seq, cfg.vocab_size}), labels, ce); };
  auto step = [&] {
    const Tensor loss = loss_of();
    opt->zero_grad();
    loss.backward();
    opt->step(1e-5);
  };
  const double tokens = static_cast<double>(batch * seq);
  const double flops = model_flops_per_token(cfg, seq);
  auto report = [&](const char* form, double ms, double gib) {
    const double tok_s = tokens / ms * 1000.0;
    std::printf("hadatrain %s batch %lldx%lld %s%s, %s: %.2f ms/step, %.0f tok/s, MFU %.3f, peak allocated %.2f GiB\n",
                preset.c_str(), static_cast<long long>(batch), static_cast<long long>(seq), pipeline.c_str(),
                lora ? " lora" : "", form, ms, tok_s, tok_s * flops / (peak_tflops * 1e12), gib);
  };
  std::printf("bench_llama: %s, %.3f B parameters, %.3f B trainable\n", preset.c_str(),
              static_cast<double>(cfg.num_parameters()) / 1e9, static_cast<double>(trainable) / 1e9);
  const double med = bench::median_ms(step, 4, 12, [] { cuda::reset_peak(); });
  report("eager", med, static_cast<double>(cuda::memory_stats().peak_allocated_bytes) / (1 << 30));
  if (phases) print_phases(loss_of, [&] { opt->zero_grad(); }, [&] { opt->step(1e-5); }, 12);

  cuda::StepGraph graph(0);
  cuda::StreamGuard on(graph.stream(), 0);
  auto body = [&] {
    const Tensor loss = loss_of();
    loss.backward();
    opt->apply();
    opt->zero_grad();
  };
  opt->zero_grad();
  for (int i = 0; i < 2; ++i) {
    opt->begin_step(1e-5);
    body();
  }
  cuda::empty_cache(0);
  const std::string why = graph.record(body);
  if (!why.empty()) {
    std::printf("  step graph: not used: %s\n", why.c_str());
    return 0;
  }
  int64_t replays = 0;
  auto replay = [&] {
    clock->set(++replays);
    opt->begin_step(1e-5);
    graph.replay();
  };
  const double gmed = bench::median_ms_on(graph.stream(), replay, 3, 12);
  size_t graph_mem = 0;
  cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &graph_mem);
  const auto stats = cuda::memory_stats();
  report("step graph", gmed, static_cast<double>(graph_mem + stats.allocated_bytes) / (1 << 30));
  const float last = static_cast<float>(loss_of().to(DType::f32).item());  // an f32 loss: exact in double
  uint32_t bits = 0;
  std::memcpy(&bits, &last, sizeof bits);
  std::printf("  loss after %lld replays: %.9g (bits 0x%08x)\n", static_cast<long long>(replays), last, bits);
  return 0;
}
