// Per-layer benchmark of HALO (CUDA builds): the Llama-3-8B projection shapes at 8192 tokens (4 sequences of
// 2048), or the Llama-3.2-1B ones at 16384 tokens (8 of 2048: bench_llama's batch), forward + backward of one Linear
// (no bias) as training runs it, for exact bf16 (cuBLASLt bf16 GEMMs), HALO levels 0 / 1 / 2 with the int8 and fp8
// carriers, and HLQ (exact forward, quantised backward); HALO-2 fp8 and HLQ also with `overlap: false` ("one
// stream": g_w's chain not on a side stream, Notes [HALO's two chains], [HLQ's two chains]), both also with
// `fp8_accumulation: precise` (both default to fast), and HLQ also with `rank: full` (HLA keeping every row). Each
// case is recorded into a step graph (after 3 eager warm-ups that create and tune the GEMM plans)
// and replayed: the forward alone (with what it saves) and the forward followed by the backward; the median of
// 30 replays each, every graph of a layer replayed in turn (round_robin_ms), the backward the difference. Prints
// one JSON line per case in the "kernels" format of docs/results/ (merge with `python3
// tools/bench/results_page.py --merge FILE`), with the forward, backward and their speed-up over exact bf16.
// Two more lines per layer bound HALO-2 fp8 (Note [HALO's bound per layer]): its three fp8 GEMMs alone ("halo2
// fp8 GEMMs alone", with the default's fast accumulation, and "... precise-accumulation GEMMs alone"), timed in the
// same rounds, and those plus its memory passes' bytes at the HBM's peak rate ("halo2 fp8 bound") and at the rate
// of a plain copy measured in the same rounds ("halo2 fp8 bound at the copy rate").
// Each line also has the eager step as a training step issues it (first_call_ms: the first forward + backward, host
// wall clock to completion, GEMM plan creation and tuning included; eager_ms: the median of 10 later ones), so a
// cost that only eager steps pay (a host synchronisation, per-call set-up) shows beside the replayed time.
//   bench_halo [layer filter] [variant filter] [llama3_8b|llama32_1b]   (substrings; exact bf16 always runs)
//   HT_BENCH_COMMIT / HT_BENCH_MACHINE override the commit (default `git rev-parse --short HEAD`) and machine.
//   HT_BENCH_PHASES=1 adds, for each HALO case, where its eager forward + backward spends the time: a CUDA event at
//   each phase mark of the pipeline (grad::halo_phase: quantisers, transposes, GEMMs, int8 epilogues, rotations
//   back), 5 runs after the timed ones, and one JSON line per phase with the median ms between its mark and the
//   next, on stderr (they are not results records: `2> phases.jsonl` keeps them apart from the merged lines). For
//   HLQ the same variable prints, on stderr, the table of its phase marks (grad::mark_phase; tools/bench/phase_timer.h).
//   HT_BENCH_KERNELS=1 adds, for each layer, the HALO primitives alone on its operands (eager, current stream): the
//   rotating quantisers of x and W (whole, and their absmax and quantise passes apart), the paired quantiser of
//   g_yᵀ and the rotated absmax pass of g_yᵀ alone, a rotation back, the byte and bf16 transposes, each as a JSON
//   line on stderr with its median ms and the rate its minimal bytes imply (GB/s: reads of the input per pass plus
//   the outputs written), to compare with the memory rate; HT_BENCH_KERNELS=only prints those alone (no pipeline
//   timing: a short run to profile the kernels).
//   HT_BENCH_ERRORS=1 adds each case's relative errors of Y, g_x and g_w against f64 products of the same operands,
//   as records on stdout (Note [Errors per layer]).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/cuda/check.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/graph.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/factory.h"
#include "phase_timer.h"
#include "timing.h"

using namespace ht;
using ht::bench::command_line;
using ht::bench::env_or;
using ht::bench::shell_line;

