// The pipeline plug-in point: the autograd op that routes a product's backward through a pipeline, per-layer
// selection by module-name globs, and the helpers the pipelines share (the registry is registry.cpp).
#include "hadatrain/grad/pipeline.h"

#include <deque>
#include <optional>

#include <fmt/format.h>

#include "hadatrain/autograd/function.h"
#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/core/error.h"
#include "hadatrain/grad/phase_marks.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/philox.h"
#include "pipeline_helpers.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/grad_quant_glue.h"
#endif

namespace ht::grad {

Noise NoiseKey::noise(uint32_t role) const {
  if (step_word != nullptr) return Noise{seed, philox_stream(layer, 0, role), step_word};
  // The step number is a kernel argument of the noise: a recorded step graph would replay one step's noise.
  note_step_capture_unsafe("a gradient pipeline draws stochastic-rounding noise per step (host step clock)");
  return Noise{seed, philox_stream(layer, static_cast<uint64_t>(step), role)};
}

Tensor RebuildInput::operator()() const {
  HT_ASSERT(node != nullptr, "RebuildInput: no node to rebuild from");
  const Tensor out = node->recompute_output();
  HT_ASSERT(out.defined(), "RebuildInput: {} could not rebuild its output", node->name());
  return view ? view(out) : out;
}

Tensor RebuildInput::rebuild_and_leave() const {
  Tensor t = (*this)();
  if (left) *left = t;
  return t;
}

Tensor RebuildInput::take() const {
  if (left && left->defined()) {
    Tensor t = std::move(*left);
    *left = Tensor();
    return t;
  }
  return (*this)();
}

void StepClock::keep_on_device(Device device) {
  word = device.is_cuda() ? zeros({}, {DType::i64, device}) : Tensor();
  device_word = word.defined() ? word.data<int64_t>() : nullptr;
  set(step);
}

void StepClock::set(int64_t s) {
  step = s;
  // philox_stream's step field: bits 8..47. Exact through fill_'s double (< 2^48).
  if (word.defined()) fill_(word, static_cast<double>((static_cast<uint64_t>(s) & 0xFFFFFFFFFFull) << 8));
}

// ---- the autograd op -----------------------------------------------------------------------------------

namespace {

SaveForBackward save_if(bool grad) { return grad ? SaveForBackward::yes : SaveForBackward::no; }

// What a product node keeps to run its forward product again (Note [Recomputed outputs]): its input (a reference to
// the tensor another op keeps, or the input's rebuild), the weight and the bias, all of which the node or the
// pipeline keeps anyway.
struct OutputRebuild {
  LaterInput x;  // x (B, L, I)
  Tensor w, bias;
  Tensor operator()() const {
    ProductInfo info;
    info.bias = bias;
    return forward_product(x.get(), w, info);
  }
};

// For a product whose layer asks for recompute_output: how the node can have y again, or null when it cannot (the
// pipeline's forward is not the plain product, or x is neither kept by another op nor rebuildable; x is checked after
// the pipeline's forward, so a pipeline that keeps x itself, exact, shares it).
std::unique_ptr<OutputRebuild> output_rebuild(const Tensor& x, const Tensor& w, const ProductCall& call,
                                              const ProductInfo& info) {
  if (!call.recompute_output || !call.pipeline->exact_forward()) return nullptr;
  auto r = std::make_unique<OutputRebuild>();
  if (!r->x.defer(x.detach(), info.rebuild, {})) return nullptr;
  r->w = w.detach();
  r->bias = info.bias;
  return r;
}

// The image gradient of a conv product's columns gradient cols (N, L, C·kh·kw). A 1x1 window at stride 1 without
// padding makes the columns the channels-last image itself (L = H·W positions of C channels, nothing summed): for a
// channels-last image they are returned as its (N, C, H, W) view, no pass over them (the same values; fold2d's
// sum 0 + v would turn a -0 into +0, the view keeps it); otherwise fold2d.
Tensor fold_columns(const Tensor& cols, const Fold2dParams& p) {
  const Unfold2dParams& u = p.window;
  const bool identity = u.kernel_h == 1 && u.kernel_w == 1 && u.stride_h == 1 && u.stride_w == 1 && u.pad_h == 0 &&
                        u.pad_w == 0 && cols.dim() == 3 && cols.size(1) == p.height * p.width &&
                        cols.size(2) == p.channels && cols.is_contiguous();
  if (p.channels_last && identity)
    return permute(reshape(cols, {cols.size(0), p.height, p.width, p.channels}), {0, 3, 1, 2});
  return fold2d(cols, p);
}

// Inputs (x, w) and optionally the bias, or (image, w) for a conv product, whose columns' gradient is folded back
// to the image.
class PipelineProductBackward final : public Node {
 public:
  PipelineProductBackward(std::shared_ptr<Pipeline> p, std::unique_ptr<SavedState> s,
                          std::optional<Fold2dParams> fold, DType bias_dtype)
      : pipeline_(std::move(p)), saved_(std::move(s)), fold_(fold), bias_dtype_(bias_dtype) {}
  std::string name() const override {
    return std::string(fold_ ? "PipelineConvBackward(" : "PipelineProductBackward(") + pipeline_->name() + ")";
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    HT_CHECK(saved_ != nullptr,
             "{}: the saved state was already released by an earlier backward; pass retain_graph to run "
             "backward twice",
             name());
    std::vector<Tensor> out(next_edges_.size());
    if (!grads[0].defined()) return out;
    if (!grads[0].is_contiguous()) mark_phase("product node: g_y made contiguous");
    const Tensor g_y = grads[0].contiguous();
    mark_phase(nullptr);
    Wanted wanted{needs_input_grad(0), needs_input_grad(1), out.size() == 3 && needs_input_grad(2)};
    Grads g;
    if (wanted.x || wanted.w) g = pipeline_->backward(*saved_, g_y, wanted);
    // The bias's gradient: from the pipeline's pass over g_y (Wanted::b), else the sum of g_y's rows.
    if (wanted.b) {
      if (!g.b.defined()) mark_phase("product node: bias gradient");
      out[2] = to_dtype(g.b.defined() ? g.b : sum(g_y, {0, 1}), bias_dtype_);
      mark_phase(nullptr);
    }
    if (!wanted.x && !wanted.w) return out;
    if (wanted.x && fold_ && !g.x_is_image) {
      PhaseScope phase("g_x: fold the columns to the image");
      out[0] = fold_columns(g.x, *fold_);
    } else if (wanted.x) {
      out[0] = g.x;
    }
    if (wanted.w) out[1] = g.w;
    return out;
  }

