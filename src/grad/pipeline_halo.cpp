// The `halo` pipeline (grad/pipeline_halo.h; specification reference/halo.md §2; docs/gradient_pipelines.md):
// the forward product and both backward products of a Linear on 8-bit operands with per-tensor absmax scales,
// after the rotations of its level. Geometry: x (B, L, I) is seen as T = B·L rows (the token dimension of
// level 2's left rotation), W (O, I), g_y (T, O).
//
//   forward    y   = [Q(x·H̃)·Q(W·H̃)ᵀ] / n_I                          (level 0: no H̃, no 1/n)
//   backward   g_x = [Q(g_y)·Q(W·H̃)] · H̃ᵀ / n_I                       (level 0, 1)
//              g_x = H̃_T·[Q(H̃_Tᵀ·g_y)·Q(W·H̃)]·H̃ᵀ / (n_T·n_I)        (level 2, computed transposed: below)
//              g_w = [Q(g_y)ᵀ·Q(x·H̃)] · H̃ᵀ / n_I                      (every level; level 0 without H̃)
// H̃ are the unnormalised rotations of Note [HALO rotations] (sizes n_I >= I and n_T >= T, zero-padded and
// cropped), 1/n folded into each product's scale. Every product is an "NT" 8-bit GEMM (both operands
// contiguous along the contracted dimension, the cuBLASLt fp8 layout), so the forward keeps Q(x·H̃) as (n_I, T)
// and Q(W·H̃) as (n_I, O) byte transposes of the codes it multiplied (one quantisation each, reused by
// backward: the 8-bit tensors are all it saves). Level 2's g_x:
//   Ẽ = Q(g_yᵀ rotated along T) (O, n_T), transposed to (n_T, O);
//   M = [Q(W·H̃)ᵀ·Ẽᵀ] / (n_I·n_T)  (n_I, n_T) = H̃_Iᵀ·Wᵀ·g_yᵀ·H̃_T / (n_I·n_T);
//   g_x = ((M·H̃_Tᵀ) cropped to T columns)ᵀ · H̃_Iᵀ cropped to I columns.
// Each GEMM rounds once to x's dtype (bf16 in a bf16 model, as the reference's BF16 outputs) before the rotation
// back. The bias stays outside: product() sums g_y for it; the forward adds it after the product.
#include <fmt/format.h>

#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/grad/registry.h"
#include "hadatrain/ops/ops.h"
#include "pipeline_helpers.h"
#include "pipeline_options.h"

namespace ht::grad {
namespace {

// One operand of a product: 8-bit codes and their scale, or (quantize: false) f32 values and no scale.
struct Operand {
  Tensor v;      // (rows, K), contiguous
  Tensor scale;  // f32 (1), or undefined
  Operand transposed() const { return {halo_transpose(v), scale}; }
};

struct HaloSaved final : SavedState {
  Operand xt;  // (n_I, T): Q(x·H̃)ᵀ, the g_w product's operand
  Operand wt;  // (n_I, O): Q(W·H̃)ᵀ, the g_x product's operand
  int64_t B = 0, L = 0, I = 0, O = 0;
  DType x_dtype = DType::f32, w_dtype = DType::f32;
};

class HaloPipeline final : public Pipeline {
 public:
  explicit HaloPipeline(const HaloOptions& o) : o_(o) {}
  std::string name() const override { return "halo"; }
  bool exact_forward() const override { return false; }
  std::string fallback() const override { return fallback_; }

  ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey&,
                        SaveForBackward save) override {
    const int64_t B = x.size(0), L = x.size(1), I = x.size(2), O = w.size(0), T = B * L;
    const HaloRotation rot_in = in_rotation(I);
    note_padding(I, T);
    const Operand qx = prepare(reshape(x, {T, I}), rot_in);  // (T, n_I)
    const Operand qw = prepare(w, rot_in);                   // (O, n_I)
    Tensor y = product(qx, qw, inverse_size(rot_in), x.dtype());  // (T, O)
    if (info.bias.defined()) y = add(y, info.bias);
    ForwardResult r;
    r.y = reshape(y, {B, L, O});
    if (save == SaveForBackward::yes) {
      auto s = std::make_unique<HaloSaved>();
      s->xt = qx.transposed();
      s->wt = qw.transposed();
      s->B = B, s->L = L, s->I = I, s->O = O;
      s->x_dtype = x.dtype();
      s->w_dtype = w.dtype();
      s->bytes = tensor_bytes(s->xt.v);
      r.saved = std::move(s);
    }
    return r;
  }

  Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) override {
    auto& s = static_cast<HaloSaved&>(saved);
    const int64_t T = s.B * s.L;
    const HaloRotation rot_in = in_rotation(s.I);
    const Tensor e = reshape(g_y, {T, s.O});  // (T, O)
    Grads g;
    if (o_.level < 2) {
      const Operand qe = prepare(e, {});  // (T, O), one quantisation for both products
      if (wanted.x) g.x = rotate_back(product(qe, s.wt, inverse_size(rot_in), inter(s.x_dtype)), rot_in, s.I, s.x_dtype);
      if (wanted.w)
        g.w = rotate_back(product(qe.transposed(), s.xt, inverse_size(rot_in), inter(s.w_dtype)), rot_in, s.I,
                          s.w_dtype);
    } else {
      const Tensor et = halo_transpose(e);  // (O, T): both level-2 quantisations read g_y along T
      if (wanted.w)
        g.w = rotate_back(product(prepare(et, {}), s.xt, inverse_size(rot_in), inter(s.w_dtype)), rot_in, s.I,
                          s.w_dtype);
      if (wanted.x) {
        const HaloRotation rot_t = halo_rotation_size(T);
        const Operand qr = prepare(et, rot_t).transposed();  // (n_T, O): Q(H̃_Tᵀ·g_y)
        const float mult = static_cast<float>(1.0 / (static_cast<double>(rot_in.n) * static_cast<double>(rot_t.n)));
        const Tensor m = product(s.wt, qr, mult, inter(s.x_dtype));  // (n_I, n_T)
        const Tensor mt = halo_transpose(rotate_back(m, rot_t, T, inter(s.x_dtype)));  // (T, n_I)
        g.x = rotate_back(mt, rot_in, s.I, s.x_dtype);
      }
    }
    if (g.x.defined()) g.x = reshape(g.x, {s.B, s.L, s.I});
    return g;
  }

