// The `luq` baseline (hlq.md §10; Chmiel et al., ICLR 2023): both backward products full rank, no
// Hadamard; g_y -> LUQ 4-bit (logarithmic, unbiased, per-sample α), W and the saved x -> 4-bit INT
// (SAWB or absmax, round to nearest). Every LUQ value ±2^k (k <= 7) and every integer −7..7 is exact in
// e4m3, so g_x runs on fp8 tensor cores without error beyond fp32 accumulation; g_w, whose per-sample scales sit on
// the contraction axis, is two bf16 products over split scaled codes (Note [LUQ g_w in one product]).
// Shapes follow Note [Product geometry]: x (B, L, I), w (O, I), g_y (B, L, O). Like HLQ's defaults, the forward
// keeps no copy of an input that another op keeps or that its op can rebuild (LaterInput); backward quantises it
// then, with the same bits.
#include <optional>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/grad/pipeline_luq.h"
#include "hadatrain/grad/registry.h"
#include "pipeline_options.h"
#include "pipeline_helpers.h"

namespace ht::grad {
namespace {

struct LuqSaved final : SavedState {
  Tensor w;          // (O, I) compute dtype
  DType x_dtype = DType::f32;
  Tensor xq;         // packed int4 (or int8 for x_bits > 4) of x (B, L, I)
  Tensor xs;         // (B) f32
  Shape x_shape;
  NoiseKey key;
  LaterInput later;                      // x (or a conv's image) by reference or its rebuild, quantised in backward
  std::optional<Unfold2dParams> window;  // a conv product: the image's window (x = unfold2d(image, window))
};

ScaleRule rule_of(WeightQuant q) { return q == WeightQuant::sawb ? ScaleRule::sawb : ScaleRule::absmax; }

class LuqPipeline final : public Pipeline {
 public:
  explicit LuqPipeline(const LuqOptions& o) : o_(o) {
    HT_CHECK(o.bits >= 2 && o.bits <= 4, "luq: bits must be 2..4, got {}", o.bits);
    HT_CHECK(o.x_bits >= 2 && o.x_bits <= 5, "luq: x_bits must be 2..5 (integers exact in e4m3), got {}", o.x_bits);
  }
  std::string name() const override { return "luq"; }
  bool draws_noise() const override { return true; }

  ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                        SaveForBackward save) override {
    ForwardResult r;
    r.y = forward_product(x, w, info);
    if (save == SaveForBackward::yes) r.saved = save_state(x, w, info, key, std::nullopt);
    return r;
  }

  // A conv product: y is the convolution itself (no GEMM over the columns); the saved x are the columns (or the
  // image, deferred, unfolded in backward).
  ForwardResult forward_conv(const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                             SaveForBackward save) override {
    ForwardResult r;
    r.y = conv_forward_product(info, w);
    if (save == SaveForBackward::yes) r.saved = save_state(info.image, w, info, key, info.window);
    return r;
  }

  Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) override {
    auto& s = static_cast<LuqSaved&>(saved);
    Tensor xq;  // (B, L, I) int8 levels of x, for g_w
    if (s.later.pending()) {  // quantised now, used once: not packed
      const Tensor in = s.later.take();
      if (wanted.w) {
        const Quantized qx = quantize_input(s, in);
        xq = qx.values;
        s.xs = qx.scale;
      }
    } else if (wanted.w) {
      xq = o_.x_bits <= 4 ? unpack_int4_any(s.xq, s.x_shape) : s.xq;
    }
    const int64_t B = g_y.size(0), L = g_y.size(1), O = g_y.size(2), I = s.w.size(1);
    LuqSpec ls;
    ls.bits = o_.bits;
    ls.granularity = Granularity::sample;
    ls.noise = s.key.noise(role_luq_gy);
    const Quantized gq = luq_quantize(g_y, ls);  // (B, L, O) e4m3 ±2^k, α (B)
    Grads g;
    if (wanted.x) {
      QuantSpec qw;
      qw.bits = o_.x_bits;
      qw.granularity = Granularity::tensor;
      qw.scale_rule = rule_of(o_.w_quant);
      qw.rounding = o_.w_quant == WeightQuant::absmax_sr ? Rounding::stochastic : Rounding::nearest;
      qw.noise = s.key.noise(role_gx_w);
      if (o_.x_bits <= 5) qw.values_dtype = DType::f8e4m3;  // written as e4m3 directly (the .to below is a no-op)
      const Quantized wq = quantize(s.w.transpose(0, 1), qw);  // (I, O)
      // α per row (each sample's repeated over its L rows) and s_w per column as the fp8 product's outer scales:
      // one rounding to x's dtype, no f32 passes after the product (as HLQ's, Note [HLQ outer-scale product]).
      g.x = reshape(fp8_matmul_nt_outer(reshape(gq.values, {B * L, O}), wq.values.to(DType::f8e4m3),
                                        repeat_each(gq.scale, L), repeat_each(wq.scale, I),
                                        s.x_dtype == DType::bf16 ? DType::bf16 : DType::f32),
                    {B, L, I}).to(s.x_dtype);
    }
    if (wanted.w) g.w = grad_w(gq, xq, s.xs).to(s.w.dtype());
    return g;
  }

