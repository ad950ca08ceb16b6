// Gradient pipelines: how the matrix products of a Linear (and of a Conv2d through its im2col view) run
// forward and backward (docs/gradient_pipelines.md). A pipeline owns the forward product, what is saved
// for backward and the two backward products g_x = g_y·W and g_w = Σ_b g_y[b]ᵀ·x[b]; the bias gradient
// stays outside (the product node sums g_y) unless a pipeline's pass over g_y yields it (Wanted::b). Each
// pipeline registers its name, options, constructor and description (grad/registry.h).
//
// Note [Product geometry]
// Every product is seen as x (B, L, I) · Wᵀ (I, O) -> y (B, L, O): B samples of L tokens / pixels. A 2-D
// Linear input (N, I) is (1, N, I) (HLA then projects along the batch axis, as the specification says); a
// Linear input (B, d1, ..., I) is (B, d1·...·dk, I); a Conv2d is its unfolded input (B, OH·OW, C·kh·kw)
// with W viewed as (O, C·kh·kw) and ProductInfo carrying the output grid (OH, OW). A Conv2d enters through
// conv_product, which also hands the pipeline the input map and the window (ProductInfo::image, ::window):
// a pipeline may save that instead of the columns (HLQ acbp_conv input_map); every other pipeline ignores it.
//
// Note [Pipeline noise]
// Stochastic rounding draws from Philox keyed by (seed, layer, step, role) (DESIGN.md rule 9). The layer id
// and seed are fixed when pipelines are bound to a model; the step is read from a StepClock shared with the
// trainer when the forward runs, and kept in the autograd node, so backward uses the forward's key. The
// trainer sets the clock to the optimiser step (the micro-batches of an accumulated step share it), so a resumed
// run repeats the noise.
// On a CUDA model the clock also holds the step in device memory (StepClock::word) and the key carries
// that pointer instead of the number: the quantiser kernels add the word to the step-0 stream when they run.
// The streams are the same as the host-step ones (philox_stream's fields are disjoint), so CPU and CUDA
// still draw the same bits, and a recorded step graph draws each replayed step's own noise.
#pragma once
#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::grad {

// Throws: the spec of pipeline `name` holds options of another pipeline's type (registry.cpp).
[[noreturn]] void throw_options_mismatch(const std::string& name);

// `options` as O, the options type of pipeline `name`: O's defaults when empty; throws when it holds another type.
template <class O>
const O& options_of(const std::any& options, const std::string& name) {
  static const O defaults{};
  if (!options.has_value()) return defaults;
  const O* o = std::any_cast<O>(&options);
  if (o == nullptr) throw_options_mismatch(name);
  return *o;
}

// ---- the spec of one layer's pipeline ----------------------------------------------------------------

// A pipeline by its registered name (grad/registry.h) and its options, whose type the pipeline's own header
// defines (HlqOptions in grad/pipeline_hlq.h, ...). Empty options are that pipeline's defaults.
struct PipelineSpec {
  std::string name = "exact";
  // A Linear's output is not kept by the ops that read it for their own backward (a gelu, the attention): they keep
  // the product's node, which runs the forward product again when they need the output (one more GEMM in backward;
  // Note [Recomputed outputs] in autograd/saved_tensor.h). Needs an input the node can have again: one another op
  // keeps, or one its op can rebuild (a LayerNorm or gelu output). Conv2d layers ignore it.
  bool recompute_output = false;
  std::any options;

  // The options as O, the type `name` registered: set to O's defaults first when empty. Throws when `options`
  // holds another type.
  template <class O>
  O& options_as() {
    if (!options.has_value()) options = O{};
    O* o = std::any_cast<O>(&options);
    if (o == nullptr) throw_options_mismatch(name);
    return *o;
  }
  // The options as O (O's defaults when empty).
  template <class O>
  const O& options_as() const {
    return options_of<O>(options, name);
  }
};

// ---- per-layer context ---------------------------------------------------------------------------------