namespace {

struct LayerShape {
  const char* name;
  int64_t I, O;
};

struct Variant {
  std::string label;
  grad::PipelineSpec spec;
};

// The median of v (v not empty; reordered).
double median(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// body recorded into a step graph after 3 eager warm-ups; null (with the reason on stderr) if the recording is refused.
std::unique_ptr<cuda::StepGraph> record_graph(const std::function<void()>& body) {
  auto graph = std::make_unique<cuda::StepGraph>(0);
  cuda::StreamGuard on(graph->stream(), 0);
  for (int i = 0; i < 3; ++i) body();
  cudaDeviceSynchronize();
  if (const std::string why = graph->record(body); !why.empty()) {
    std::fprintf(stderr, "step graph refused: %s\n", why.c_str());
    return nullptr;
  }
  return graph;
}

// The median replay time of each graph (NaN for a null one), replayed in turns: kRounds rounds after 3 untimed
// ones, each replaying every graph once between two events on its stream. Taking turns puts every case of a layer
// under the same clocks and temperature, so a drift during the call moves all of them alike instead of favouring
// whichever ran first.
std::vector<double> round_robin_ms(const std::vector<cuda::StepGraph*>& graphs) {
  constexpr int kRounds = 30;
  cudaEvent_t a = nullptr, b = nullptr;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<std::vector<double>> ms(graphs.size());
  for (int round = -3; round < kRounds; ++round)
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      if (!graphs[i]) continue;
      cudaEventRecord(a, graphs[i]->stream());
      graphs[i]->replay();
      cudaEventRecord(b, graphs[i]->stream());
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      if (round >= 0) ms[i].push_back(t);
    }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::vector<double> out;
  for (auto& v : ms) out.push_back(v.empty() ? std::nan("") : median(v));
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// HT_BENCH_PHASES: runs `step` (one eager forward + backward) kReps times with a CUDA event recorded on the current
// stream at every grad::halo_phase mark, and prints the median time of each phase (mark to next mark; the time
// after an "end" mark is outside the pipeline and not reported) as a JSON line on stderr.
void print_phases(const std::function<void()>& step, const std::string& layer, const std::string& variant,
                  const std::string& commit) {
  constexpr int kReps = 5;
  struct Mark {
    std::string name;
    cudaEvent_t event;
  };
  std::vector<Mark> marks;
  grad::set_halo_phase_hook([&](const char* name) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    cudaEventRecord(e, cuda::current_stream(0));
    marks.push_back({name, e});
  });
  std::vector<std::string> names;
  std::vector<std::vector<double>> ms;
  bool consistent = true;
  for (int rep = 0; rep < kReps; ++rep) {
    marks.clear();
    step();
    cudaDeviceSynchronize();
    std::vector<std::string> these;
    std::vector<double> times;
    for (std::size_t i = 0; i + 1 < marks.size(); ++i) {
      if (marks[i].name == "end") continue;
      float t = 0;
      cudaEventElapsedTime(&t, marks[i].event, marks[i + 1].event);
      these.push_back(marks[i].name);
      times.push_back(t);
    }
    for (Mark& m : marks) cudaEventDestroy(m.event);
    if (rep == 0) {
      names = these;
      ms.assign(names.size(), {});
    }
    if (these != names) {
      consistent = false;
      break;
    }
    for (std::size_t i = 0; i < times.size(); ++i) ms[i].push_back(times[i]);
  }
  grad::set_halo_phase_hook({});
  if (!consistent) {
    std::fprintf(stderr, "bench_halo: the phases of %s, %s differ between runs; not reported\n", layer.c_str(),
                 variant.c_str());
    return;
  }
  double sum = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const double med = median(ms[i]);
    sum += med;
    std::fprintf(stderr,
                 "{\"phases\": \"halo eager forward + backward\", \"layer\": \"%s\", \"variant\": \"%s\", "
                 "\"index\": %zu, \"phase\": \"%s\", \"ms\": %.4f, \"commit\": \"%s\"}\n",
                 layer.c_str(), variant.c_str(), i, json_escape(names[i]).c_str(), med, commit.c_str());
  }
  std::fprintf(stderr,
               "{\"phases\": \"halo eager forward + backward\", \"layer\": \"%s\", \"variant\": \"%s\", "
               "\"phase\": \"sum of the phases\", \"ms\": %.4f, \"commit\": \"%s\"}\n",
               layer.c_str(), variant.c_str(), sum, commit.c_str());
  std::fflush(stderr);
}

