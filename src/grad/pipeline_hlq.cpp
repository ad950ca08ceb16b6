// The `hlq` pipeline (docs/gradient_pipelines.md; specification hlq.md §3–§5):
//   g_x (HQ): g_y and W rotated by block-T Hadamard along O, 4-bit symmetric (g_y stochastic per token /
//             sample / tensor, W SAWB or absmax per tensor), integer product, rescaled by s_g·s_w/T.
//   g_w (HLA): g_y and the saved x projected per sample onto the low-sequency Walsh rows along the token
//             axis, 8-bit, integer product over the reduced axis, rescaled by s_g·s_x/n.
//   ACBP: the forward saves only the projected, quantised x (int8, packed int4 or f32), never x itself,
//         unless another op keeps x for its own backward anyway: then a reference, compressed in backward
//         (acbp_share; Note [Shared saved inputs] in autograd/saved_tensor.h).
//         A Conv2d with acbp_conv input_map saves its input map instead (int8, one scale per sample) and
//         backward re-runs the projection from it (Note [ACBP of a convolution], docs/gradient_pipelines.md).
//   Conv2d forward: the convolution itself, ACBP projected from the input map (Note [HLQ conv forward]).
//   Conv2d backward: g_x and g_w as the same low-precision products over the im2col columns (g_x folded back to
//         the image); conv_gx dgrad_simulated / conv_gw wgrad_simulated replace them with compute-dtype
//         convolutions over dequantised values, for comparison only (Notes [HLQ conv g_x], [HLQ conv g_w]).
// Shapes follow Note [Product geometry]: x (B, L, I), w (O, I), g_y (B, L, O).
#include <fmt/format.h>

#include "hadatrain/autograd/node.h"
#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/lowp_matmul.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/side_branch.h"
#include "hadatrain/grad/phase_marks.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "pipeline_helpers.h"

namespace ht::grad {
namespace {

int64_t largest_pow2_divisor(int64_t v) { return v > 0 ? (v & -v) : 1; }

// The activation the g_w path works on, after the fallback of hlq.md §4.7 for lengths without a
// power-of-two factor (Note [HLA fallbacks] in docs/gradient_pipelines.md).
struct HlaAxis {
  HlaPlan plan;
  int64_t extra = 0;  // split_extra: leading tokens on the exact path
  int64_t pad = 0;    // pad: zero positions appended to each sample
};

// The quantised (or plain) projected activation kept by the forward, R = (L/n)·r: with one scale per tensor
// the quantiser writes it K-major, (I, B·R), ready for the g_w product; with per-sample scales (B, R, I).
struct CompressedX {
  Tensor values;  // int8 (I, B·R) or (B, R, I), packed int4 (flat), or the projection itself when not quantised
  Tensor scale;   // f32 (1) or (B), undefined when not quantised
  Shape shape;    // of the int8 values: (I, B·R) or (B, R, I); (B, R, I) when not quantised
  int bits = 0;   // 8, 4 or 0
};

// What the g_w product reads of x: the compressed projection and the exactly kept leading tokens.
struct SavedColumns {
  CompressedX xc;
  Tensor x_extra;  // (B, E, I) for split_extra
};

// acbp_conv input_map: the conv's input map, from which backward rebuilds the columns x = unfold2d(map).
// (Its layout and window are the product's: HlqSaved::conv.)
struct SavedMap {
  Tensor values;              // int8 (N, C, H, W), or (N, H, W, C) when conv.channels_last; the map itself when
                              // not quantised (acbp_bits 0); undefined when the columns were saved
  Tensor scale;               // f32 (N), undefined when not quantised
};

struct HlqSaved final : SavedState {
  Tensor w;        // (O, I), compute dtype (the parameter or its bf16 cast)
  DType x_dtype = DType::f32;
  int64_t L = 0;
  HlaAxis axis;
  SavedColumns cols;  // unless map.values is defined
  SavedMap map;
  // acbp_share / acbp_rebuild: the input (x (B, L, I), or a conv's image (N, C, H, W)) by reference or its rebuild;
  // backward compresses it into cols / map as the forward would have.
  LaterInput later;
  NoiseKey key;
  // Conv products (forward_conv): the image's geometry and window, for folding, for the simulated g_x and g_w
  // forms (Notes [HLQ conv g_x], [HLQ conv g_w]) and for rebuilding the columns from a saved map.
  struct Conv {
    bool defined = false;
    bool channels_last = false;  // the image was the (N, C, H, W) view of a contiguous (N, H, W, C) map
    int64_t C = 0, H = 0, W = 0, grid_h = 0, grid_w = 0;
    Unfold2dParams window;
  } conv;
};

// t (B, L, C) -> (B, R, C): the HLA projection, or t itself for the identity plan (n = 1: nothing to
// project, and the quantiser reads the compute dtype directly). absmax (projections only): receives
// max |projection| from the projection kernel.
Tensor project(const Tensor& t, const HlaPlan& plan, Tensor* absmax = nullptr) {
  return plan.block == 1 ? t : hla_project(t, plan, HlaLayout::rows, absmax);
}

// Note [HLQ outer-scale product]
// With per-token (or per-sample) g_y scales and the fp8 carrier, g_x = s_g[row] · (s_w / T) · (q_g · q_wᵀ). Both
// scales go into the fp8 product as outer vectors (fp8_matmul_nt_outer: s_g per row, s_w / T repeated per column; on
// CUDA cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F): one rounding and no pass of its own, where scaling the
// rows of a finished product would write the product once more and round it a second time.

Tensor pad_tokens(const Tensor& t, int64_t pad) {  // (B, L, C) -> (B, L + pad, C), zeros appended
  if (pad == 0) return t;
  Tensor z = zeros({t.size(0), pad, t.size(2)}, {t.dtype(), t.device()});
  return cat({t, z}, 1);
}

class HlqPipeline final : public Pipeline {
 public:
  explicit HlqPipeline(const HlqOptions& o) : o_(o) {
    HT_CHECK(o.gx_bits == 0 || (o.gx_bits >= 2 && o.gx_bits <= 8), "hlq: gx_bits must be 0 or 2..8, got {}",
             o.gx_bits);
    HT_CHECK(o.gw_bits == 0 || (o.gw_bits >= 2 && o.gw_bits <= 8), "hlq: gw_bits must be 0 or 2..8, got {}",
             o.gw_bits);
    HT_CHECK(o.acbp_bits == 0 || o.acbp_bits == 4 || o.acbp_bits == 8, "hlq: acbp_bits must be 0, 4 or 8, got {}",
             o.acbp_bits);
    HT_CHECK(o.gw_bits > 0 || o.acbp_bits == 0,
             "hlq: acbp_bits {} needs a quantised g_w path (gw_bits > 0); set acbp_bits 0 with gw_bits 0",
             o.acbp_bits);
    HT_CHECK(o.block >= 1 && (o.block & (o.block - 1)) == 0, "hlq: block must be a power of two, got {}", o.block);
    HT_CHECK(o.pad_to >= 2 && (o.pad_to & (o.pad_to - 1)) == 0, "hlq: pad_to must be a power of two >= 2, got {}",
             o.pad_to);
    HT_CHECK(o.gw_scale != ScaleGranularity::token, "hlq: gw_scale must be sample or tensor");
    HT_CHECK(o.extra_tokens >= 1, "hlq: extra_tokens must be >= 1, got {}", o.extra_tokens);
  }
  std::string name() const override { return "hlq"; }
  bool draws_noise() const override { return true; }
  std::string fallback() const override { return fallback_; }

  ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                        SaveForBackward save) override {
    ForwardResult r;
    mark_phase("forward: product");
    r.y = forward_product(x, w, info);  // (B, L, O), high precision
    mark_phase(nullptr);
    if (save == SaveForBackward::no) return r;
    auto s = new_saved(w, x.dtype(), x.size(1), key);
    // ACBP serves g_w only: a frozen weight's product keeps no x (Note [What a product keeps] in grad/pipeline.h)
    if (info.w_grad && !s->later.defer(x, info.rebuild, later_allowed())) {
      PhaseScope phase("forward: ACBP (project, quantise x)");
      s->bytes = save_input(*s, x);
    }
    r.saved = std::move(s);
    return r;
  }