// The training step that keys the pipelines' noise (Note [Pipeline noise]). On a CUDA model the clock also
// keeps the step in device memory (`word`, int64 (step mod 2^40) << 8, the step field of philox_stream):
// the quantisers then read the step when they run, so a recorded step graph draws fresh noise at every
// replay (Note [Step graphs]). set() writes it on the current stream, before the step's work. As a StepSource
// (tensor/philox.h) it also keys the run's dropout generator (Note [Step-keyed streams]).
struct StepClock : StepSource {
  Tensor word;  // int64 scalar on the model's device, or undefined (host step only); device_word points to it
  void keep_on_device(Device device);  // CUDA: allocates `word`; the CPU keeps the host step only
  void set(int64_t s);
};

struct NoiseKey {
  uint64_t seed = 0;
  uint32_t layer = 0;
  int64_t step = 0;
  const int64_t* step_word = nullptr;  // StepClock::word's device pointer when the clock keeps one
  // philox_stream(layer, step, role) under seed; with a step word, the step-0 stream plus the word read by
  // the kernel (no host step baked in, nothing that stops a step graph recording).
  Noise noise(uint32_t role) const;
};

// A product's input rebuilt by the op that made it (Note [Rebuilt inputs]): `node` is the autograd node whose
// only output the layer read, when that node can rebuild it from what it keeps for its own backward
// (Node::recompute_output: a gelu's output from its kept input, a LayerNorm's, a CUDA batch norm's, or a reshape of
// one of those); `view` turns that output into what the product reads (a Linear's (B, L, I) reshape, a conv's
// (N, C, H, W) image). Empty when the input cannot be rebuilt.
struct RebuildInput {
  std::shared_ptr<Node> node;
  std::function<Tensor(const Tensor&)> view;
  // Set by grad::product when its node may rebuild its output (Note [Recomputed outputs]) and shared by the copies
  // of this RebuildInput: the input that node rebuilt, left for the pipeline's backward, which then takes it instead
  // of rebuilding it a second time.
  std::shared_ptr<Tensor> left;
  explicit operator bool() const { return node != nullptr; }
  Tensor operator()() const;  // view(node->recompute_output()), bit for bit the forward's input
  // operator(), leaving the result in `left` for take().
  Tensor rebuild_and_leave() const;
  // What rebuild_and_leave left (once: it is then dropped), else operator().
  Tensor take() const;
};

// What a product knows about its layer besides the operands (Note [Product geometry]).
struct ProductInfo {
  int64_t grid_h = 0, grid_w = 0;  // output grid of a conv (L = grid_h·grid_w); 0 when unknown
  bool batch_rows = false;         // L is the batch axis (a 2-D Linear input (N, I) seen as (1, N, I))
  // conv_product only: the input map (N, C, H, W) (any strides, detached) that x = unfold2d(image, window)
  // was unfolded from; undefined for other products.
  Tensor image;
  Unfold2dParams window;
  // How to rebuild x (a Linear) or the image (a conv) in backward, when the op that made it can; HLQ's
  // acbp_rebuild keeps this instead of a copy (Note [Rebuilt inputs]).
  RebuildInput rebuild;
  // product() with a bias: the bias (O), x's dtype, detached. A pipeline's forward must return y with it added,
  // which forward_product does in the GEMM's epilogue (one rounding, no separate pass); the product op gives the
  // bias its gradient (the sum of g_y over the rows) unless the pipeline's backward returns it (Wanted::b).
  Tensor bias;
  // Whether backward can be asked for g_x and for g_w (Note [What a product keeps]); set by product() and
  // conv_product() when they save for backward.
  bool x_grad = true, w_grad = true;
};

// Note [What a product keeps]
// Which gradients a product's backward can be asked for is known in its forward: the node's edges are fixed when it
// is connected, and an input that needs no gradient (a frozen weight: LoRA's base, a frozen layer; an input no
// trainable parameter made) has none. A forward keeps only what the possible gradients read: what only g_w reads
// (exact's x, HLQ's and LUQ's compressed x, LBP-WHT's patch coefficients, HALO's Q(x·H̃)ᵀ) is not kept when
// ProductInfo::w_grad is false, and what only g_x reads (exact's W, HALO's Q(W·H̃)ᵀ) when x_grad is false. With
// LoRA every base product keeps no input, so an activation that no other op keeps (the input of a projection
// without adapters) is freed after the forward, and HALO neither transposes nor keeps its x codes. The plain
// linear and conv2d ops keep the same way (ops/linear.cpp, ops/conv2d.cpp). The product node asks only for these
// gradients (its edges); code that runs a pipeline's backward itself (inspect-grads, the benchmarks, tests) passes
// ProductInfo's defaults, which keep both.