// HT_BENCH_KERNELS: one line per primitive (above) for operands x (T, I), W (O, I), g_y (T, O) of dtype bf16.
void print_kernels(const Tensor& x2, const Tensor& w, const Tensor& g2, const std::string& layer,
                   const std::string& commit) {
  const int64_t T = x2.size(0), I = x2.size(1), O = w.size(0);
  const grad::HaloRotation rot_i = grad::halo_rotation_size(I), rot_t = grad::halo_rotation_size(T);
  const Tensor gt = grad::halo_transpose(g2);  // (O, T), as level 2 quantises it
  const Tensor wq = grad::halo_quantize(w, grad::Carrier::fp8, rot_i).codes;  // (O, n_I)
  const Tensor gw = w.contiguous();  // a bf16 (O, I) matrix to rotate back, as the g_w product's output
  auto line = [&](const std::string& what, double bytes, const std::function<void()>& f) {
    const double ms = bench::median_ms(f, 3, 20);
    std::fprintf(stderr,
                 "{\"kernels\": \"halo primitives\", \"layer\": \"%s\", \"kernel\": \"%s\", \"ms\": %.4f, "
                 "\"GB_per_s\": %.1f, \"commit\": \"%s\"}\n",
                 layer.c_str(), what.c_str(), ms, bytes / (ms * 1e6), commit.c_str());
  };
  const double b16 = 2.0;  // bytes of a bf16 element
  // A rotating quantiser Q(t·H) of x or W whole, then its two passes apart (halo_quantize is halo_absmax and then
  // halo_quantize_with_absmax, the same kernels): what the absmax pass costs is what a quantiser given its scale
  // from elsewhere (a previous step's absmax, delayed scaling; not the specification's, halo.md §3) would save.
  const auto rotating_quantiser = [&](const std::string& name, const Tensor& t) {
    const double read = static_cast<double>(t.numel()) * b16, codes = static_cast<double>(t.size(0)) * rot_i.n;
    line(fmt::format("Q({}·H) fp8 (two passes over {}, codes)", name, name), 2 * read + codes,
         [&] { (void)grad::halo_quantize(t, grad::Carrier::fp8, rot_i); });
    const Tensor m = grad::halo_absmax(t, rot_i);
    line(fmt::format("Q({}·H) absmax pass alone (reads {})", name, name), read,
         [&] { (void)grad::halo_absmax(t, rot_i); });
    line(fmt::format("Q({}·H) fp8 quantise pass alone, absmax given (reads {}, codes)", name, name), read + codes,
         [&] { (void)grad::halo_quantize_with_absmax(t, grad::Carrier::fp8, rot_i, m); });
  };
  rotating_quantiser("x", x2);
  rotating_quantiser("W", w);
  // The paired quantiser's absmax pass takes the rotated and the unrotated max of g_yᵀ in one kernel; the rotated
  // one alone stands in for it here.
  line("absmax pass of g_yᵀ·H_T alone (reads g_yᵀ; rotated max only)", static_cast<double>(O) * T * b16,
       [&] { (void)grad::halo_absmax(gt, rot_t); });
  line("paired Q(g_yᵀ), Q(g_yᵀ·H_T) fp8 (two passes over g_yᵀ, both codes)",
       static_cast<double>(O) * T * 2 * b16 + static_cast<double>(O) * (T + rot_t.n),
       [&] { (void)grad::halo_quantize_pair(gt, grad::Carrier::fp8, rot_t); });
  line("rotate back (O, n_I) bf16 -> (O, I) bf16", static_cast<double>(O) * (rot_i.n + I) * b16, [&] {
    (void)grad::halo_rotate(gw, {rot_i, grad::HaloDirection::inverse, I, 1.0f, DType::bf16});
  });
  line("transpose codes (O, n_I)", 2.0 * static_cast<double>(O) * rot_i.n, [&] { (void)grad::halo_transpose(wq); });
  line("transpose bf16 g_y (T, O)", 2.0 * static_cast<double>(T) * O * b16, [&] { (void)grad::halo_transpose(g2); });
  std::fflush(stderr);
}