  void release_saved() override {
    Node::release_saved();
    saved_.reset();
    rebuild_.reset();
  }

  // Note [Recomputed outputs]: the ops that read y keep this node instead of y, and rebuild y from it.
  void offer_output(std::unique_ptr<OutputRebuild> r) { rebuild_ = std::move(r); }
  bool can_recompute_output() const override { return rebuild_ != nullptr; }
  bool offers_rebuild() const override { return rebuild_ != nullptr; }
  Tensor recompute_output() const override {
    HT_CHECK(saved_ != nullptr, "{}: cannot rebuild its output after its backward released what it kept", name());
    return rebuild_ ? (*rebuild_)() : Tensor();
  }

 private:
  std::shared_ptr<Pipeline> pipeline_;
  std::unique_ptr<SavedState> saved_;
  std::unique_ptr<OutputRebuild> rebuild_;
  std::optional<Fold2dParams> fold_;
  DType bias_dtype_;
};

// The op's inputs: a = x, or the image of a conv product (whose columns' gradient `fold` folds back); w; the bias
// of a Linear product, or undefined.
struct ProductOperands {
  const Tensor& a;
  const Tensor& w;
  const Tensor& bias;
  std::optional<Fold2dParams> fold;
};

// The forward's result as the op's output: reports the saved bytes and, when a gradient is needed, records
// the node over the operands (offering y for rebuilding when `rebuild` is given).
Tensor record_product(ForwardResult r, const ProductCall& call, const ProductOperands& in,
                      std::unique_ptr<OutputRebuild> rebuild = nullptr) {
  if (call.saved_bytes) *call.saved_bytes = r.saved ? r.saved->bytes : 0;
  if (call.output_rebuilt) *call.output_rebuilt = rebuild != nullptr;
  if (needs_grad({&in.a, &in.w, &in.bias})) {
    HT_ASSERT(r.saved != nullptr, "pipeline {} saved nothing for backward", call.pipeline->name());
    auto node = std::make_shared<PipelineProductBackward>(call.pipeline, std::move(r.saved), in.fold,
                                                          in.bias.defined() ? in.bias.dtype() : in.a.dtype());
    node->offer_output(std::move(rebuild));
    if (in.bias.defined()) connect(node, {&in.a, &in.w, &in.bias}, {&r.y});
    else connect(node, {&in.a, &in.w}, {&r.y});
  }
  return r.y;
}

}  // namespace

ForwardResult Pipeline::forward_conv(const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                                     SaveForBackward save) {
  return forward(unfold2d(info.image, info.window), w, info, key, save);
}

Tensor product(const Tensor& x, const Tensor& w, const ProductCall& call, const Tensor& bias) {
  HT_CHECK(call.pipeline != nullptr, "grad::product: no pipeline given");
  HT_CHECK(x.dim() == 3, "grad::product ({}): x must be (B, L, I), got {}", call.pipeline->name(), x.describe());
  HT_CHECK(w.dim() == 2 && w.size(1) == x.size(2),
           "grad::product ({}): weight must be (O, I) with I = {} (x {}), got {}", call.pipeline->name(),
           x.size(2), x.describe(), w.describe());
  HT_CHECK(x.dtype() == w.dtype(), "grad::product ({}): x {} and weight {} have different dtypes",
           call.pipeline->name(), x.describe(), w.describe());
  HT_CHECK(x.device() == w.device(), "grad::product ({}): x {} and weight {} are on different devices",
           call.pipeline->name(), x.describe(), w.describe());
  HT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0) && bias.dtype() == x.dtype() &&
                               bias.device() == x.device()),
           "grad::product ({}): bias must be ({}) of x's dtype and device (x {}), got {}", call.pipeline->name(),
           w.size(0), x.describe(), bias.describe());
  const bool grad = needs_grad({&x, &w, &bias});
  ProductInfo info = call.info;
  info.bias = bias.defined() ? bias.detach() : Tensor();
  info.x_grad = needs_grad({&x});
  info.w_grad = needs_grad({&w});
  // The node may rebuild x to rebuild y; the pipeline's copy of info.rebuild then takes that x (Note [Recomputed
  // outputs]). Set before the pipeline's forward copies it.
  if (grad && call.recompute_output && info.rebuild) info.rebuild.left = std::make_shared<Tensor>();
  ForwardResult r;
  {
    NoGradGuard no_grad;
    r = call.pipeline->forward(x.detach(), w.detach(), info, call.key, save_if(grad));
  }
  return record_product(std::move(r), call, {x, w, bias, std::nullopt},
                        grad ? output_rebuild(x, w, call, info) : nullptr);
}

