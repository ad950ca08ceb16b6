// The `lbp_wht` baseline (hlq.md §11; Yang et al., NeurIPS 2023): the token axis is laid out on its H×W
// grid, zero-padded to multiples of 8 and cut into 8×8 patches; each patch keeps the k(k+1)/2 lowest 2-D
// sequency Walsh coefficients (u + v < k). The forward saves the coefficients of x (r/64 of x); backward
// projects g_y the same way (mean over the patch), then
//   g_w = Σ_{p,b} g_p,bᵀ·x_p,b      g_x,t = Σ_b b(t)·(g_p(t),b·W)   (back-projection).
// All 64 bases (order >= 15) give exact gradients: the bases are orthogonal with Σ_b b bᵀ = 64·I.
// Leading tokens outside the grid (a class token) take the exact path. Layers without a grid (a 2-D
// Linear input, lengths that are not a square) run exact (Pipeline::fallback: named in one line at start-up).
// Deviation: the reference reflect-pads; we zero-pad both operands, which keeps the full-basis case exact
// and is defined for maps smaller than the padding (a 4×4 map). Shapes: x (B, L, I), w (O, I), g_y (B, L, O).
#include <cmath>
#include <mutex>

#include <fmt/format.h>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/core/config_reader.h"
#include "hadatrain/core/error.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/grad/pipeline_lbp_wht.h"
#include "hadatrain/grad/registry.h"
#include "pipeline_helpers.h"

namespace ht::grad {
namespace {

constexpr int64_t kPatch = 8;

// Sequency-ordered 8-point Walsh function u at position i: row bitrev3(u ^ (u >> 1)) of H_8.
int walsh8(int u, int i) {
  const int g = u ^ (u >> 1);
  const int h = ((g & 1) << 2) | (g & 2) | ((g >> 2) & 1);  // bit-reverse of 3 bits
  return (__builtin_popcount(h & i) & 1) ? -1 : 1;
}

// How many (u, v) with u, v < 8 have u + v < order: k(k+1)/2 up to order 8, all 64 at order 15.
int64_t kept_bases(int64_t order) {
  int64_t n = 0;
  for (int u = 0; u < kPatch; ++u)
    for (int v = 0; v < kPatch; ++v) n += u + v < order ? 1 : 0;
  return n;
}

// (r, 64) f32 basis of the kept (u, v), u + v < order, ordered by (u + v, u): r = kept_bases(order).
Tensor basis(int64_t order, Device device) {
  std::vector<float> rows;
  int64_t r = 0;
  for (int d = 0; d < 15; ++d)
    for (int u = 0; u <= d; ++u) {
      const int v = d - u;
      if (u >= kPatch || v >= kPatch || d >= order) continue;
      for (int i = 0; i < kPatch; ++i)
        for (int j = 0; j < kPatch; ++j) rows.push_back(static_cast<float>(walsh8(u, i) * walsh8(v, j)));
      ++r;
    }
  return from_vector(rows, {r, kPatch * kPatch}).to(device);
}

struct Grid {
  int64_t extra = 0, h = 0, w = 0;
  bool valid() const { return h > 0; }
};

// (B, L_grid, C) on an h×w grid -> (64, B·P·C): the zero-padded grid cut into 8×8 patches, patch position
// first, so that projecting every patch onto the bases is one (r, 64)·(64, B·P·C) product.
Tensor to_patches(const Tensor& t, const Grid& g) {
  const int64_t B = t.size(0), C = t.size(2);
  const int64_t hp = (g.h + kPatch - 1) / kPatch * kPatch, wp = (g.w + kPatch - 1) / kPatch * kPatch;
  Tensor m = reshape(t, {B, g.h, g.w, C});
  if (hp > g.h) m = cat({m, zeros({B, hp - g.h, g.w, C}, {t.dtype(), t.device()})}, 1);
  if (wp > g.w) m = cat({m, zeros({B, hp, wp - g.w, C}, {t.dtype(), t.device()})}, 2);
  m = reshape(m, {B, hp / kPatch, kPatch, wp / kPatch, kPatch, C});
  m = permute(m, {2, 4, 0, 1, 3, 5});  // (8, 8, B, Ph, Pw, C)
  return reshape(m, {kPatch * kPatch, -1});
}

// Inverse of to_patches: (64, B·P·C) -> (B, h·w, C), cropping the padding.
Tensor from_patches(const Tensor& p, const Grid& g, int64_t B, int64_t C) {
  const int64_t hp = (g.h + kPatch - 1) / kPatch * kPatch, wp = (g.w + kPatch - 1) / kPatch * kPatch;
  Tensor m = reshape(p, {kPatch, kPatch, B, hp / kPatch, wp / kPatch, C});
  m = reshape(permute(m, {2, 3, 0, 4, 1, 5}), {B, hp, wp, C});  // (B, Ph, 8, Pw, 8, C)
  m = narrow(narrow(m, 1, 0, g.h), 2, 0, g.w);
  return reshape(m, {B, g.h * g.w, C});
}

struct LbpSaved final : SavedState {
  Tensor w;        // (O, I)
  DType x_dtype = DType::f32;
  Grid grid;
  Tensor xp;       // (r·B·P, I) coefficients, x's dtype (a valid grid)
  SavedTensor x;   // the whole x when the layer runs exact (counted: Note [Shared saved inputs])
  Tensor x_extra;  // (B, E, I)
  int64_t I = 0;
};

class LbpWhtPipeline final : public Pipeline {
 public:
  explicit LbpWhtPipeline(const LbpWhtOptions& o) : o_(o) {
    HT_CHECK(o.order >= 1 && o.order <= 15, "lbp_wht: order must be 1..15 (15 keeps all 64 bases), got {}",
             o.order);
    HT_CHECK(o.extra_tokens >= -1, "lbp_wht: extra_tokens must be >= 0 (or -1 for automatic), got {}",
             o.extra_tokens);
  }
  std::string name() const override { return "lbp_wht"; }
  std::string fallback() const override { return fallback_; }

  ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey&,
                        SaveForBackward save) override {
    ForwardResult r;
    r.y = forward_product(x, w, info);
    if (save == SaveForBackward::yes) r.saved = save_state(x, w, info);
    return r;
  }

