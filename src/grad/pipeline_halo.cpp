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
//
// Note [HALO passes over memory]
// Bytes moved per phase for bf16 x, W, g_y (T = tokens; n_I = I and n_T = T at LLaMA sizes; GEMM operand and
// output traffic in the GEMM lines). Q(·) is two passes (absmax, then quantise: the scale must be known before
// the first code; a rotated quantiser rotates in both, in shared memory, rather than storing f32 rotated values).
//   forward      Q(x·H)           read x twice, write codes          4·T·I  + T·n_I
//                Q(W·H)           read W twice, write codes          4·O·I  + O·n_I
//                Y GEMM           codes in, bf16 out                 (T+O)·n_I + 2·T·O   (int8: + 4·T·O i32 out,
//                                                                                           epilogue 4·T·O + 2·T·O)
//                save             Q(x·H)ᵀ, Q(W·H)ᵀ byte transposes   2·T·n_I + 2·O·n_I
//   backward 0/1 Q(g_y)           two passes                         4·T·O + T·O
//                Q(g_y)ᵀ          written by Q(g_y)'s second pass     T·O   (halo_quantize_transposed)
//                g_x, g_w GEMMs   bf16 out                           2·T·n_I, 2·O·n_I (+ operands)
//                rotate back      level 1 only, one pass each        2·T·(n_I + I), 2·O·(n_I + I)
//   backward 2   g_yᵀ             bf16 transpose (both level-2 quantisers read g_y along T)   4·T·O
//                Q(g_yᵀ), Q(g_yᵀ·H_T) paired: two passes for both      4·T·O + T·O + O·n_T
//                (Note [HALO paired quantiser]; unpaired when only one gradient is wanted: 4·T·O more)
//                g_w GEMM, rotate back as level 1
//                its transpose    bytes                              2·O·n_T
//                g_x GEMM (n_I, n_T), rotate back along T, bf16 transpose, rotate back along I:
//                                                                    2·n_I·n_T + 2·n_I·(n_T + T) + 4·T·n_I + 2·T·(n_I + I)
// Llama-3-8B up_proj at 8192 tokens (T·I = 33.5 M, T·O = 117 M, O·I = 58.7 M elements): about 0.65 GB outside the
// GEMMs in the forward, 0.8 / 1.2 / 2.0 GB in the level-0 / 1 / 2 backward, i.e. 0.2 and 0.25 / 0.37 / 0.65 ms at
// 3.2 TB/s. Whether the row kernels (cuda/kernels/halo_fast.cu) reach that rate is measured, not assumed:
// bench_halo's HT_BENCH_PHASES=1 prints each phase's time (the phase names are the halo_phase marks below) and
// HT_BENCH_KERNELS=1 each kernel's GB/s.
//
// Note [HALO's fp8 accumulation]
// The fp8 carrier's three products sum with the tensor cores' fast accumulation by default (`fp8_accumulation:
// fast`, the reference's FP8 kernel's mode, halo.md §8), which keeps each partial sum in a narrower accumulator
// along all of K instead of promoting it to f32 every few steps (`precise`). The choice rests on three
// measurements (H200, docs/BENCHMARKS.md): per layer at Llama-3-8B shapes (8192 tokens, K up to 14336 for Y and
// g_x and 8192 for g_w), the relative error of each HALO-2 fp8 product against f64 products of the same operands
// is 3.75–3.77 % either way, fast adding at most 0.011 percentage points (bench_halo HT_BENCH_ERRORS=1, Note
// [Errors per layer]): e4m3's rounding of both operands is the error, the accumulator's is not; fine-tuning the
// SOTU model on Moby Dick at levels 0, 1 and 2, full and LoRA, two seeds, every fast run's validation loss is
// within 0.016 % of the precise run's, on either side (a repeat of one run moves by as much: the LLaMA step is not
// bitwise reproducible on CUDA); and fast makes the three GEMMs 3–10 % faster, the layer up to 6 % (two calls).
// Integer operands, where the fast accumulator is exact, are HLQ's case (Note [Fast accumulation of integer
// codes]); HALO's e4m3 values are not integers, so its fast products differ from the precise ones in their low bits.
#include <atomic>

#include <fmt/format.h>

#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/grad/pipeline_halo_weight.h"
#include "hadatrain/grad/registry.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/side_branch.h"
#include "pipeline_helpers.h"
#include "pipeline_options.h"