Tensor conv_product(const Tensor& image, const Tensor& w, const Unfold2dParams& window, const ProductCall& call) {
  HT_CHECK(call.pipeline != nullptr, "grad::conv_product: no pipeline given");
  const std::string& name = call.pipeline->name();
  HT_CHECK(image.dim() == 4, "grad::conv_product ({}): the image must be (N, C, H, W), got {}", name, image.describe());
  const int64_t C = image.size(1), H = image.size(2), W = image.size(3);
  const int64_t I = C * window.kernel_h * window.kernel_w;
  HT_CHECK(w.dim() == 2 && w.size(1) == I,
           "grad::conv_product ({}): weight must be (O, C·kh·kw) with C·kh·kw = {} for image {} and a {}x{} window, "
           "got {}",
           name, I, image.describe(), window.kernel_h, window.kernel_w, w.describe());
  HT_CHECK(image.dtype() == w.dtype(), "grad::conv_product ({}): image {} and weight {} have different dtypes", name,
           image.describe(), w.describe());
  HT_CHECK(image.device() == w.device(), "grad::conv_product ({}): image {} and weight {} are on different devices",
           name, image.describe(), w.describe());
  ProductCall c = call;
  const Unfold2dGrid grid = unfold2d_grid("grad::conv_product", H, W, window);
  c.info.grid_h = grid.h;
  c.info.grid_w = grid.w;
  c.info.image = image.detach();
  c.info.window = window;
  c.info.x_grad = needs_grad({&image});
  c.info.w_grad = needs_grad({&w});
  const bool grad = needs_grad({&image, &w});
  ForwardResult r;
  {
    NoGradGuard no_grad;
    r = call.pipeline->forward_conv(w.detach(), c.info, c.key, save_if(grad));
  }
  HT_ASSERT(r.y.dim() == 3 && r.y.size(0) == image.size(0) && r.y.size(1) == c.info.grid_h * c.info.grid_w &&
                r.y.size(2) == w.size(0),
            "pipeline {}: conv forward gave {} for image {} and weight {}", name, r.y.describe(), image.describe(),
            w.describe());
  // A channels-last image gets a channels-last gradient (no transpose between this node and the one before it).
  return record_product(std::move(r), call, {image, w, Tensor(), Fold2dParams{C, H, W, window, is_channels_last(image)}});
}