  // Note [HLQ conv forward]
  // A Conv2d product never materialises its im2col columns in the forward: y is the convolution itself (the
  // conv2d op: cuDNN on CUDA, the same high-precision product up to summation order), and ACBP projects the
  // columns straight from the input map (hla_project_unfolded; the CUDA kernel reads the map through the
  // im2col index map), or saves the map (acbp_conv input_map). Only the split_extra / pad fallbacks and the
  // identity plan (no power-of-two factor in L) still unfold.
  ForwardResult forward_conv(const Tensor& w, const ProductInfo& info, const NoiseKey& key,
                             SaveForBackward save) override {
    const Tensor& image = info.image;  // (N, C, H, W), any strides
    ForwardResult r;
    mark_phase("forward: product");
    r.y = conv_forward_product(info, w);  // (B, L, O)
    mark_phase(nullptr);
    if (save == SaveForBackward::no) return r;
    auto s = new_saved(w, image.dtype(), info.grid_h * info.grid_w, key);
    s->conv.defined = true;
    s->conv.channels_last = is_channels_last(image);
    s->conv.C = image.size(1);
    s->conv.H = image.size(2);
    s->conv.W = image.size(3);
    s->conv.grid_h = info.grid_h;
    s->conv.grid_w = info.grid_w;
    s->conv.window = info.window;
    if (info.w_grad && !s->later.defer(image, info.rebuild, later_allowed())) {
      PhaseScope phase("forward: ACBP (project, quantise x)");
      s->bytes = save_input(*s, image);
    }
    r.saved = std::move(s);
    return r;
  }

  Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) override {
    auto& s = static_cast<HlqSaved&>(saved);
    // conv_gw wgrad_simulated: a convolution backward over the image (Note [HLQ conv g_w]), when backward has it.
    const bool wgrad = wanted.w && wgrad_simulated(s);
    Tensor image;  // (N, C, H, W) for the simulated g_w
    if (wgrad) {
      mark_phase("backward: input for simulated g_w");
      image = s.later.pending() ? s.later.take() : map_image(s);
    } else if (s.later.pending()) {
      // What the forward would have saved, from the same input (same bits): the kept input (acbp_share) or the
      // input rebuilt by its op (acbp_rebuild).
      mark_phase("backward: ACBP of the shared / rebuilt input");
      save_input(s, s.later.take());
    }
    Grads g;
    // When HLA quantises g_y itself (identity plan) with one absmax scale, the g_x quantiser's pass over g_y
    // also yields max |g_y|, and the g_w quantiser skips its statistics pass (one read of g_y less).
    const bool share = wanted.x && wanted.w && gw_quantises_raw_gy(s);
    Tensor gy_absmax;
    auto run_gw = [&] {
      if (wgrad) {
        mark_phase("g_w: simulated (project, quantise, wgrad)");
        g.w = grad_w_wgrad_simulated(s, g_y, image, gy_absmax).to(s.w.dtype());
      } else {
        g.w = grad_w(s, g_y, gy_absmax, wanted.b ? &g.b : nullptr);
        if (g.w.dtype() != s.w.dtype()) {
          mark_phase("g_w: dtype conversion");
          g.w = g.w.to(s.w.dtype());
        }
      }
    };
    // Note [HLQ's two chains]
    // g_x (quantise g_y and W, 4-bit product) and g_w (project g_y, quantise g̃, 8-bit product, rescale) read g_y and
    // the saved state but not each other's results, except that g_w may take max |g_y| from g_y's 4-bit quantiser
    // (`share`). Their quantisers and projections each leave much of the GPU idle (a projection with a full register
    // file at a quarter of the occupancy, a quantiser bound by its noise's instructions), so on CUDA the work is split
    // over two streams (Note [Side branches] in tensor/side_branch.h). Without `share`, g_w's whole chain runs on the
    // side stream and g_x's on the main stream. For a Linear the main stream queues g_x's two quantisers before the
    // fork, so that they run first and the projection then runs beside the 4-bit product; a Conv2d forks first, so that
    // the projection of its columns starts beside g_y's quantiser. (Measured on the H200 in one call: at Llama-3-8B
    // shapes the Linear order takes 0.5–1.5 % off the backward against the fork first; on ResNet-50 it left the step's
    // time as it was and its step graph took 5.56 GiB against 4.69. Moving W's quantiser alone to the side stream was
    // slower; capping the projection's persistent grid at one or half a block per SM gained nothing; compressing an
    // input the forward deferred (acbp_share, acbp_rebuild) on the side stream beside g_x's chain, instead of on the
    // main stream before the fork, made neither ViT-B/16's nor ResNet-50's step faster and took more graph memory.)
    // With `share`, the side stream runs g_y's quantiser and then g_w's chain, the main stream W's quantiser beside
    // it and, once g_y's codes are done (a mark, not the whole chain), the 4-bit product. Same kernels, same
    // noise, the same values as one stream; phase profiling (phases_marked) and `overlap: false` run it all in place,
    // in one stream's order.
    const bool overlap = o_.overlap && wanted.x && wanted.w && !phases_marked();
    const bool simulated_gx = wanted.x && s.conv.defined && o_.conv_gx == ConvGx::dgrad_simulated;
    auto in_x_dtype = [&] {  // g_x in the input's dtype
      if (g.x.dtype() != s.x_dtype) {
        mark_phase("g_x: dtype conversion");
        g.x = g.x.to(s.x_dtype);
      }
    };
    if (share && !simulated_gx) {  // share implies wanted.x, wanted.w and gx_bits > 0
      SideBranch side(g_y.device(), overlap);
      Quantized q_g;
      side.run([&] {
        q_g = gx_quantize_gy(s, g_y, true);
        gy_absmax = q_g.input_absmax;
      });
      const SideBranch::Mark quantised = side.mark();
      side.run(run_gw);
      const Quantized q_w = gx_quantize_w(s, g_y.size(2));
      side.wait(quantised, {q_g.values, q_g.scale, q_g.input_absmax});
      g.x = gx_product(s, g_y, q_g, q_w);
      in_x_dtype();
      side.join({g.w, g.b});
    } else {
      SideBranch side(g_y.device(), overlap && !share);
      // A Conv2d forks before g_x's work, a Linear after g_x's two quantisers (Note [HLQ's two chains]). A concurrent
      // side implies wanted.x and wanted.w; a simulated g_x, a Conv2d.
      const bool fork_first = side.concurrent() && s.conv.defined;
      if (fork_first) side.run(run_gw);
      const auto fork_late = [&] {
        if (side.concurrent() && !fork_first) side.run(run_gw);
      };
      if (simulated_gx) {
        mark_phase("g_x: simulated (quantise, dgrad)");
        g.x = grad_x_dgrad_simulated(s, g_y, share ? &gy_absmax : nullptr);
        g.x_is_image = true;
      } else if (wanted.x) {
        g.x = grad_x(s, g_y, share ? &gy_absmax : nullptr, fork_late);
        in_x_dtype();
      }
      if (!side.concurrent() && wanted.w) run_gw();
      side.join({g.w, g.b});
    }
    mark_phase(nullptr);
    return g;
  }