// Note [HALO's bound per layer]
// What HALO-2 fp8 could reach per layer if only its GEMMs and its memory passes cost time, both measured in the
// call that times the pipeline. The floor is its three fp8 products alone (fast accumulation, the pipeline's
// default), on codes of the shapes the pipeline
// hands cuBLASLt (forward Y = Q(x·H)·Q(W·H)ᵀ, (T, O); g_w from Q(g_yᵀ) (O, T) and Q(x·H)ᵀ (n_I, T); g_x from
// Q(W·H)ᵀ (n_I, O) and Q(g_yᵀ·H_T)ᵀ (n_T, O)), recorded and replayed like the pipelines: the pipeline's time less
// this is the cost of everything that is not a GEMM. The passes' bytes are those of the level-2 dataflow (Note
// [HALO passes over memory] in src/grad/pipeline_halo.cpp: what the quantisers, transposes and rotations back read
// and write; GEMM operands and outputs excluded), and the memory rate is the HBM's peak (from the device's memory
// clock and bus width), which no kernel exceeds: floor + bytes / peak is then the least time of that dataflow on
// this GPU, and exact's time over it the most speed it can show. The line also gives the rate every pass would
// need for 1.5× (required_GB_per_s; none where the GEMMs alone leave no time). No kernel reaches the peak either: a
// second line ("halo2 fp8 bound at the copy rate") puts the same bytes at the rate of the faster of two plain
// copies of 1 GiB replayed in the same rounds (our copy kernel, `clone`, and cudaMemcpyAsync device to device; the
// rate counts the bytes read and written), what a pass that only moves its bytes through DRAM reaches here. It is
// not a bound in the strict sense where a pass finds its input in L2 (a tensor of a few tens of MB just written by
// the pass before, Note [HALO row order]), which the small layers' passes can.
constexpr int64_t kCopyBytes = int64_t{1} << 30;  // the copy rate's buffer: 1 GiB, twenty times the L2

std::string fmt_required(double gb_per_s) {
  char b[64];
  std::snprintf(b, sizeof b, "\"required_GB_per_s\": %.1f, ", gb_per_s);
  return b;
}

struct PassBytes {
  double fwd = 0, bwd = 0;
};
PassBytes halo2_pass_bytes(int64_t T, int64_t I, int64_t O) {
  const double t = static_cast<double>(T), i = static_cast<double>(I), o = static_cast<double>(O);
  const double ni = static_cast<double>(grad::halo_rotation_size(I).n);
  const double nt = static_cast<double>(grad::halo_rotation_size(T).n);
  PassBytes b;
  // Q(x·H) and Q(W·H) (two passes each, codes written), then the byte transposes of both that backward keeps
  b.fwd = 4 * t * i + t * ni + 4 * o * i + o * ni + 2 * t * ni + 2 * o * ni;
  b.bwd = 4 * t * o                     // g_yᵀ, a bf16 transpose
          + 4 * t * o + t * o + o * nt  // the paired quantiser: two passes over g_yᵀ, both codes
          + 2 * o * (ni + i)            // g_w rotated back along in
          + 2 * o * nt                  // Q(g_yᵀ·H_T)ᵀ, a byte transpose
          + 2 * ni * (nt + t)           // g_x rotated back along T
          + 4 * t * ni                  // its bf16 transpose
          + 2 * t * (ni + i);           // rotated back along in
  return b;
}

// Note [Errors per layer]
// How far each case's three products land from the same products of the same bf16 operands computed in f64
// (cuBLASLt fp64): ||out − ref||_F / ||ref||_F for Y (T, O), g_x (T, I) and g_w (O, I), from one eager forward +
// backward with the case's noise key. exact bf16's figures are its bf16 outputs' rounding (about 2^-9 relative);
// a pipeline's above them are what its quantisers add and, with fp8 fast accumulation, what the tensor cores'
// narrower accumulator adds (halo.md §10 asks for that choice to be made on figures). The operands are the timing's
// (Gaussian x and g_y, W of standard deviation 0.02), which have no outlier channels: these figures measure the
// carriers and accumulators, not what a rotation buys on a trained model's activations (inspect-grads does that on
// a config's real batch). Cases that give the bits of another by design (one stream; HLQ's precise accumulation,
// Note [Fast accumulation of integer codes]) are left out; HALO's precise accumulation is not among them.
struct Reference {
  Tensor y, gx, gw;  // f64: x·Wᵀ (T, O), g_y·W (T, I), g_yᵀ·x (O, I)
};

Reference reference_products(const Tensor& x2, const Tensor& w, const Tensor& g2) {
  const Tensor xd = x2.to(DType::f64), wd = w.to(DType::f64), gd = g2.to(DType::f64);
  return {matmul(xd, transpose(wd, 0, 1).contiguous()), matmul(gd, wd), matmul(transpose(gd, 0, 1).contiguous(), xd)};
}