// ---- the interface -------------------------------------------------------------------------------------

// State kept by the forward for backward. `bytes` counts the activation memory it holds (not weights).
struct SavedState {
  virtual ~SavedState() = default;
  int64_t bytes = 0;
};

struct ForwardResult {
  Tensor y;                             // (B, L, O), x's dtype
  std::unique_ptr<SavedState> saved;    // null when no gradient is needed
};

struct Wanted {
  bool x = true, w = true;
  // The product has a bias that wants its gradient (Σ over the rows of g_y). A pipeline may return it in Grads::b
  // when a pass it makes over g_y anyway yields it (HLQ's g̃ quantiser); otherwise the product node sums g_y.
  bool b = false;
};

struct Grads {
  Tensor x;  // (B, L, I) of x's dtype, or undefined
  Tensor w;  // (O, I) of w's dtype, or undefined
  // (O): Σ over the rows of g_y when Wanted::b and the pipeline computed it (any floating dtype), or undefined
  Tensor b;
  // Conv products (forward_conv) only: x is the image's gradient (N, C, H, W) (any strides) rather than the
  // columns', so conv_product passes it on without folding (HLQ's conv_gx dgrad_simulated).
  bool x_is_image = false;
};

// Whether a pipeline's forward keeps state for a backward (no: evaluation, or nothing needs a gradient).
enum class SaveForBackward { no, yes };

class Pipeline {
 public:
  virtual ~Pipeline() = default;
  virtual std::string name() const = 0;
  // x (B, L, I) and w (O, I) of one floating dtype, detached. save: whether backward will run (yes: the
  // result's `saved` is set).
  virtual ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                                SaveForBackward save) = 0;
  virtual Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) = 0;
  // The forward of a Conv2d product (conv_product): w (O, C·kh·kw) and info.image / info.window set, the
  // columns x = unfold2d(info.image, info.window) (B, L, I) implied. Same contract as forward for that x (y
  // (B, L, O), possibly a non-contiguous view; backward's g.x is the columns' gradient, which conv_product
  // folds back to the image). The default unfolds the columns and calls forward; a pipeline may instead run
  // the product as a convolution and compute what it saves from the image (HLQ: Note [HLQ conv forward]).
  virtual ForwardResult forward_conv(const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                                     SaveForBackward save);
  // Whether forward's y is the plain high-precision product (true for every pipeline but HALO, whose forward
  // is quantised). Layers then take their plain op (cuDNN, fused bias) when no gradient is needed,
  // e.g. in evaluation.
  virtual bool exact_forward() const { return true; }
  // Whether backward's g_x and g_w are the exact high-precision products (true for `exact` only). A layer whose
  // pipeline is exact both ways runs its plain ops (nn::PipelineBinding::active).
  virtual bool exact_backward() const { return false; }
  // Whether backward draws stochastic-rounding noise keyed by the step (NoiseKey::noise): then a CUDA run
  // keeps the step clock on the device (StepClock::keep_on_device) so that its steps can be recorded.
  virtual bool draws_noise() const { return false; }
  // Empty, or what the latest forward fell back to because of its shapes, in a few words ("HLA keeps every
  // row: 197 tokens per sample have no power-of-two factor"). The fallbacks of a model's layers are logged in
  // one line after its first step (nn::log_fallbacks).
  virtual std::string fallback() const { return {}; }
  // Device or host bytes the pipeline keeps from one step to the next, beside the model's own tensors (HALO's
  // codes of a frozen weight, Note [HALO's frozen weight codes]); 0 for a pipeline that keeps nothing. The
  // trainer logs the model's sum once these are in place (after the second step).
  virtual int64_t kept_bytes() const { return 0; }
};