 private:
  // The plan for `length` positions. An explicit row count is per block and capped at the s² rows a block
  // of n = hla_block_for(length) offers (s = 2^⌊log₄ n⌋), so one setting serves every layer of a network whose
  // maps shrink (a ResNet's 32×32 … 4×4 stages).
  HlaPlan plan_for(int64_t length) const {
    HlaRank rank = o_.rank;
    if (rank.kind == HlaRank::Kind::rows) {
      const int64_t n = hla_block_for(length);
      int log2n = 0;
      while ((int64_t{1} << (log2n + 1)) <= n) ++log2n;
      const int64_t s = int64_t{1} << (log2n / 2);
      rank.rows = std::min(rank.rows, s * s);
    }
    return hla_plan(length, rank);
  }

  HlaAxis choose_axis(int64_t L) {
    HlaAxis a;
    fallback_.clear();
    if (hla_block_for(L) > 1 || o_.fallback == HlaFallback::ref) {
      // fallback ref (the reference code's choice): an identity plan, named in the start-up line (fallback())
      if (hla_block_for(L) == 1)
        fallback_ = fmt::format("HLA keeps every row: {} tokens per sample have no power-of-two factor (fallback "
                                "split_extra or pad compresses them)",
                                L);
      a.plan = plan_for(L);
      return a;
    }
    if (o_.fallback == HlaFallback::split_extra) {
      HT_CHECK(o_.extra_tokens < L, "hlq: extra_tokens {} must be smaller than the {} tokens per sample",
               o_.extra_tokens, L);
      a.extra = o_.extra_tokens;
      a.plan = plan_for(L - a.extra);
    } else {
      a.pad = (L + o_.pad_to - 1) / o_.pad_to * o_.pad_to - L;
      a.plan = plan_for(L + a.pad);
    }
    return a;
  }