  // A conv product: y is the convolution itself (no GEMM over the columns); the saved x are the columns.
  ForwardResult forward_conv(const Tensor& w, const ProductInfo& info, const NoiseKey&, SaveForBackward save) override {
    ForwardResult r;
    r.y = conv_forward_product(info, w);
    if (save == SaveForBackward::yes) r.saved = save_state(unfold2d(info.image, info.window), w, info);
    return r;
  }

  Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) override {
    auto& s = static_cast<LbpSaved&>(saved);
    Grads g;
    if (!s.grid.valid()) {
      if (wanted.x) g.x = exact_grad_x(g_y, s.w);
      if (wanted.w) g.w = exact_grad_w(g_y, s.x.get());
      return g;
    }
    const int64_t B = g_y.size(0), L = g_y.size(1), O = g_y.size(2), E = s.grid.extra, I = s.I;
    // Note [LBP-WHT products]: the two large products (g_w, and g_p·W for g_x) run in the compute dtype with fp32
    // accumulation and f32 results (matmul_f32: tensor cores for bf16), as exact's do; g_p is rounded once to the
    // compute dtype (f32 products made a ViT-S/4 step four times slower than exact's).
    const DType dt = g_y.dtype();
    const Tensor bm = basis_on(g_y.device());  // (r, 64) f32, ±1
    // g_p (r·B·P, O): the patch means of g_y on every kept basis, one product over all patches (÷ 64 is exact).
    const Tensor gp = reshape(div(matmul(bm.to(dt), to_patches(narrow(g_y, 1, E, L - E), s.grid)), 64.0), {-1, O});
    if (wanted.w) {
      Tensor gw = matmul_f32(gp.transpose(0, 1), s.xp.to(dt));  // Σ_{p,b} g_p,bᵀ·x_p,b (O, I)
      if (E > 0) gw = add(gw, exact_grad_w(narrow(g_y, 1, 0, E).to(DType::f32), s.x_extra.to(DType::f32)));
      g.w = gw.to(s.w.dtype());
    }
    if (wanted.x) {
      const int64_t r = bm.size(0);
      const Tensor w = s.w.to(dt);
      const Tensor h = reshape(matmul_f32(gp, w), {r, -1});            // (r, B·P·I) f32: g_p,b·W
      const Tensor back = matmul(bm.transpose(0, 1), h);              // (64, B·P·I): Σ_b b(t)·(g_p,b·W)
      Tensor gx = from_patches(back, s.grid, B, I);                    // (B, h·w, I)
      if (E > 0) gx = cat({exact_grad_x(narrow(g_y, 1, 0, E).to(DType::f32), s.w.to(DType::f32)), gx}, 1);
      g.x = gx.to(s.x_dtype);
    }
    return g;
  }