double rel_error(const Tensor& out, const Tensor& ref) {
  const Tensor d = sub(reshape(out, ref.shape()).to(DType::f64), ref);
  return std::sqrt(sum(mul(d, d)).item() / sum(mul(ref, ref)).item());
}

bool has_own_numerics(const std::string& label) {
  return label.find("one stream") == std::string::npos && label != "hlq precise accumulation";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string layer_filter = argc > 1 ? argv[1] : "", variant_filter = argc > 2 ? argv[2] : "";
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int mem_khz = 0, bus_bits = 0;  // the HBM's peak rate in GB/s: two transfers a clock over the bus
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  const double peak = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  const std::string commit = env_or("HT_BENCH_COMMIT", shell_line("git rev-parse --short HEAD 2>/dev/null"));
  const std::string machine = env_or("HT_BENCH_MACHINE", std::string("1x ") + prop.name);
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string command = command_line(argc, argv);

  const std::string preset = argc > 3 ? argv[3] : "llama3_8b";
  if (preset != "llama3_8b" && preset != "llama32_1b") {
    std::fprintf(stderr, "bench_halo: unknown shape set '%s' (llama3_8b or llama32_1b)\n", preset.c_str());
    return 2;
  }
  const bool small = preset == "llama32_1b";
  const int64_t B = small ? 8 : 4, L = 2048;  // 16384 or 8192 tokens
  const std::vector<LayerShape> layers =
      small ? std::vector<LayerShape>{{"q_proj 2048->2048", 2048, 2048},
                                      {"k_proj 2048->512", 2048, 512},
                                      {"up_proj 2048->8192", 2048, 8192},
                                      {"down_proj 8192->2048", 8192, 2048}}
            : std::vector<LayerShape>{{"q_proj 4096->4096", 4096, 4096},
                                      {"up_proj 4096->14336", 4096, 14336},
                                      {"down_proj 14336->4096", 14336, 4096}};
  const std::string group = small ? "HALO per layer (Llama-3.2-1B, 16384 tokens, bf16)"
                                  : "HALO per layer (Llama-3-8B, 8192 tokens, bf16)";
  std::vector<Variant> variants;
  variants.push_back({"exact bf16", {}});
  for (int level : {0, 1, 2})
    for (grad::Carrier c : {grad::Carrier::int8, grad::Carrier::fp8}) {
      grad::PipelineSpec s;
      s.name = "halo";
      auto& o = s.options_as<grad::HaloOptions>();
      o.level = level;
      o.carrier = c;
      variants.push_back({"halo" + std::to_string(level) + (c == grad::Carrier::int8 ? " int8" : " fp8"), s});
    }
  {
    grad::PipelineSpec s;  // g_w's chain on the same stream as g_x's (Note [HALO's two chains])
    s.name = "halo";
    auto& o = s.options_as<grad::HaloOptions>();
    o.carrier = grad::Carrier::fp8;
    o.overlap = false;
    variants.push_back({"halo2 fp8 one stream", s});
    o.overlap = true;
    o.fp8_accumulation = Fp8Accumulation::precise;  // partial sums promoted to f32 (the default is fast: halo.md §10)
    variants.push_back({"halo2 fp8 precise accumulation", s});
  }
  grad::PipelineSpec hlq;
  hlq.name = "hlq";
  variants.push_back({"hlq", hlq});
  grad::PipelineSpec hlq_serial = hlq;  // g_w's chain on the same stream as g_x's (Note [HLQ's two chains])
  hlq_serial.options_as<grad::HlqOptions>().overlap = false;
  variants.push_back({"hlq one stream", hlq_serial});
  // g_x's fp8 product with promoted partial sums: the default's bits (Note [Fast accumulation of integer codes])
  grad::PipelineSpec hlq_precise = hlq;
  hlq_precise.options_as<grad::HlqOptions>().fp8_accumulation = Fp8Accumulation::precise;
  variants.push_back({"hlq precise accumulation", hlq_precise});
  // HLA keeping every sequency row (`rank: full`): g_w's product over all the tokens, rotated along them, instead
  // of over the low-pass 528 of every 2048 (docs/language_models.md, HLQ on LLaMA)
  grad::PipelineSpec hlq_full = hlq;
  hlq_full.options_as<grad::HlqOptions>().rank = grad::HlaRank::all();
  variants.push_back({"hlq rank full", hlq_full});

  const bool phases = env_or("HT_BENCH_PHASES", "0") == "1";
  const std::string kernels_env = env_or("HT_BENCH_KERNELS", "0");
  const bool kernels = kernels_env == "1" || kernels_env == "only";
  const bool errors = env_or("HT_BENCH_ERRORS", "0") == "1";
  const std::string error_group = small ? "Errors per layer (Llama-3.2-1B, 16384 tokens, bf16, Gaussian operands)"
                                        : "Errors per layer (Llama-3-8B, 8192 tokens, bf16, Gaussian operands)";
  Generator gen(0);
  for (const LayerShape& l : layers) {
    if (std::string(l.name).find(layer_filter) == std::string::npos) continue;
    const Tensor x = randn({B, L, l.I}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor w = mul(randn({l.O, l.I}, gen, {DType::f32, dev}), 0.02).to(DType::bf16);
    const Tensor g = mul(randn({B, L, l.O}, gen, {DType::f32, dev}), 1e-3).to(DType::bf16);
    if (kernels) print_kernels(reshape(x, {B * L, l.I}), w, reshape(g, {B * L, l.O}), l.name, commit);
    if (kernels_env == "only") continue;
    Reference ref;
    if (errors) ref = reference_products(reshape(x, {B * L, l.I}), w, reshape(g, {B * L, l.O}));
    std::vector<std::string> error_lines;  // printed after the timing records
    // Every case of the layer is set up, timed eagerly and recorded first; then all its graphs replay in turns.
    struct Case {
      const Variant* v = nullptr;
      std::shared_ptr<grad::Pipeline> p;
      grad::StepClock clock;
      grad::NoiseKey key;
      double first = 0, eager = 0;
      std::unique_ptr<cuda::StepGraph> fwd, total;
      void run(const Tensor& x, const Tensor& w, const Tensor& g, bool with_backward) {
        grad::ForwardResult f = p->forward(x, w, grad::ProductInfo{}, key, grad::SaveForBackward::yes);
        if (with_backward) (void)p->backward(*f.saved, g, {true, true});
      }
    };
    std::vector<std::unique_ptr<Case>> cases;
    for (const Variant& v : variants) {
      if (!cases.empty() && v.label.find(variant_filter) == std::string::npos) continue;
      auto c = std::make_unique<Case>();
      c->v = &v;
      c->p = grad::make_pipeline(v.spec);
      // A pipeline that draws stochastic-rounding noise (HLQ) reads the step from the device, as a trained model's
      // layers do (nn::bind_pipelines and bench_train): a host step would be baked into the recording, which
      // the step graph refuses (Note [Step graphs]).
      if (c->p->draws_noise()) {
        c->clock.keep_on_device(dev);
        c->clock.set(1);
      }
      const auto* step_word =
          c->clock.word.defined() ? static_cast<const int64_t*>(c->clock.word.data_ptr()) : nullptr;
      c->key = grad::NoiseKey{1, 0, 1, step_word};
      Case& k = *c;
      const auto t0 = std::chrono::steady_clock::now();
      k.run(x, w, g, true);
      cudaDeviceSynchronize();
      k.first = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      k.eager = bench::median_ms([&] { k.run(x, w, g, true); }, 2, 10);
      if (errors && has_own_numerics(v.label)) {
        grad::ForwardResult f = k.p->forward(x, w, grad::ProductInfo{}, k.key, grad::SaveForBackward::yes);
        const grad::Grads gr = k.p->backward(*f.saved, g, {true, true});
        const std::pair<const char*, double> errs[] = {
            {"Y", rel_error(f.y, ref.y)}, {"g_x", rel_error(gr.x, ref.gx)}, {"g_w", rel_error(gr.w, ref.gw)}};
        for (const auto& [what, e] : errs) {
          char line[1024];
          std::snprintf(line, sizeof line,
                        "{\"area\": \"kernels\", \"group\": \"%s\", \"name\": \"%s, %s, %s\", \"metric\": "
                        "\"relative error\", \"ours\": %.3e, \"pipeline\": \"%s\", \"date\": \"%s\", "
                        "\"commit\": \"%s\", \"machine\": \"%s\", \"command\": \"HT_BENCH_ERRORS=1 %s\"}\n",
                        error_group.c_str(), l.name, v.label.c_str(), what, e,
                        json_escape(grad::describe(v.spec)).c_str(), date, commit.c_str(),
                        json_escape(machine).c_str(), json_escape(command).c_str());
          error_lines.push_back(line);
        }
      }
      k.fwd = record_graph([&] { k.run(x, w, g, false); });
      k.total = record_graph([&] { k.run(x, w, g, true); });
      cases.push_back(std::move(c));
    }
    std::vector<cuda::StepGraph*> graphs;
    for (const auto& c : cases) {
      graphs.push_back(c->fwd.get());
      graphs.push_back(c->total.get());
    }
    // Note [HALO's bound per layer]: HALO-2 fp8's three products alone, replayed in the same rounds as the pipelines
    // (when the variant filter is empty or matches "halo2 fp8 bound").
    const bool bound = std::string("halo2 fp8 bound").find(variant_filter) != std::string::npos;
    const int64_t T = B * L;
    const grad::HaloRotation rot_i = grad::halo_rotation_size(l.I), rot_t = grad::halo_rotation_size(T);
    std::unique_ptr<cuda::StepGraph> floor_fwd, floor_total, precise_fwd, precise_total, copy_clone, copy_memcpy;
    grad::HaloQuantized qx, qw, qet, qxt, qwt, qr;  // the operands, alive while their graphs replay
    Tensor copy_src, copy_dst;  // the copy rate's buffers, alive while its graphs replay
    const double copy_bytes = 2.0 * static_cast<double>(kCopyBytes);  // read and written
    if (bound) {
      // the copy rate (Note [HALO's bound per layer]): kCopyBytes copied by our copy kernel (clone) and by
      // cudaMemcpyAsync, device to device
      copy_src = zeros({kCopyBytes / 2}, {DType::bf16, dev});
      copy_dst = empty_like(copy_src);
      copy_clone = record_graph([&] { (void)copy_src.clone(); });
      copy_memcpy = record_graph([&] {
        HT_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data_ptr(), copy_src.data_ptr(), static_cast<size_t>(kCopyBytes),
                                      cudaMemcpyDeviceToDevice, cuda::current_stream()));
      });
      const auto codes = [&](int64_t rows, int64_t cols) {
        return grad::halo_quantize(randn({rows, cols}, gen, {DType::f32, dev}).to(DType::bf16), grad::Carrier::fp8);
      };
      qx = codes(T, rot_i.n), qw = codes(l.O, rot_i.n), qet = codes(l.O, T);
      qxt = codes(rot_i.n, T), qwt = codes(rot_i.n, l.O), qr = codes(rot_t.n, l.O);
      for (const Fp8Accumulation acc : {Fp8Accumulation::fast, Fp8Accumulation::precise}) {
        const auto gemm = [acc](const grad::HaloQuantized& a, const grad::HaloQuantized& b) {
          (void)grad::halo_product(a.codes, b.codes, a.scale, b.scale, {1.0f, DType::bf16, acc});
        };
        const bool fast = acc == Fp8Accumulation::fast;  // the pipeline's default
        (fast ? floor_fwd : precise_fwd) = record_graph([&] { gemm(qx, qw); });
        (fast ? floor_total : precise_total) = record_graph([&] {
          gemm(qx, qw);    // Y (T, O)
          gemm(qet, qxt);  // g_w (O, n_I)
          gemm(qwt, qr);   // g_x (n_I, n_T)
        });
      }
    }
    for (cuda::StepGraph* f : {floor_fwd.get(), floor_total.get(), precise_fwd.get(), precise_total.get(),
                               copy_clone.get(), copy_memcpy.get()})
      graphs.push_back(f);
    const std::vector<double> ms = round_robin_ms(graphs);
    const double base_fwd = ms[0], base_total = ms[1], base_bwd = base_total - base_fwd;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      Case& k = *cases[i];
      const Variant& v = *k.v;
      const double fwd = ms[2 * i], total = ms[2 * i + 1], bwd = total - fwd;
      std::printf(
          "{\"area\": \"kernels\", \"group\": \"%s\", \"name\": \"%s, %s, "
          "forward + backward\", \"metric\": \"ms\", \"ours\": %.4f, \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
          "\"eager_ms\": %.4f, \"first_call_ms\": %.1f, "
          "\"speedup_vs_exact_bf16\": %.3f, \"forward_speedup\": %.3f, \"backward_speedup\": %.3f, \"pipeline\": \"%s\", "
          "\"date\": \"%s\", \"commit\": \"%s\", \"machine\": \"%s\", \"command\": \"%s\"}\n",
          group.c_str(), l.name, v.label.c_str(), total, fwd, bwd, k.eager, k.first, base_total / total, base_fwd / fwd,
          base_bwd / bwd,
          json_escape(grad::describe(v.spec)).c_str(), date, commit.c_str(), json_escape(machine).c_str(),
          json_escape(command).c_str());
      std::fflush(stdout);
    }
    if (floor_fwd && floor_total) {
      const std::size_t f = 2 * cases.size();
      const double gemm_fwd = ms[f], gemm_total = ms[f + 1];
      const PassBytes pb = halo2_pass_bytes(T, l.I, l.O);
      const double left_ms = base_total / 1.5 - gemm_total;  // what 1.5× leaves the passes
      const auto row = [&](const char* label, double fwd, double total, const std::string& extra) {
        std::printf(
            "{\"area\": \"kernels\", \"group\": \"%s\", \"name\": \"%s, %s, forward + backward\", \"metric\": "
            "\"ms\", \"ours\": %.4f, \"forward_ms\": %.4f, \"backward_ms\": %.4f, \"speedup_vs_exact_bf16\": %.3f, "
            "\"forward_speedup\": %.3f, \"backward_speedup\": %.3f, %s\"date\": \"%s\", \"commit\": \"%s\", "
            "\"machine\": \"%s\", \"command\": \"%s\"}\n",
            group.c_str(), l.name, label, total, fwd, total - fwd, base_total / total, base_fwd / fwd,
            base_bwd / (total - fwd), extra.c_str(), date, commit.c_str(), json_escape(machine).c_str(),
            json_escape(command).c_str());
      };
      row("halo2 fp8 GEMMs alone", gemm_fwd, gemm_total, "");
      if (precise_fwd && precise_total) row("halo2 fp8 precise-accumulation GEMMs alone", ms[f + 2], ms[f + 3], "");
      char extra[320];
      std::snprintf(extra, sizeof extra,
                    "\"pass_bytes_forward\": %.0f, \"pass_bytes_backward\": %.0f, \"peak_GB_per_s\": %.1f, %s",
                    pb.fwd, pb.bwd, peak,
                    left_ms > 0 ? fmt_required((pb.fwd + pb.bwd) / (left_ms * 1e6)).c_str() : "");
      row("halo2 fp8 bound", gemm_fwd + pb.fwd / (peak * 1e6), gemm_total + (pb.fwd + pb.bwd) / (peak * 1e6), extra);
      // the same bytes at the faster measured copy (NaN, hence no row, if neither graph was recorded)
      const double copy_ms = std::fmin(ms[f + 4], ms[f + 5]);
      if (std::isfinite(copy_ms)) {
        const double copy = copy_bytes / (copy_ms * 1e6);
        std::snprintf(extra, sizeof extra,
                      "\"pass_bytes_forward\": %.0f, \"pass_bytes_backward\": %.0f, \"copy_GB_per_s\": %.1f, "
                      "\"clone_ms\": %.4f, \"memcpy_ms\": %.4f, ",
                      pb.fwd, pb.bwd, copy, ms[f + 4], ms[f + 5]);
        row("halo2 fp8 bound at the copy rate", gemm_fwd + pb.fwd / (copy * 1e6),
            gemm_total + (pb.fwd + pb.bwd) / (copy * 1e6), extra);
      }
      std::fflush(stdout);
    }
    for (const std::string& e : error_lines) std::fputs(e.c_str(), stdout);
    std::fflush(stdout);
    floor_fwd.reset(), floor_total.reset(), precise_fwd.reset(), precise_total.reset();
    copy_clone.reset(), copy_memcpy.reset();
    copy_src = {}, copy_dst = {};
    for (auto& c : cases) c->fwd.reset(), c->total.reset();  // their memory pools, before the eager phase runs
    for (auto& c : cases) {
      Case& k = *c;
      if (phases && k.v->spec.name == "halo") print_phases([&] { k.run(x, w, g, true); }, l.name, k.v->label, commit);
      if (phases && k.v->spec.name == "hlq") {  // HLQ marks its phases through grad::mark_phase (Note [Phase marks])
        bench::PhaseTimer timer;
        timer.run_and_print((std::string(l.name) + ", hlq").c_str(), [&] { k.run(x, w, g, true); }, 5, stderr);
      }
    }
  }
  return 0;
}