  std::unique_ptr<HlqSaved> new_saved(const Tensor& w, DType x_dtype, int64_t L, const NoiseKey& key) {
    auto s = std::make_unique<HlqSaved>();
    s->w = w;
    s->x_dtype = x_dtype;
    s->L = L;
    s->key = key;
    s->axis = choose_axis(L);
    return s;
  }

  LaterInput::Allowed later_allowed() const { return {.share = o_.acbp_share, .rebuild = o_.acbp_rebuild}; }

  // What ACBP keeps of the product's input, into s.cols / s.map: for a Linear, x (B, L, I) projected and
  // compressed; for a conv product, its input map (acbp_conv input_map, where smaller) or the projected columns.
  // Returns the bytes kept.
  int64_t save_input(HlqSaved& s, const Tensor& in) const {
    if (!s.conv.defined) {
      s.cols = save_columns(in, s.axis, s.L);
    } else if (o_.acbp_conv == AcbpConv::input_map && map_is_smaller(s.axis, in.size(0), s.w.size(1), in)) {
      s.map = save_map(in);
      return tensor_bytes(s.map.values) + tensor_bytes(s.map.scale);
    } else {
      s.cols = save_image_columns(in, s.conv.window, s.axis, s.L);
    }
    return columns_bytes(s.cols);
  }

  static int64_t columns_bytes(const SavedColumns& c) {
    return tensor_bytes(c.xc.values) + tensor_bytes(c.xc.scale) + tensor_bytes(c.x_extra);
  }

  // The saved columns of a conv product from its input map (Note [HLQ conv forward]): projected from the map
  // directly unless a fallback splits or pads the token axis or the plan is the identity.
  SavedColumns save_image_columns(const Tensor& image, const Unfold2dParams& u, const HlaAxis& axis, int64_t L) const {
    if (axis.extra > 0 || axis.pad > 0 || axis.plan.block == 1) return save_columns(unfold2d(image, u), axis, L);
    SavedColumns c;
    c.xc = compress(hla_project_unfolded(image, u, axis.plan), o_.acbp_bits);  // (B, R, I)
    return c;
  }

  // x (B, L, I) -> what the g_w product reads (ACBP): the projected, compressed tokens and the exact extra ones.
  SavedColumns save_columns(const Tensor& x, const HlaAxis& axis, int64_t L) const {
    SavedColumns c;
    Tensor xm = x;  // (B, L', I): the part of x that is projected
    if (axis.extra > 0) {
      c.x_extra = narrow(x, 1, 0, axis.extra).contiguous();  // (B, E, I)
      xm = narrow(x, 1, axis.extra, L - axis.extra);
    }
    xm = pad_tokens(xm, axis.pad);
    c.xc = compress(project(xm, axis.plan), o_.acbp_bits);  // (B, R, I)
    return c;
  }

  // acbp_conv input_map: whether the saved map (N·C·H·W values, 1 byte each, or the compute dtype's bytes at
  // acbp_bits 0) is smaller than the saved columns (B·R·I values at acbp_bits / 8 bytes each, plus the exact
  // leading tokens). Not so for 1×1 convolutions (their columns are a subset of the map, then projected) and
  // some strided ones; those keep the columns (scales are ignored in the comparison).
  bool map_is_smaller(const HlaAxis& axis, int64_t B, int64_t I, const Tensor& image) const {
    const int64_t R = axis.plan.projected_length();
    const auto item = static_cast<int64_t>(itemsize(image.dtype()));
    const int64_t cols =
        (o_.acbp_bits == 0 ? B * R * I * item : B * R * I * o_.acbp_bits / 8) + B * axis.extra * I * item;
    const int64_t map = image.numel() * (o_.acbp_bits == 0 ? item : 1);
    return map < cols;
  }

  // acbp_conv input_map (Note [ACBP of a convolution]): the input map of x = unfold2d(image, window), 8-bit
  // with one scale per sample (the x̃ quantiser's scale rule, round to nearest), or kept as it is when
  // acbp_bits is 0. A channels-last map (the (N, C, H, W) view of a contiguous (N, H, W, C) tensor) is
  // quantised in its memory order.
  SavedMap save_map(const Tensor& image) const {  // image (N, C, H, W)
    SavedMap m;
    const Tensor phys = is_channels_last(image) ? permute(image, {0, 2, 3, 1}) : image;
    if (o_.acbp_bits == 0) {
      m.values = phys;
      return m;
    }
    QuantSpec q;
    q.bits = 8;
    q.granularity = Granularity::sample;
    q.scale_rule = o_.x_scale;
    q.rounding = Rounding::nearest;
    const Quantized qm = quantize(phys, q);  // int8, phys's shape, scale (N)
    m.values = qm.values;
    m.scale = qm.scale;
    return m;
  }

  // The saved map as an image (N, C, H, W) in the compute dtype: dequantised (one f32 product per element,
  // rounded once to the compute dtype).
  static Tensor map_image(const HlqSaved& s) {
    const SavedMap& m = s.map;
    Tensor image = m.values;
    if (m.scale.defined()) {
      Quantized q;
      q.values = m.values;
      q.scale = m.scale;
      image = dequantize(q, Granularity::sample).to(s.x_dtype);
    }
    return s.conv.channels_last ? permute(image, {0, 3, 1, 2}) : image;  // (N, C, H, W) view
  }

  // x̃ (B, R, I) -> what the forward keeps (ACBP).
  CompressedX compress(const Tensor& xp, int bits) const {
    CompressedX c;
    c.shape = xp.shape();
    c.bits = bits;
    if (c.bits == 0) {
      c.values = xp;
      return c;
    }
    QuantSpec q;
    q.bits = c.bits;
    q.granularity = o_.gw_scale == ScaleGranularity::tensor ? Granularity::tensor : Granularity::sample;
    q.scale_rule = o_.x_scale;
    q.rounding = Rounding::nearest;
    if (q.granularity == Granularity::tensor) q.layout = ValuesLayout::transposed;  // (I, B·R)
    Quantized qx = quantize(xp, q);
    c.shape = qx.values.shape();
    c.scale = qx.scale;
    c.values = c.bits == 4 ? pack_int4_any(qx.values) : qx.values;
    return c;
  }