// ---- selection -----------------------------------------------------------------------------------------

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative glob with backtracking to the last '*'.
  std::size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// ---- products that read the same input (Note [Shared product inputs]) --------------------------------------

namespace {

struct SharedInputEntry {
  Tensor x;  // held: its storage cannot be freed and handed to another tensor while the entry lives
  std::string derived;
  std::shared_ptr<void> value;
};

struct SharedInputs {
  int depth = 0;
  std::deque<SharedInputEntry> entries;  // a handful per scope, searched in order; slots stay where they are
};

SharedInputs& shared_inputs() {
  thread_local SharedInputs s;
  return s;
}

}  // namespace

SharedInputScope::SharedInputScope() { ++shared_inputs().depth; }

SharedInputScope::~SharedInputScope() {
  SharedInputs& s = shared_inputs();
  if (--s.depth == 0) s.entries.clear();
}

std::shared_ptr<void>* shared_input_slot(const Tensor& x, const std::string& derived) {
  SharedInputs& s = shared_inputs();
  if (s.depth == 0 || !x.defined() || !x.storage()) return nullptr;
  for (SharedInputEntry& e : s.entries)
    if (e.x.storage() == x.storage() && e.x.offset() == x.offset() && e.x.shape() == x.shape() &&
        e.x.strides() == x.strides() && e.x.dtype() == x.dtype() && e.derived == derived)
      return &e.value;
  s.entries.push_back({x, derived, nullptr});
  return &s.entries.back().value;
}

const PipelineSpec& select_spec(const PipelineConfig& config, const std::string& module_name) {
  for (const auto& [pattern, spec] : config.overrides)
    if (glob_match(pattern, module_name)) return spec;
  return config.default_spec;
}

// ---- shared helpers ------------------------------------------------------------------------------------

int64_t tensor_bytes(const Tensor& t) {
  if (!t.defined()) return 0;
  return static_cast<int64_t>(storage_bytes(t.dtype(), t.numel()));
}

Tensor forward_product(const Tensor& x, const Tensor& w, const ProductInfo& info) { return linear(x, w, info.bias); }

Conv2dParams conv_params(const Unfold2dParams& u) {
  Conv2dParams p;
  p.stride_h = u.stride_h;
  p.stride_w = u.stride_w;
  p.pad_h = u.pad_h;
  p.pad_w = u.pad_w;
  p.dilation_h = u.dilation_h;
  p.dilation_w = u.dilation_w;
  return p;
}