 private:
  HaloOptions o_;
  std::string fallback_;

  HaloRotation in_rotation(int64_t I) const { return o_.level >= 1 ? halo_rotation_size(I) : HaloRotation{}; }
  static float inverse_size(HaloRotation r) { return static_cast<float>(1.0 / static_cast<double>(r.n)); }
  // The dtype a GEMM rounds to before its rotation back: the gradient's dtype, f32 without quantisation.
  DType inter(DType out) const { return o_.quantize ? out : DType::f32; }

  void note_padding(int64_t I, int64_t T) {
    std::string why;
    if (o_.level >= 1 && halo_rotation_size(I).n != I)
      why = fmt::format("in = {} rotated at {} (zero-padded)", I, halo_rotation_size(I).n);
    if (o_.level == 2 && halo_rotation_size(T).n != T)
      why += fmt::format("{}{} tokens rotated at {} (zero-padded)", why.empty() ? "" : "; ", T, halo_rotation_size(T).n);
    fallback_ = why;
  }

  // x (R, C) quantised (or, without quantisation, as f32), rotated at `rot` when rot.n > 1: (R, n or C).
  Operand prepare(const Tensor& x, HaloRotation rot) const {
    if (o_.quantize) {
      HaloQuantized q = halo_quantize(x, o_.carrier, rot);
      return {q.codes, q.scale};
    }
    if (rot.n > 1) return {halo_rotate(x, {rot, HaloDirection::forward, rot.n, 1.0f, DType::f32}), {}};
    return {x.to(DType::f32).contiguous(), {}};
  }

  // (M, N) of `out` = mult·(a·bᵀ) with a's and b's scales.
  Tensor product(const Operand& a, const Operand& b, float mult, DType out) const {
    if (o_.quantize) return halo_product(a.v, b.v, a.scale, b.scale, {mult, out});
    return mul(matmul_f32(a.v, b.v.transpose(0, 1)), static_cast<double>(mult)).to(out);
  }

  // m (R, n) rotated back (·H̃ᵀ) and cropped to `cols`, as `out`; no rotation: m as `out`.
  static Tensor rotate_back(const Tensor& m, HaloRotation rot, int64_t cols, DType out) {
    if (rot.n <= 1) return m.to(out);
    return halo_rotate(m, {rot, HaloDirection::inverse, cols, 1.0f, out});
  }
};

HaloOptions read_halo(ConfigReader& r) {
  HaloOptions o;
  o.level = static_cast<int>(r.get<int64_t>("level", 2, Range::closed(0, 2)));
  o.carrier = r.get_choice("carrier", Carrier::int8, {{"int8", Carrier::int8}, {"fp8", Carrier::fp8}});
  o.quantize = r.get("quantize", true);
  return o;
}

std::string describe_halo(const HaloOptions& o) {
  return fmt::format("halo (level {}, {}{}; forward quantised)", o.level, o.carrier == Carrier::fp8 ? "fp8 e4m3" : "int8",
                     o.quantize ? "" : ", quantisation off");
}

}  // namespace

std::shared_ptr<Pipeline> make_halo_pipeline(const HaloOptions& o) {
  HT_CHECK(o.level >= 0 && o.level <= 2, "halo: level must be 0, 1 or 2, got {}", o.level);
  return std::make_shared<HaloPipeline>(o);
}

// Called once by the registry (Note [Registration and static linking] in grad/registry.h).
HT_BUILTIN_PIPELINE(halo) {
  return erase(PipelineKind<HaloOptions>{.name = "halo", .read_options = read_halo, .make = make_halo_pipeline,
                                         .describe = describe_halo});
}

}  // namespace ht::grad