  // The saved projection as int8 in its stored layout (or unquantised when acbp_bits is 0).
  static Tensor decompress(const CompressedX& c) {
    return c.bits == 4 ? unpack_int4_any(c.values, c.shape) : c.values;
  }

  // True when the g_w path quantises g_y unchanged (identity HLA plan, nothing split off or padded) with one
  // absmax scale per tensor: then m = max |g_y|.
  bool gw_quantises_raw_gy(const HlqSaved& s) const {
    return o_.gw_bits > 0 && o_.gw_scale == ScaleGranularity::tensor && s.axis.plan.block == 1 && s.axis.extra == 0 &&
           s.axis.pad == 0 && o_.gx_bits > 0;
  }

  // HQ's quantiser of g_y (stochastic, per token / sample / tensor, block-T Hadamard) and of W (I, O).
  QuantSpec gy_spec(const HlqSaved& s, int64_t T) const {
    QuantSpec q;
    q.bits = o_.gx_bits;
    q.granularity = o_.gy_scale == ScaleGranularity::token    ? Granularity::row
                    : o_.gy_scale == ScaleGranularity::sample ? Granularity::sample
                                                              : Granularity::tensor;
    q.rounding = Rounding::stochastic;
    q.noise = s.key.noise(role_gx_gy);
    q.hadamard_block = T;
    return q;
  }
  QuantSpec w_spec(const HlqSaved& s, int64_t T) const {
    QuantSpec q;
    q.bits = o_.gx_bits;
    q.granularity = Granularity::tensor;
    q.scale_rule = o_.w_quant == WeightQuant::sawb ? ScaleRule::sawb : ScaleRule::absmax;
    q.rounding = o_.w_quant == WeightQuant::absmax_sr ? Rounding::stochastic : Rounding::nearest;
    q.noise = s.key.noise(role_gx_w);
    q.hadamard_block = T;
    return q;
  }

  // HLA's quantiser of the projected g̃ (stochastic, one scale per tensor or per sample).
  QuantSpec gw_spec(const HlqSaved& s) const {
    QuantSpec q;
    q.bits = o_.gw_bits;
    q.granularity = o_.gw_scale == ScaleGranularity::tensor ? Granularity::tensor : Granularity::sample;
    q.rounding = Rounding::stochastic;
    q.noise = s.key.noise(role_gw_gy);
    return q;
  }

  // The dequantised levels of x under q, in dtype: level · scale as one f32 product, rounded once to dtype,
  // written by the quantiser itself (QuantSpec::values_dtype) for bf16 / f16 / f32; f64 through dequantize
  // (the same f32 product).
  static Tensor dequantized(const Tensor& x, const QuantSpec& q, DType dtype, Tensor* input_absmax = nullptr) {
    QuantSpec spec = q;
    spec.report_input_absmax = input_absmax != nullptr;
    const bool direct = dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32;
    if (direct) spec.values_dtype = dtype;
    const Quantized qx = quantize(x, spec);
    if (input_absmax) *input_absmax = qx.input_absmax;
    return direct ? qx.values : dequantize(qx, spec.granularity).to(dtype);
  }

  // Note [HLQ conv g_x]
  // conv_gx columns (the default) computes a Conv2d's g_x as the specification does for the im2col view:
  // grad_x's 4-bit product q_g·q_wᵀ on fp8 / int8 tensor cores (the CPU: exact integer loops) over B·L × C·k²
  // columns, scaled once, which the product's backward node folds back to the image (fold2d). It needs nothing
  // of the forward but W, so it runs for every conv product, whatever ACBP kept (columns, the input map, a shared
  // or rebuilt input) and for either image layout (the fold writes a contiguous (N, C, H, W) gradient; the
  // columns' order is the same for a channels-last image, whose unfold reads it through its strides).
  // conv_gx dgrad_simulated is for comparison only: the convolution backward (dgrad) of the compute dtype over
  // dequantised operands, d_g = s_g·q_g (B, L, O) and d_w = (s_w / T)·q_w (O, C, kh, kw), both in the rotated
  // domain and each rounded once to the compute dtype, then g_x = dgrad(d_g, d_w) (cuDNN on CUDA, f32
  // accumulation), the image gradient without columns or fold. Σ_o (g_y H)_o (H W)_o = T·(g_y W) per pixel and
  // tap, so the rotation cancels as in the GEMM form. The levels are the same integers as the columns path (same
  // noise); what differs is where the scales enter: the GEMM form scales the exact integer product once, this
  // form rounds each scaled level to the compute dtype first (bf16 keeps 8 significant bits: a relative error of
  // at most 2^-9 per operand, far below the 4-bit step). Per-token scales cannot be taken out of a convolution
  // (neighbouring pixels mix), which is why the scales go into the operands. Its products run in the compute
  // dtype, not on low-precision tensor cores, so its speed says nothing about HLQ's.
  Tensor grad_x_dgrad_simulated(const HlqSaved& s, const Tensor& g_y, Tensor* gy_absmax) const {  // (N, C, H, W)
    const int64_t B = g_y.size(0), O = g_y.size(2);
    const int64_t T = gx_block(O);
    const DType dt = s.x_dtype;
    const Tensor wt = s.w.transpose(0, 1).contiguous();  // (I, O)
    Tensor gd, wd;  // (B, L, O) and (I, O) in the compute dtype, rotated, W divided by T
    if (o_.gx_bits == 0) {  // rotation only
      gd = hadamard_blocks(g_y, T).to(dt);
      wd = div(hadamard_blocks(wt, T), static_cast<double>(T)).to(dt);
    } else {
      gd = dequantized(g_y, gy_spec(s, T), dt, gy_absmax);
      // s_w·q_w rounded once to the compute dtype, then / T: T is a power of two, so the scaling is exact and
      // commutes with the rounding (no pass through f32).
      wd = mul(dequantized(wt, w_spec(s, T), dt), 1.0 / static_cast<double>(T));
    }
    const auto& c = s.conv;
    const int64_t kh = c.window.kernel_h, kw = c.window.kernel_w;
    Conv2dParams p = conv_params(c.window);
    const Tensor g4 = reshape(gd, {B, c.grid_h, c.grid_w, O});  // (N, OH, OW, O)
    const Tensor wk = reshape(wd, {c.C, kh, kw, O});              // wd's rows are the (c, i, j) taps
    if (c.channels_last) {
      // The filter in cuDNN's channels-last order (O, kh, kw, C), seen as the (O, C, kh, kw) weight: one copy.
      const Tensor w4 = permute(contiguous(permute(wk, {3, 1, 2, 0})), {0, 3, 1, 2});
      p.layout = ConvLayout::nhwc;
      return permute(conv2d_input_grad(g4, w4, c.H, c.W, p), {0, 3, 1, 2});  // channels-last (N, C, H, W) view
    }
    return conv2d_input_grad(permute(g4, {0, 3, 1, 2}), contiguous(permute(wk, {3, 0, 1, 2})), c.H, c.W, p);
  }