Tensor conv_forward_product(const ProductInfo& info, const Tensor& w) {
  const Tensor& image = info.image;
  const Unfold2dParams& u = info.window;
  Conv2dParams p = conv_params(u);
  const int64_t N = image.size(0), O = w.size(0);
  const Tensor w4 = reshape(w, {O, image.size(1), u.kernel_h, u.kernel_w});
  if (is_channels_last(image)) {
    p.layout = ConvLayout::nhwc;
    return reshape(conv2d(permute(image, {0, 2, 3, 1}), w4, Tensor(), p), {N, -1, O});  // (N, OH, OW, O) rows
  }
  return reshape(conv2d(image, w4, Tensor(), p), {N, O, -1}).transpose(1, 2);
}

Tensor exact_grad_x(const Tensor& g_y, const Tensor& w) { return matmul(g_y, w); }

Tensor exact_grad_w(const Tensor& g_y, const Tensor& x) {
  const Tensor g2 = reshape(g_y, {-1, g_y.size(-1)});  // (B·L, O)
  const Tensor x2 = reshape(x, {-1, x.size(-1)});      // (B·L, I)
  return matmul(g2.transpose(0, 1), x2);               // (O, I)
}

// (rows, C) -> (rows / k, k·C): rows grouped by their scale, for scale_dim0.
static Tensor by_row_group(const Tensor& t, int64_t k) { return reshape(t, {t.size(0) / k, k * t.size(1)}); }

Tensor scale_i32(const Tensor& acc, const Tensor& scale_a, const Tensor& scale_b, double mult, DType out_dtype,
                 const Tensor& row_scale, int64_t rows_per_scale) {
  HT_ASSERT(acc.dtype() == DType::i32 && acc.dim() == 2 && scale_a.numel() == 1 && scale_b.numel() == 1,
            "scale_i32: expected 2-D i32 values and one-element scales, got {}, {}, {}", acc.describe(),
            scale_a.describe(), scale_b.describe());
  HT_ASSERT(!row_scale.defined() || row_scale.numel() * rows_per_scale == acc.size(0),
            "scale_i32: {} row scales for {} rows in groups of {}", row_scale.numel(), acc.size(0), rows_per_scale);
  if (acc.is_cuda()) {
#ifdef HADATRAIN_CUDA
    if (out_dtype == DType::f32 || out_dtype == DType::bf16) {
      const Tensor a = acc.contiguous();
      Tensor out = empty(acc.shape(), {out_dtype, acc.device()});
      cuda_ops::grad_scale_i32(out, a, scale_a.to(DType::f32).contiguous(), scale_b.to(DType::f32).contiguous(), mult,
                               row_scale.defined() ? row_scale.to(DType::f32).contiguous() : Tensor(), rows_per_scale);
      return out;
    }
#endif
  }
  Tensor v = mul(mul(acc.to(DType::f32), mul(scale_a, scale_b)), mult);
  if (row_scale.defined()) v = reshape(scale_dim0(by_row_group(v, rows_per_scale), row_scale), v.shape());
  return v.to(out_dtype);
}