namespace ht::grad {
namespace {

HaloPhaseHook& phase_hook() {
  static HaloPhaseHook hook;
  return hook;
}

std::atomic<int64_t> g_frozen_weight_uses{0};  // frozen_weight_uses()

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
  int64_t kept_bytes() const override {
    if (frozen_.codes == nullptr) return 0;
    const WOperand& c = *frozen_.codes;  // the transpose shares the codes' scale
    return tensor_bytes(c.q.v) + tensor_bytes(c.q.scale) + tensor_bytes(c.t.v);
  }

  ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey&,
                        SaveForBackward save) override {
    const int64_t B = x.size(0), L = x.size(1), I = x.size(2), O = w.size(0), T = B * L;
    const HaloRotation rot_in = in_rotation(I);
    note_padding(I, T);
    const std::shared_ptr<XOperand> sx = x_operand(reshape(x, {T, I}), rot_in);
    const Operand& qx = sx->q;  // (T, n_I)
    const std::shared_ptr<WOperand> sw = weight_operand(w, rot_in, info.w_grad);
    const Operand& qw = sw->q;  // (O, n_I)
    // Note [What a product keeps] (grad/pipeline.h): Q(x·H̃)ᵀ only for g_w, Q(W·H̃)ᵀ only for g_x (LoRA's frozen base
    // keeps only the latter); one made already (shared with other products, Note [Shared product inputs], or a
    // frozen weight's, Note [HALO's frozen weight codes]) is not made again, and counts in the product that made it.
    const bool save_yes = save == SaveForBackward::yes;
    const bool make_xt = save_yes && info.w_grad && !sx->t.v.defined();
    const bool make_wt = save_yes && info.x_grad && !sw->t.v.defined();
    auto make_transposes = [&] {
      halo_phase("fwd save Q(x·H)ᵀ, Q(W·H)ᵀ (transposes)");
      if (make_xt) sx->t = qx.transposed();
      if (make_wt) sw->t = qw.transposed();
    };
    // Note [HALO's saved transposes]: they read only the codes, so on CUDA they run on a side stream beside the y
    // GEMM (`overlap`; phase marks keep one stream); the same bytes either way.
    SideBranch side(x.device(), o_.overlap && (make_xt || make_wt) && !halo_phases_marked());
    if (side.concurrent()) side.run(make_transposes);
    halo_phase("fwd y GEMM");
    Tensor y = product(qx, qw, inverse_size(rot_in), x.dtype());  // (T, O)
    if (info.bias.defined()) {
      halo_phase("fwd bias");
      y = add(y, info.bias);
    }
    if (save_yes && !side.concurrent()) make_transposes();
    side.join({make_xt ? sx->t.v : Tensor{}, make_wt ? sw->t.v : Tensor{}});
    ForwardResult r;
    r.y = reshape(y, {B, L, O});
    if (save_yes) {
      auto s = std::make_unique<HaloSaved>();
      if (info.w_grad) s->xt = sx->t;
      if (make_xt) s->bytes = tensor_bytes(sx->t.v);
      if (info.x_grad) s->wt = sw->t;
      s->B = B, s->L = L, s->I = I, s->O = O;
      s->x_dtype = x.dtype();
      s->w_dtype = w.dtype();
      r.saved = std::move(s);
    }
    halo_phase("end");
    return r;
  }

  Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) override {
    auto& s = static_cast<HaloSaved&>(saved);
    HT_ASSERT((!wanted.w || s.xt.v.defined()) && (!wanted.x || s.wt.v.defined()),
              "halo: backward asked for a gradient its forward was told it would not need");
    const int64_t T = s.B * s.L;
    const HaloRotation rot_in = in_rotation(s.I);
    const Tensor e = reshape(g_y, {T, s.O});  // (T, O)
    Grads g;
    // Note [HALO's two chains]: after the quantisation of g_y that both products share, g_w's chain (its GEMM and
    // rotation back) reads nothing of g_x's, so on CUDA it runs on a side stream beside g_x's chain (Note [Side
    // branches] in tensor/side_branch.h; the same values). The fork comes after that quantisation: the side stream
    // waits only for work queued before it. Phase marks and `overlap: false` keep one stream.
    const bool overlap = o_.overlap && wanted.x && wanted.w && !halo_phases_marked();
    Operand qet;  // Q(g_y)ᵀ (O, T): g_w's left operand at every level
    auto run_gw = [&] {
      halo_phase("bwd g_w GEMM");
      const Tensor p = product(qet, s.xt, inverse_size(rot_in), inter(s.w_dtype));
      halo_phase("bwd g_w rotate back");
      g.w = rotate_back(p, rot_in, s.I, s.w_dtype);
    };
    if (o_.level < 2) {
      // one quantisation for both products: (T, O) for g_x and, when g_w is wanted, its codes transposed (O, T)
      // from the same pass (halo_quantize_transposed)
      Operand qe;
      if (o_.quantize && wanted.w) {
        halo_phase("bwd Q(g_y) and Q(g_y)ᵀ");
        auto [q, t] = halo_quantize_transposed(e, o_.carrier);
        qe = {q.codes, q.scale};
        qet = {t, q.scale};
      } else {
        halo_phase("bwd Q(g_y)");
        qe = prepare(e, {});
        if (wanted.w) qet = qe.transposed();
      }
      SideBranch side(g_y.device(), overlap);
      if (wanted.w && side.concurrent()) side.run(run_gw);
      if (wanted.x) {
        halo_phase("bwd g_x GEMM");
        const Tensor p = product(qe, s.wt, inverse_size(rot_in), inter(s.x_dtype));
        halo_phase("bwd g_x rotate back");
        g.x = rotate_back(p, rot_in, s.I, s.x_dtype);
      }
      if (wanted.w && !side.concurrent()) run_gw();
      side.join({g.w});
    } else {
      halo_phase("bwd g_yᵀ (bf16 transpose)");
      const Tensor et = halo_transpose(e);  // (O, T): both level-2 quantisations read g_y along T
      const HaloRotation rot_t = halo_rotation_size(T);
      Operand qrt;  // Q(g_yᵀ·H̃_T) (O, n_T)
      if (o_.quantize && wanted.w && wanted.x) {
        halo_phase("bwd Q(g_yᵀ) and Q(g_yᵀ·H_T) (paired)");
        auto [rotated, plain] = halo_quantize_pair(et, o_.carrier, rot_t);
        qet = {plain.codes, plain.scale};
        qrt = {rotated.codes, rotated.scale};
      } else {
        if (wanted.w) {
          halo_phase("bwd Q(g_yᵀ)");
          qet = prepare(et, {});
        }
        if (wanted.x) {
          halo_phase("bwd Q(g_yᵀ·H_T)");
          qrt = prepare(et, rot_t);
        }
      }
      SideBranch side(g_y.device(), overlap);
      if (wanted.w) side.run(run_gw);  // in place when not concurrent: g_w first, as on one stream
      if (wanted.x) {
        halo_phase("bwd Q(g_yᵀ·H_T)ᵀ (transpose)");
        const Operand qr = qrt.transposed();  // (n_T, O): Q(H̃_Tᵀ·g_y)
        const float mult = static_cast<float>(1.0 / (static_cast<double>(rot_in.n) * static_cast<double>(rot_t.n)));
        halo_phase("bwd g_x GEMM");
        const Tensor m = product(s.wt, qr, mult, inter(s.x_dtype));  // (n_I, n_T)
        halo_phase("bwd g_x rotate back along T");
        const Tensor mr = rotate_back(m, rot_t, T, inter(s.x_dtype));
        halo_phase("bwd g_x transpose");
        const Tensor mt = halo_transpose(mr);  // (T, n_I)
        halo_phase("bwd g_x rotate back along in");
        g.x = rotate_back(mt, rot_in, s.I, s.x_dtype);
      }
      side.join({g.w});
    }
    halo_phase("end");
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

  // Q(x·H̃) of x (T, I) and, once a product asks for it, its codes transposed: shared with the products that read
  // the same x inside a SharedInputScope (Note [Shared product inputs] in grad/pipeline.h; the key holds what
  // the operand depends on: quantised or not, the carrier and the rotation), else this product's own.
  struct XOperand {
    Operand q;  // (T, n_I)
    Operand t;  // (n_I, T), undefined until a product keeps it for g_w
  };
  std::shared_ptr<XOperand> x_operand(const Tensor& x2, HaloRotation rot) const {
    std::shared_ptr<void>* slot = shared_input_slot(
        x2, fmt::format("halo {} {}x{}", !o_.quantize ? "f32" : o_.carrier == Carrier::int8 ? "int8" : "fp8", rot.n,
                        rot.k));
    if (slot != nullptr && *slot != nullptr) {
      halo_phase("fwd Q(x·H) shared");
      return std::static_pointer_cast<XOperand>(*slot);
    }
    halo_phase("fwd Q(x·H)");
    auto sx = std::make_shared<XOperand>();
    sx->q = prepare(x2, rot);
    if (slot != nullptr) *slot = sx;
    return sx;
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

  // Q(W·H̃) of W (O, I) and, once a product keeps it for g_x, its codes transposed.
  struct WOperand {
    Operand q;  // (O, n_I)
    Operand t;  // (n_I, O), undefined until a product keeps it
  };

  // Note [HALO's frozen weight codes]
  // A weight that needs no gradient (LoRA's frozen base, a frozen layer) has the same Q(W·H̃) in every forward while
  // its values do not change, so with `cache_frozen_weight` (the default) the pipeline keeps the codes it made, and
  // the transpose a g_x product keeps, and hands them to later forwards instead of quantising W again (phase mark
  // "fwd Q(W·H) cached").
  // - Which products: those told they will not be asked for g_w (ProductInfo::w_grad false: the product op sets it
  //   from the weight's edge) of a weight that does not require grad. Code that runs a pipeline's backward itself
  //   (the benchmarks, inspect-grads) keeps ProductInfo's default and quantises W in every forward, as training W
  //   would.
  // - When: from the second forward that sees the weight unchanged on. A weight refilled before every forward
  //   (FSDP's gathered weights, whose gathers raise the version) is never kept, so a sharded model's layers do not
  //   all hold codes at once.
  // - Unchanged: the same storage (held weakly: a weight that is gone is never matched), offset, shape, strides,
  //   dtype and storage version (Note [Storage versions] in tensor/allocator.h). copy_, fill_, add_ and mul_ into
  //   the weight (a checkpoint load, a LoRA merge) raise the version, and so do FSDP's gathers. A weight that
  //   requires grad drops the entry and is never kept: its optimiser writes it every step.
  // - Cost: the codes' memory for as long as the pipeline lives, one byte per element of W, two with the transpose
  //   (which LoRA kept from each forward to its backward anyway).
  struct FrozenWeight {  // the weight last seen, and its codes once it was seen unchanged twice
    std::weak_ptr<StorageImpl> storage;
    int64_t offset = 0;
    Shape shape;
    Strides strides;
    DType dtype = DType::f32;
    uint64_t version = 0;
    std::shared_ptr<WOperand> codes;
  };
  FrozenWeight frozen_;

  bool frozen_seen(const Tensor& w) const {
    return frozen_.storage.lock() == w.storage() && frozen_.offset == w.offset() &&
           frozen_.shape == w.shape() && frozen_.strides == w.strides() && frozen_.dtype == w.dtype() &&
           frozen_.version == storage_version(w);
  }

  // Q(W·H̃) (O, n_I): the codes and scale of FSDP's 8-bit all-gather when they are attached to w and are this
  // level's (W rotated: 1 or 2) in this carrier (grad/pipeline_halo_weight.h); a frozen weight's cached codes
  // (Note [HALO's frozen weight codes]); else quantised here.
  std::shared_ptr<WOperand> weight_operand(const Tensor& w, HaloRotation rot, bool w_grad) {
    if (o_.quantize && o_.level >= 1)
      if (const auto g = gathered_weight(w);
          g && g->carrier == o_.carrier && g->rotation.n == rot.n && g->rotation.k == rot.k && g->cols == w.size(1)) {
        halo_phase("fwd Q(W·H) from the 8-bit gather");
        note_gathered_weight_use();
        return std::make_shared<WOperand>(WOperand{{g->codes, g->scale}, {}});
      }
    if (w.requires_grad()) frozen_ = {};
    const bool cache =
        o_.quantize && o_.cache_frozen_weight && !w_grad && !w.requires_grad() && w.storage() != nullptr;
    const bool seen = cache && frozen_seen(w);
    if (seen && frozen_.codes != nullptr) {
      halo_phase("fwd Q(W·H) cached");
      g_frozen_weight_uses.fetch_add(1);
      return frozen_.codes;
    }
    halo_phase("fwd Q(W·H)");
    auto sw = std::make_shared<WOperand>(WOperand{prepare(w, rot), {}});
    if (cache)  // kept from the second forward that sees the weight unchanged on
      frozen_ = {w.storage(), w.offset(), w.shape(), w.strides(), w.dtype(), storage_version(w), seen ? sw : nullptr};
    return sw;
  }

  // (M, N) of `out` = mult·(a·bᵀ) with a's and b's scales.
  Tensor product(const Operand& a, const Operand& b, float mult, DType out) const {
    if (o_.quantize) return halo_product(a.v, b.v, a.scale, b.scale, {mult, out, o_.fp8_accumulation});
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
  o.overlap = r.get("overlap", true);
  o.fp8_accumulation = read_fp8_accumulation(r, o.carrier);
  o.cache_frozen_weight = r.get("cache_frozen_weight", true);
  return o;
}

std::string describe_halo(const HaloOptions& o) {
  return fmt::format("halo (level {}, {}{}{}{}{}; forward quantised)", o.level,
                     o.carrier == Carrier::fp8 ? "fp8 e4m3" : "int8",
                     o.carrier == Carrier::fp8 && o.fp8_accumulation == Fp8Accumulation::precise
                         ? ", precise accumulation"
                         : "",
                     o.quantize ? "" : ", quantisation off", o.overlap ? "" : ", one stream",
                     o.cache_frozen_weight ? "" : ", frozen weights quantised every forward");
}

}  // namespace

void set_halo_phase_hook(HaloPhaseHook hook) { phase_hook() = std::move(hook); }

void halo_phase(const char* phase) {
  if (const HaloPhaseHook& h = phase_hook()) h(phase);
}

bool halo_phases_marked() { return static_cast<bool>(phase_hook()); }

int64_t frozen_weight_uses() { return g_frozen_weight_uses.load(); }

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