  // gy_absmax: when not null, receives max |g_y| (f32 (1)) from the g_y quantiser's pass. before_product runs once,
  // after the quantisers are queued and before the product (first, without quantisers).
  template <class F>
  Tensor grad_x(const HlqSaved& s, const Tensor& g_y, Tensor* gy_absmax, F&& before_product) const {  // (B, L, I)
    if (o_.gx_bits == 0) {  // rotation only: (g_y H)(H W) / T = g_y W up to rounding
      before_product();
      const int64_t T = gx_block(g_y.size(2));
      mark_phase("g_x: unquantised product");
      const Tensor wt = s.w.transpose(0, 1).contiguous();  // (I, O)
      const Tensor gh = hadamard_blocks(g_y, T);  // (B, L, O)
      const Tensor wh = hadamard_blocks(wt, T);   // (I, O)
      return div(matmul(gh, wh.transpose(0, 1)), static_cast<double>(T));
    }
    const Quantized q_g = gx_quantize_gy(s, g_y, gy_absmax != nullptr);
    if (gy_absmax) *gy_absmax = q_g.input_absmax;
    const Quantized q_w = gx_quantize_w(s, g_y.size(2));
    before_product();
    return gx_product(s, g_y, q_g, q_w);
  }

  // The block size T of g_x's rotation for O output features, and the carrier of its 4-bit product.
  int64_t gx_block(int64_t O) const { return std::min(o_.block, largest_pow2_divisor(O)); }
  Carrier gx_carrier() const { return o_.gx_bits <= 5 ? o_.carrier : Carrier::int8; }  // e4m3 holds integers to 16
  DType gx_codes() const { return gx_carrier() == Carrier::fp8 ? DType::f8e4m3 : DType::i8; }

  // HQ's g_y (B, L, O), rotated and quantised into the carrier's dtype (e4m3 codes of the levels, no conversion
  // pass); with `absmax`, max |g_y| in input_absmax.
  Quantized gx_quantize_gy(const HlqSaved& s, const Tensor& g_y, bool absmax) const {
    QuantSpec qg = gy_spec(s, gx_block(g_y.size(2)));
    qg.values_dtype = gx_codes();
    qg.report_input_absmax = absmax;
    mark_phase("g_x: quantise g_y (Hadamard, 4-bit SR)");
    return quantize(g_y, qg);  // (B, L, O) int8 or e4m3
  }

  // (I, O) int8 / e4m3 = (H W)ᵀ quantised, from the view Wᵀ: the CUDA quantiser reads W itself (Note [Quantiser of
  // a transposed input] in cuda/kernels/grad_quant_items.cu) or makes the dense copy where its conditions fail.
  Quantized gx_quantize_w(const HlqSaved& s, int64_t O) const {
    QuantSpec qw = w_spec(s, gx_block(O));
    qw.values_dtype = gx_codes();
    mark_phase("g_x: quantise W (Hadamard, 4-bit)");
    return quantize(s.w.transpose(0, 1), qw);
  }