 private:
  std::unique_ptr<SavedState> save_state(const Tensor& x, const Tensor& w, const ProductInfo& info) {
    auto s = std::make_unique<LbpSaved>();
    s->w = w;
    s->x_dtype = x.dtype();
    s->grid = grid_of(x.size(1), info);
    s->I = x.size(2);
    if (!info.w_grad) return s;  // x serves g_w only (Note [What a product keeps] in grad/pipeline.h)
    if (!s->grid.valid()) {
      s->x = SavedTensor(x);  // exact fallback
      s->bytes = tensor_bytes(x);
      return s;
    }
    const int64_t E = s->grid.extra, L = x.size(1);
    if (E > 0) s->x_extra = narrow(x, 1, 0, E).contiguous();
    const Tensor patches = to_patches(narrow(x, 1, E, L - E), s->grid);  // (64, B·P·I), x's dtype
    // (r, B·P·I): fp32 accumulation rounded once to x's dtype (the product's own epilogue, no f32 pass)
    const Tensor coef = matmul(basis_on(x.device()).to(x.dtype()), patches);
    s->xp = reshape(coef, {-1, x.size(2)});  // (r·B·P, I)
    s->bytes = tensor_bytes(s->xp) + tensor_bytes(s->x_extra);
    return s;
  }

  Grid grid_of(int64_t L, const ProductInfo& info) {
    Grid g;
    fallback_.clear();
    if (info.grid_h > 0 && info.grid_w > 0) {
      g.h = info.grid_h;
      g.w = info.grid_w;
      g.extra = L - g.h * g.w;
      HT_CHECK(g.extra >= 0, "lbp_wht: grid {}x{} has more positions than the {} tokens", g.h, g.w, L);
      return g;
    }
    if (!info.batch_rows) {
      const auto square = [](int64_t n) {
        const auto s = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
        return n > 0 && s * s == n ? s : int64_t{0};
      };
      const std::vector<int64_t> extras = o_.extra_tokens >= 0 ? std::vector<int64_t>{o_.extra_tokens}
                                                               : std::vector<int64_t>{0, 1};
      for (int64_t e : extras)
        if (const int64_t side = square(L - e); side > 0) {
          g.extra = e;
          g.h = g.w = side;
          return g;
        }
    }
    fallback_ = fmt::format("runs exact: {} rows have no token grid ({})", L,
                            info.batch_rows ? "a 2-D input: rows are samples" : "not a square (plus extra tokens)");
    return g;
  }

  // The (r, 64) basis on `device`, built on the host once and kept: a host-to-device copy in every step would
  // also stop the step from being recorded into a CUDA step graph (Note [Step graphs]).
  Tensor basis_on(Device device) {
    std::lock_guard<std::mutex> lock(basis_mu_);
    if (!basis_.defined() || basis_.device() != device) basis_ = basis(o_.order, device);
    return basis_;
  }

  LbpWhtOptions o_;
  std::string fallback_;  // of the latest forward that saved for backward (grid_of)
  std::mutex basis_mu_;
  Tensor basis_;
};

}  // namespace

std::shared_ptr<Pipeline> make_lbp_wht_pipeline(const LbpWhtOptions& o) {
  return std::make_shared<LbpWhtPipeline>(o);
}

// Called once by the registry (Note [Registration and static linking] in grad/registry.h).
HT_BUILTIN_PIPELINE(lbp_wht) {
  return erase(PipelineKind<LbpWhtOptions>{
      .name = "lbp_wht",
      .read_options =
          [](ConfigReader& r) {
            LbpWhtOptions o;
            o.order = r.get<int64_t>("order", 6, Range::closed(1, 15));
            o.extra_tokens = r.get<int64_t>("extra_tokens", -1, Range::at_least(-1));
            return o;
          },
      .make = make_lbp_wht_pipeline,
      .describe =
          [](const LbpWhtOptions& o) {
            return fmt::format("lbp_wht (order {}, {} of 64 bases)", o.order, kept_bases(o.order));
          }});
}

}  // namespace ht::grad