 private:
  // in: x, or a conv's image when `window` is given.
  std::unique_ptr<SavedState> save_state(const Tensor& in, const Tensor& w, const ProductInfo& info,
                                         const NoiseKey& key, std::optional<Unfold2dParams> window) const {
    auto s = std::make_unique<LuqSaved>();
    s->w = w;
    s->x_dtype = in.dtype();
    s->key = key;
    s->window = window;
    // x's codes serve g_w only (Note [What a product keeps] in grad/pipeline.h)
    if (info.w_grad && !s->later.defer(in, info.rebuild, {})) {
      const Quantized qx = quantize_input(*s, in);
      s->xq = o_.x_bits <= 4 ? pack_int4_any(qx.values) : qx.values;
      s->xs = qx.scale;
      s->bytes = tensor_bytes(s->xq) + tensor_bytes(s->xs);
    }
    return s;
  }

  // Note [LUQ g_w in one product]
  // g_w = Σ_b c_b · q_g[b]ᵀ · q_x[b] with c_b = α_b · s_x[b], per-sample scales on the contraction axis, so no single
  // fp8 product can apply them, and one product per sample (B (O, I) f32 results scaled and summed) would dominate a
  // LUQ step. Instead c_b·q of one operand (the one with fewer columns) is split into two bf16 terms and g_w is two
  // bf16 products with fp32 accumulation over K = B·L against the other operand's codes, which are exact in bf16
  // (scaled_code_product, Note [Per-sample scales in one product], shared with HLQ's per-sample g_w). On q_g's side
  // every code is ±2^k or 0, so the terms are exactly bf16(c_b)·q and bf16(c_b − bf16(c_b))·q; on q_x's side
  // (integers −7…7) they are within 2⁻¹⁸ of c_b·q. Either way the result differs from the per-sample sum by about
  // 2⁻¹⁷ and by the order of the fp32 sums.
  static Tensor grad_w(const Quantized& gq, const Tensor& xq, const Tensor& xs) {
    return scaled_code_product(gq.values, xq, mul(gq.scale.to(DType::f32), xs.to(DType::f32)));  // (O, I) f32
  }

  // x (B, L, I), or a conv's image unfolded into it -> its 4-bit levels (int8) and per-sample scales.
  Quantized quantize_input(LuqSaved& s, const Tensor& in) const {
    const Tensor x = s.window ? unfold2d(in, *s.window) : in;
    s.x_shape = x.shape();
    QuantSpec q;
    q.bits = o_.x_bits;
    q.granularity = Granularity::sample;
    q.scale_rule = rule_of(o_.w_quant);
    q.rounding = Rounding::nearest;
    return quantize(x, q);
  }

  LuqOptions o_;
};

}  // namespace

std::shared_ptr<Pipeline> make_luq_pipeline(const LuqOptions& o) { return std::make_shared<LuqPipeline>(o); }

// Called once by the registry (Note [Registration and static linking] in grad/registry.h).
HT_BUILTIN_PIPELINE(luq) {
  return erase(PipelineKind<LuqOptions>{
      .name = "luq",
      .read_options =
          [](ConfigReader& r) {
            LuqOptions o;
            o.bits = read_bits(r, "bits", 4, {2, 3, 4});
            o.x_bits = read_bits(r, "x_bits", 4, {2, 3, 4, 5});
            o.w_quant = read_weight_quant(r, "w_quant");
            return o;
          },
      .make = make_luq_pipeline,
      .describe = [](const LuqOptions& o) { return fmt::format("luq ({} bit g_y, {} bit W and x)", o.bits, o.x_bits); }});
}

}  // namespace ht::grad