  // g_x (B, L, I) from the quantised g_y and W: the 4-bit product on the carrier's tensor cores, scaled once.
  Tensor gx_product(const HlqSaved& s, const Tensor& g_y, const Quantized& q_g, const Quantized& q_w) const {
    const int64_t B = g_y.size(0), L = g_y.size(1), O = g_y.size(2), I = s.w.size(1);
    const int64_t T = gx_block(O);
    const Carrier carrier = gx_carrier();
    mark_phase("g_x: low-precision product");
    const Tensor a = reshape(q_g.values, {B * L, O});  // (B·L, O) int8 / e4m3
    const double inv_t = 1.0 / static_cast<double>(T);  // a power of two: s_w·(1/T) has the bits of s_w / T
    // Out in the compute dtype (bf16 stays bf16; other dtypes f32). Per-row / per-sample s_g: rows of the
    // product, in groups of `per` rows (1 per token, L per sample).
    const DType out = s.x_dtype == DType::bf16 ? DType::bf16 : DType::f32;
    const bool scalar = o_.gy_scale == ScaleGranularity::tensor;  // gy_spec's granularity
    const int64_t per = o_.gy_scale == ScaleGranularity::token ? 1 : L;
    Tensor acc;  // (B·L, I)
    if (carrier == Carrier::fp8 && !scalar) {
      // Per-row / per-sample s_g and s_w / T as outer-vector scales (Note [HLQ outer-scale product]).
      const Tensor sg = reshape(q_g.scale.to(DType::f32), {-1});  // (B·L / per)
      const Tensor row = per == 1 ? sg : repeat_each(sg, per);
      HT_ASSERT(row.numel() == B * L, "hlq: {} row scales for {} rows", row.numel(), B * L);
      const Tensor col = repeat_each(q_w.scale, I, inv_t);  // (I): s_w / T
      acc = fp8_matmul_nt_outer(a, q_w.values, row, col, out, o_.fp8_accumulation);
    } else if (carrier == Carrier::fp8) {
      // A tensor scale: both scalars go into the fp8 product (read from device memory).
      acc = fp8_matmul_nt(a, q_w.values, q_g.scale, mul(q_w.scale, inv_t), out, o_.fp8_accumulation);
    } else {
      // One pass over the int32 product: s_w/T (and a tensor s_g) as scalars, per-row / per-sample s_g by row.
      const Tensor sw = mul(q_w.scale, inv_t);            // (1): s_w / T, on the device
      const Tensor prod = int8_matmul_nt(a, q_w.values);  // (B·L, I) i32
      const Tensor one = ones({1}, {DType::f32, g_y.device()});
      acc = scalar ? scale_i32(prod, q_g.scale, sw, 1.0, out) : scale_i32(prod, one, sw, 1.0, out, q_g.scale, per);
    }
    return reshape(acc, {B, L, I});
  }

  // Whether the conv g_w product takes the simulated form: asked for (conv_gw wgrad_simulated), a conv product
  // whose image backward can have (deferred: shared or rebuilt; or the saved input map), and no token split or
  // padding (the image has no room for them; they apply only to lengths without a power-of-two factor). Otherwise
  // g_w is the columns product.
  bool wgrad_simulated(const HlqSaved& s) const {
    return s.conv.defined && o_.conv_gw == ConvGw::wgrad_simulated && s.axis.extra == 0 && s.axis.pad == 0 &&
           (s.later.pending() || s.map.values.defined());
  }

  // Note [HLQ conv g_w]
  // HLA's g_w of a Conv2d is (1/n)·Σ_b g̃[b]ᵀ·x̃[b] with g̃ = P·g_y, x̃ = P·cols (P = blkdiag(P_r) along the pixels,
  // cols = im2col of the image). conv_gw columns (the default) runs it as the specification does: grad_w's integer
  // product of the 8-bit q_g̃ and q_x̃ over the reduced axis. x̃ comes from what ACBP kept: the compressed
  // projection itself, or, when backward has the image (a shared or rebuilt input, acbp_share / acbp_rebuild;
  // the int8 input map, acbp_conv input_map), projected and quantised from it in backward exactly as the forward
  // would have (the same bits; Note [HLQ conv forward] for the projection straight from the map).
  // conv_gw wgrad_simulated is for comparison only. Since g̃ᵀ·P·cols = (Pᵀ·g̃)ᵀ·cols, g_w = wgrad(image,
  // Pᵀ·deq(q_g̃) / n), the convolution backward of the compute dtype of the back-projected 8-bit g̃
  // (hla_back_project, rounded once to the compute dtype) against the image itself. q_g̃ is the columns form's
  // (same projection, same noise, same scale); x̃ is not quantised (the image is exact: rebuilt or kept, or the
  // int8 input map's dequantised values), and the sums run in cuDNN (f32 accumulation), not on integer tensor
  // cores. A conv whose forward kept its projected columns has no image in backward and runs columns.
  // gy_absmax: max |g_y| when grad_x computed it (the identity plan's g̃ = g_y needs no statistics pass then).
  Tensor grad_w_wgrad_simulated(const HlqSaved& s, const Tensor& g_y, const Tensor& image,
                                const Tensor& gy_absmax) const {
    const int64_t B = g_y.size(0), O = g_y.size(2);
    const HlaPlan& plan = s.axis.plan;
    Tensor known = gy_absmax;  // the 8-bit quantiser's m for a tensor scale: from the g_x pass or the projection
    const bool want_max = o_.gw_bits > 0 && o_.gw_scale == ScaleGranularity::tensor && plan.block > 1;
    Tensor gp = project(g_y, plan, want_max ? &known : nullptr);  // (B, R, O): f32, or g_y for the identity plan
    if (o_.gw_bits > 0) {  // q_g̃ as the columns form quantises it, dequantised in f32
      QuantSpec qs = gw_spec(s);
      if (qs.granularity == Granularity::tensor) qs.known_absmax = known;
      gp = dequantized(gp, qs, DType::f32);
    }
    const Tensor back = hla_back_project(gp, plan, 1.0 / static_cast<double>(plan.block), s.x_dtype);  // (B, L, O)
    const auto& c = s.conv;
    Conv2dParams p = conv_params(c.window);
    const Tensor g4 = reshape(back, {B, c.grid_h, c.grid_w, O});  // (N, OH, OW, O)
    Tensor gw;  // (O, C, kh, kw)
    if (c.channels_last) {
      p.layout = ConvLayout::nhwc;
      gw = conv2d_weight_grad(permute(image, {0, 2, 3, 1}), g4, c.window.kernel_h, c.window.kernel_w, p);
    } else {
      gw = conv2d_weight_grad(image, permute(g4, {0, 3, 1, 2}), c.window.kernel_h, c.window.kernel_w, p);
    }
    return reshape(gw, {O, -1});
  }