// Note [Per-sample scales in one product]
// HLQ's g_w with per-sample scales (gw_scale: sample, the reference's setting) and LUQ's g_w are
// Σ_b c_b·q_a[b]ᵀ·q_b[b]: the scales sit on the contraction axis, so an integer or fp8 product cannot apply them.
// The reference runs one product per sample and sums the scaled (M, N) results; here that took 10.8 ms for ViT-B's
// fc1 at batch 256 (B int32 (3072, 768) results written, scaled and summed), against 0.93 ms for the whole HLQ
// backward with a tensor scale. Instead, for the operand with fewer columns, t = c_b·q[b] is formed in f32 (one
// rounding, 2⁻²⁴) and split into two bf16 terms, hi = bf16(t) and lo = bf16(t − hi), |t − hi − lo| ≤ 2⁻¹⁸·|t|
// (split_scaled_codes: one pass on CUDA). The other operand's integers (|q| ≤ 255) are exact in bf16, and bf16
// products are exact in the product's fp32 accumulator, so
//   Σ_b c_b·q_a[b]ᵀ·q_b[b] = hiᵀ·q_b + loᵀ·q_b      (scale on a; on b symmetrically)
// is two bf16 products over K = B·K_b (matmul_f32) that differ from the per-sample sum by about 2⁻¹⁷ relative and by
// the order of the fp32 sums (ViT-B's fc1 backward with per-sample scales: 1.84 ms against 10.8). When the scaled
// operand holds LUQ's codes (±2^k), hi and lo are exactly bf16(c)·q and bf16(c − bf16(c))·q (Note [LUQ g_w in one
// product]).
Tensor split_scaled_codes(const Tensor& codes, const Tensor& scale) {
  HT_ASSERT(codes.dim() >= 1 && scale.numel() == codes.size(0) &&
                (codes.dtype() == DType::i8 || codes.dtype() == DType::f8e4m3),
            "split_scaled_codes: expected i8 or f8e4m3 codes (B, ...) and scale (B), got {}, {}", codes.describe(),
            scale.describe());
  Shape shape = codes.shape();
  shape.insert(0, 2);
  if (codes.is_cuda()) {
#ifdef HADATRAIN_CUDA
    Tensor out = empty(shape, {DType::bf16, codes.device()});
    cuda_ops::grad_split_scaled(out, codes.contiguous(), scale.to(DType::f32).contiguous());
    return out;
#endif
  }
  const Tensor t = scale_dim0(codes.to(DType::f32), scale.to(DType::f32));
  const Tensor hi = t.to(DType::bf16);
  const Tensor lo = sub(t, hi.to(DType::f32)).to(DType::bf16);
  return reshape(cat({hi, lo}, 0), shape);
}

Tensor scaled_code_product(const Tensor& a, const Tensor& b, const Tensor& scale) {
  HT_ASSERT(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(1) == b.size(1) &&
                scale.numel() == a.size(0),
            "scaled_code_product: expected a (B, K, M), b (B, K, N) and scale (B), got {}, {}, {}", a.describe(),
            b.describe(), scale.describe());
  const int64_t BK = a.size(0) * a.size(1);
  // The scale goes onto the operand with fewer columns (its split writes 4 bytes a code, the other's copy 2).
  const bool on_a = a.size(2) <= b.size(2);
  const Tensor split = split_scaled_codes(on_a ? a : b, scale);               // (2, B, K, C)
  const Tensor other = reshape((on_a ? b : a).to(DType::bf16), {BK, -1});      // (B·K, C')
  auto term = [&](int64_t half) {
    const Tensor s = reshape(select(split, 0, half), {BK, -1});
    return on_a ? matmul_f32(s.transpose(0, 1), other) : matmul_f32(other.transpose(0, 1), s);
  };
  return add(term(0), term(1));
}

Tensor pack_int4_any(const Tensor& q) {
  Tensor flat = reshape(q, {-1});
  if (flat.numel() % 2) flat = cat({flat, zeros({1}, {DType::i8, flat.device()})}, 0);
  return pack_int4(flat);
}

Tensor unpack_int4_any(const Tensor& packed, const Shape& shape) {
  return reshape(narrow(unpack_int4(packed), 0, 0, numel_of(shape)), shape);
}

Tensor repeat_each(const Tensor& v, int64_t k, double mult) {
  const Tensor view = expand(reshape(v.to(DType::f32), {-1, 1}), {v.numel(), k});
  return reshape(mult == 1.0 ? contiguous(view) : mul(view, mult), {-1});
}

Tensor scale_dim0(const Tensor& t, const Tensor& scale) {
  std::vector<int64_t> s(static_cast<std::size_t>(t.dim()), 1);  // (G, 1, ..., 1)
  s[0] = scale.numel();
  return mul(t, reshape(scale, Shape(s)));
}

}  // namespace ht::grad