// A new pipeline for one layer, through the registry (grad/registry.h). Throws for an unknown name, listing
// the registered ones.
std::shared_ptr<Pipeline> make_pipeline(const PipelineSpec& spec);

// y (B, L, O) = x (B, L, I) · wᵀ [+ bias (O)] through `pipeline`, recording an autograd node whose backward asks
// the pipeline for g_x and g_w (and the bias's: Wanted::b, else it sums g_y over the rows). `saved_bytes`, if
// given, receives the bytes the forward kept.
// `recompute_output` (product only; PipelineSpec::recompute_output): the node offers y to the ops that read it, to
// be rebuilt instead of kept (Note [Recomputed outputs]); `output_rebuilt`, if given, receives whether it could.
struct ProductCall {
  std::shared_ptr<Pipeline> pipeline;
  ProductInfo info;
  NoiseKey key;
  int64_t* saved_bytes = nullptr;
  bool recompute_output = false;
  bool* output_rebuilt = nullptr;
};
Tensor product(const Tensor& x, const Tensor& w, const ProductCall& call, const Tensor& bias = Tensor());

// A Conv2d (groups 1) as a product: image (N, C, H, W) (any strides, e.g. the permuted view of a channels-last
// map), w (O, C·kh·kw) -> y (N, L, O), L = OH·OW (possibly a non-contiguous view: a pipeline may run it as a
// convolution, whose NCHW output is (N, O, L)). Calls the pipeline's forward_conv with call.info's grid, image
// and window filled in, records one autograd node over (image, w) whose backward asks the pipeline for the
// columns' gradient and folds it back to the image (fold2d, unfold2d's adjoint).
Tensor conv_product(const Tensor& image, const Tensor& w, const Unfold2dParams& window, const ProductCall& call);

// ---- products that read the same input ---------------------------------------------------------------

// Note [Shared product inputs]
// Several products often read one input: q_proj, k_proj and v_proj the attention's normalised input, gate_proj
// and up_proj the MLP's. Inside a SharedInputScope a pipeline may derive what it computes from such an input once
// and hand it to the other products: HALO's Q(x·H̃) and, for g_w, its transposed codes (grad/pipeline_halo.h),
// which saves their passes over x and keeps one Q(x·H̃)ᵀ for backward instead of one per product (the same bits:
// HALO's quantiser is deterministic). The code that opens a scope promises that nothing read inside it is
// written in place before it closes (LlamaAttention and LlamaMlp open one around their projections, whose input
// is an RMSNorm's fresh output). Each entry holds the input itself, so its storage is not freed and reused by
// another tensor while the scope is open; entries are found by storage, offset, shape, strides and dtype and by
// what was derived (a key the pipeline makes of its name and the options the derivation reads), and are dropped
// when the outermost scope on the thread closes. Outside a scope shared_input_slot is null: nothing is shared.
class SharedInputScope {
 public:
  SharedInputScope();
  ~SharedInputScope();
  SharedInputScope(const SharedInputScope&) = delete;
  SharedInputScope& operator=(const SharedInputScope&) = delete;
};
// The slot for what `derived` is derived from x while a scope is open on this thread (empty when nothing has
// been stored under that key yet), else null.
std::shared_ptr<void>* shared_input_slot(const Tensor& x, const std::string& derived);

// ---- per-layer selection -------------------------------------------------------------------------------

// The config's `grad_pipeline` section: a default and ordered (pattern, spec) overrides; the first pattern
// that matches a module's full name wins. Patterns are globs over the dotted name: `*` matches any run of
// characters (dots included), `?` one character; "fc", "layer4.*", "*.attn.qkv".
struct PipelineConfig {
  PipelineSpec default_spec;
  std::vector<std::pair<std::string, PipelineSpec>> overrides;
  uint64_t seed = 0;
};

bool glob_match(const std::string& pattern, const std::string& name);
const PipelineSpec& select_spec(const PipelineConfig& config, const std::string& module_name);

// One line describing a spec: the registered description of its options ("hlq (g_x: 4 bit, ...)"), and
// ", output recomputed in backward" with recompute_output.
std::string describe(const PipelineSpec& spec);

}  // namespace ht::grad