  // gy_absmax: max |g_y| when grad_x computed it (then the identity plan's g̃ = g_y needs no statistics pass).
  // bias: when not null and the 8-bit quantiser reads g_y itself (identity plan, nothing split off or padded, one
  // scale per tensor), receives the bias gradient Σ rows of g_y from that pass (Note [Column sums in the g̃ pass] in
  // docs/gradient_pipelines.md); left undefined otherwise (the product node then sums g_y).
  Tensor grad_w(const HlqSaved& s, const Tensor& g_y, const Tensor& gy_absmax, Tensor* bias) const {  // (O, I)
    // acbp_conv input_map: the columns, projected and compressed as the forward would have done.
    if (s.map.values.defined()) mark_phase("g_w: columns from the saved input map");
    const SavedColumns rebuilt = s.map.values.defined()
                                     ? save_image_columns(map_image(s), s.conv.window, s.axis, s.L)
                                     : SavedColumns{};
    const SavedColumns& c = s.map.values.defined() ? rebuilt : s.cols;
    Tensor gm = g_y;
    mark_phase("g_w: project g_y (HLA)");
    if (s.axis.extra > 0) gm = narrow(g_y, 1, s.axis.extra, s.L - s.axis.extra);
    gm = pad_tokens(gm, s.axis.pad);
    // The 8-bit quantiser's m (one absmax scale): from the g_x quantiser's pass (identity plan, gy_absmax) or
    // from the projection kernel, so that it needs no statistics pass of its own.
    Tensor gp_absmax = gy_absmax;
    const bool want_max = o_.gw_bits > 0 && o_.gw_scale == ScaleGranularity::tensor && s.axis.plan.block > 1;
    const Tensor gp = project(gm, s.axis.plan, want_max ? &gp_absmax : nullptr);  // (B, R, O)
    const double inv_n = 1.0 / static_cast<double>(s.axis.plan.block);
    // Without an exact part to add, the quantised product's epilogue writes the weight's dtype directly.
    const DType wdt = s.w.dtype();
    const DType out = s.axis.extra == 0 && (wdt == DType::f32 || wdt == DType::bf16) ? wdt : DType::f32;
    Tensor gw;
    if (o_.gw_bits == 0) {  // acbp_bits is 0 too: x̃ was kept unquantised; Σ_b g̃[b]ᵀ·x̃[b] (O, I)
      mark_phase("g_w: unquantised product");
      gw = matmul(reshape(gp.to(DType::f32), {-1, gp.size(2)}).transpose(0, 1),
                  reshape(c.xc.values.to(DType::f32), {-1, c.xc.values.size(2)}));
      gw = mul(gw, inv_n);
    } else {  // without ACBP the projection was kept unquantised and is quantised now
      if (c.xc.bits == 0) mark_phase("g_w: quantise x~ (acbp_bits 0)");
      const bool raw_gy = s.axis.plan.block == 1 && s.axis.extra == 0 && s.axis.pad == 0;  // gp is g_y itself
      gw = quantized_grad_w(s, gp, c.xc.bits == 0 ? compress(c.xc.values, o_.gw_bits) : c.xc, inv_n, out, gp_absmax,
                            raw_gy ? bias : nullptr);
    }
    if (s.axis.extra > 0) mark_phase("g_w: exact extra tokens");
    if (s.axis.extra > 0)
      gw = add(gw, exact_grad_w(narrow(g_y, 1, 0, s.axis.extra).to(DType::f32), c.x_extra.to(DType::f32)));
    return gw;
  }

  // mult·s_g·s_x·Σ_b q_g[b]ᵀ·q_x[b] (O, I) for the projected g̃ (B, R, O) and the saved q_x (int8, (I, B·R)
  // for tensor scales, else (B, R, I)); in `out` (f32 or bf16) for tensor scales (one epilogue pass over the
  // int32 product), else f32. gp_absmax: max |g̃| if already known (else undefined).
  // gp_sums: when not null and the scale is one per tensor, receives Σ rows of gp from the quantiser's pass.
  Tensor quantized_grad_w(const HlqSaved& s, const Tensor& gp, const CompressedX& xc, double mult, DType out,
                          const Tensor& gp_absmax, Tensor* gp_sums = nullptr) const {
    if (xc.bits == 4) mark_phase("g_w: unpack int4 x");
    const Tensor xq = decompress(xc);
    QuantSpec qs = gw_spec(s);
    mark_phase("g_w: quantise g~ (8-bit SR)");
    if (qs.granularity == Granularity::tensor) {  // one product over K = B·R, int32 (O, I)
      qs.layout = ValuesLayout::transposed;         // the quantiser writes q_g K-major: (O, B·R)
      qs.known_absmax = gp_absmax;                  // skips the statistics pass when defined
      qs.report_column_sums = gp_sums != nullptr;   // the bias gradient from the same pass
      if (gp_sums) mark_phase("g_w: quantise g~ (8-bit SR) and the bias gradient");
      const Quantized q_g = quantize(gp, qs);
      if (gp_sums) *gp_sums = q_g.column_sums;
      mark_phase("g_w: int8 product");
      const Tensor prod = int8_matmul_nt(q_g.values, xq);
      mark_phase("g_w: scale the int32 product");
      return scale_i32(prod, q_g.scale, xc.scale, mult, out);
    }
    const Quantized q_g = quantize(gp, qs);  // (B, R, O) int8, scale (B)
    mark_phase("g_w: per-sample scaled product");
    // per-sample scales: Note [Per-sample scales in one product], with mult folded into the scales
    return scaled_code_product(q_g.values, xq, mul(mul(q_g.scale, xc.scale), mult));
  }

  HlqOptions o_;
  std::string fallback_;  // of the latest forward that saved for backward (choose_axis)
};

}  // namespace

std::shared_ptr<Pipeline> make_hlq_pipeline(const HlqOptions& o) {
  return std::make_shared<HlqPipeline>(o);
}

}  // namespace ht::grad
