// conv2d: x (N, C, H, W) * weight (O, C/groups, KH, KW) [+ bias (O)] -> (N, O, OH, OW), with stride, zero
// padding, dilation and groups, where OH = (H + 2·pad_h - dilation_h·(KH - 1) - 1) / stride_h + 1 (same for W).
// CPU path per chunk of samples and group: col = im2col(x) (C/g·KH·KW, S·OH·OW) with the chunk's S samples
// side by side, then out = W_g (O/g, C/g·KH·KW) · col through the GEMM helper (one large product per chunk),
// with the bias pre-loaded into the output. Backward, with the same chunks:
//   grad input  = col2im(W_gᵀ · g)          (overlapping windows summed in fp32 / fp64)
//   grad weight = sum over chunks of g · colᵀ  (accumulated in fp32 / fp64, rounded once)
//   grad bias   = sum of g over N, OH, OW.
// Channels last (p.layout == nhwc: x (N, H, W, C) -> (N, OH, OW, O), same weight): the CPU permutes to NCHW,
// runs the path above and permutes back (the reference; autograd flows through the permutes); CUDA runs cuDNN
// on the NHWC buffers directly (cuda/glue/conv_pool_bn_glue.cpp).
#include <algorithm>
#include <memory>
#include <vector>

#include "cpu/convert.h"
#include "cpu/gemm.h"
#include "cpu/im2col.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/conv_pool_bn_glue.h"
#endif

namespace ht {
namespace {

struct ConvShapes {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input
  int64_t O = 0, KH = 0, KW = 0;       // weight
  int64_t OH = 0, OW = 0;              // output
  int64_t groups = 1, Cg = 0, Og = 0;  // channels per group
};

// Validates every shape relation and returns the sizes. Messages name the op, the tensors and the params.
ConvShapes conv_shapes(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  const bool nhwc = p.layout == ConvLayout::nhwc;
  HT_CHECK(x.dim() == 4, "conv2d: input x must be {}, got {}", nhwc ? "(N, H, W, C) (layout nhwc)" : "(N, C, H, W)",
           x.describe());
  HT_CHECK(w.dim() == 4, "conv2d: weight must be (O, C/groups, KH, KW), got {}", w.describe());
  HT_CHECK(p.stride_h >= 1 && p.stride_w >= 1, "conv2d: stride must be >= 1, got ({}, {})", p.stride_h, p.stride_w);
  HT_CHECK(p.dilation_h >= 1 && p.dilation_w >= 1, "conv2d: dilation must be >= 1, got ({}, {})", p.dilation_h,
           p.dilation_w);
  HT_CHECK(p.pad_h >= 0 && p.pad_w >= 0, "conv2d: padding must be >= 0, got ({}, {})", p.pad_h, p.pad_w);
  HT_CHECK(p.groups >= 1, "conv2d: groups must be >= 1, got {}", p.groups);
  ConvShapes s;
  s.N = x.shape()[0];
  s.C = x.shape()[nhwc ? 3 : 1];
  s.H = x.shape()[nhwc ? 1 : 2];
  s.W = x.shape()[nhwc ? 2 : 3];
  s.O = w.shape()[0];
  s.KH = w.shape()[2];
  s.KW = w.shape()[3];
  s.groups = p.groups;
  HT_CHECK(s.C % p.groups == 0, "conv2d: input channels C = {} of x {} are not divisible by groups = {}", s.C,
           x.describe(), p.groups);
  HT_CHECK(s.O % p.groups == 0, "conv2d: output channels O = {} of weight {} are not divisible by groups = {}", s.O,
           w.describe(), p.groups);
  s.Cg = s.C / p.groups;
  s.Og = s.O / p.groups;
  HT_CHECK(w.shape()[1] == s.Cg,
           "conv2d: weight {} has {} input channels per group, but x {} with groups = {} needs C/groups = {}",
           w.describe(), w.shape()[1], x.describe(), p.groups, s.Cg);
  HT_CHECK(s.KH >= 1 && s.KW >= 1, "conv2d: kernel size must be >= 1, got weight {}", w.describe());
  const int64_t eff_kh = p.dilation_h * (s.KH - 1) + 1, eff_kw = p.dilation_w * (s.KW - 1) + 1;
  const int64_t in_h = s.H + 2 * p.pad_h, in_w = s.W + 2 * p.pad_w;
  HT_CHECK(in_h >= eff_kh && in_w >= eff_kw,
           "conv2d: output size would not be positive: the dilated kernel {}x{} is larger than the padded input "
           "{}x{} (x {}, padding ({}, {}), dilation ({}, {}))",
           eff_kh, eff_kw, in_h, in_w, x.describe(), p.pad_h, p.pad_w, p.dilation_h, p.dilation_w);
  s.OH = (in_h - eff_kh) / p.stride_h + 1;
  s.OW = (in_w - eff_kw) / p.stride_w + 1;
  if (bias.defined())
    HT_CHECK(bias.dim() == 1 && bias.shape()[0] == s.O, "conv2d: bias must be (O) = ({}) for weight {}, got {}", s.O,
             w.describe(), bias.describe());
  HT_CHECK(x.dtype() == w.dtype() && (!bias.defined() || bias.dtype() == w.dtype()),
           "conv2d: x {}, weight {} and bias {} must share one dtype; convert with .to()", x.describe(), w.describe(),
           bias.defined() ? bias.describe() : std::string("(none)"));
  check_floating("conv2d", {&x, &w, &bias});
  return s;
}

cpu::ConvGeometry geometry(const ConvShapes& s, const Conv2dParams& p) {
  cpu::ConvGeometry g;
  g.channels = s.Cg;
  g.height = s.H;
  g.width = s.W;
  g.kernel_h = s.KH;
  g.kernel_w = s.KW;
  g.out_h = s.OH;
  g.out_w = s.OW;
  g.stride_h = p.stride_h;
  g.stride_w = p.stride_w;
  g.pad_h = p.pad_h;
  g.pad_w = p.pad_w;
  g.dilation_h = p.dilation_h;
  g.dilation_w = p.dilation_w;
  return g;
}

#ifdef HADATRAIN_CUDA
// The cuDNN problem of these shapes and params (CUDA: conv2d runs through cuDNN, src/cuda/libs/cudnn.cpp).
cuda::ConvProblem cudnn_problem(const ConvShapes& s, const Conv2dParams& p, DType dtype) {
  cuda::ConvProblem c;
  c.dtype = dtype;
  c.N = s.N;
  c.C = s.C;
  c.H = s.H;
  c.W = s.W;
  c.O = s.O;
  c.KH = s.KH;
  c.KW = s.KW;
  c.OH = s.OH;
  c.OW = s.OW;
  c.stride_h = p.stride_h;
  c.stride_w = p.stride_w;
  c.pad_h = p.pad_h;
  c.pad_w = p.pad_w;
  c.dilation_h = p.dilation_h;
  c.dilation_w = p.dilation_w;
  c.groups = p.groups;
  c.format = p.layout == ConvLayout::nhwc ? cuda::TensorFormat::nhwc : cuda::TensorFormat::nchw;
  return c;
}
#endif

cpu::ImageStrides image_strides(const Tensor& x) { return {x.strides()[1], x.strides()[2], x.strides()[3]}; }

// Samples per GEMM. The CPU path puts a chunk of S samples side by side into one wide column matrix
// (C/g·KH·KW, S·OH·OW), so each group runs one large product per chunk instead of S small ones (BLAS is
// far faster on the large one, and its threads start once). S depends only on the shapes (never on the
// thread count or the machine), so results are reproducible; the buffers stay below ~kChunkElems elements.
constexpr int64_t kChunkElems = int64_t{1} << 22;
int64_t samples_per_chunk(const ConvShapes& s, int64_t rows) {
  const int64_t per_sample = std::max<int64_t>(1, rows * s.OH * s.OW);
  return std::clamp<int64_t>(kChunkElems / per_sample, 1, std::max<int64_t>(1, s.N));
}

// A work buffer of n elements that every use fully overwrites before reading (so it is not zero-filled).
template <class T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(std::max<int64_t>(1, n)));
}

// A chunk's (rows, S·OH·OW) matrix <-> the (rows, OH·OW) blocks of its samples in an (N, ·, OH, OW) tensor:
// wide[r, i·OH·OW + j] = t[n0 + i, row0 + r, j], where t has `planes` channels of OH·OW each.
template <class T>
void gather_chunk(const T* t, int64_t planes, int64_t row0, int64_t rows, int64_t ohw, int64_t n0, int64_t S,
                  T* wide) {
  for (int64_t i = 0; i < S; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = t + ((n0 + i) * planes + row0 + r) * ohw;
      std::copy(src, src + ohw, wide + r * S * ohw + i * ohw);
    }
}
template <class T>
void scatter_chunk(const T* wide, int64_t planes, int64_t row0, int64_t rows, int64_t ohw, int64_t n0, int64_t S,
                   T* t) {
  for (int64_t i = 0; i < S; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = wide + r * S * ohw + i * ohw;
      std::copy(src, src + ohw, t + ((n0 + i) * planes + row0 + r) * ohw);
    }
}

// out (N, O, OH, OW) (nhwc, CUDA only: (N, OH, OW, O)) from detached x (any strides), weight and bias.
// CUDA: *filter receives the dense filter cuDNN read (cuda_ops::conv2d_filter), kept for backward data.
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                      const ConvShapes& s, Tensor* filter) {
  const bool nhwc = p.layout == ConvLayout::nhwc;
  Tensor out = empty(nhwc ? Shape{s.N, s.OH, s.OW, s.O} : Shape{s.N, s.O, s.OH, s.OW}, {x.dtype(), x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    const cuda::ConvProblem cp = cudnn_problem(s, p, x.dtype());
    *filter = cuda_ops::conv2d_filter(cp, w);
    cuda_ops::conv2d_forward(cp, x, *filter, bias, out);
    return out;
#else
    no_cuda_kernel("conv2d");
#endif
  }
  HT_ASSERT(!nhwc, "conv2d: the CPU path takes NCHW (channels-last inputs are permuted by conv2d())");
  const Tensor wc = contiguous(w);  // (O, Cg·KH·KW) as a matrix
  const Tensor bc = bias.defined() ? contiguous(bias) : Tensor();
  const cpu::ConvGeometry geo = geometry(s, p);
  const int64_t ohw = geo.col_cols(), ckk = geo.col_rows();
  const int64_t chunk = samples_per_chunk(s, std::max(ckk, s.Og));
  visit_floating(x.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto col = scratch<T>(ckk * chunk * ohw);     // (Cg·KH·KW, S·OH·OW)
    auto wide = scratch<T>(s.Og * chunk * ohw);   // (Og, S·OH·OW)
    const T* px = cpu::ptr<T>(x);
    const T* pw = cpu::ptr<T>(wc);
    T* po = cpu::ptr<T>(out);
    const cpu::ImageStrides is = image_strides(x);
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      const int64_t S = std::min(chunk, s.N - n0), cols = S * ohw;
      cpu::GemmDims d;  // wide (Og, S·OH·OW) = W_g (Og, Cg·KH·KW) · col (Cg·KH·KW, S·OH·OW) [+ bias]
      d.m = s.Og;
      d.n = cols;
      d.k = ckk;
      d.lda = std::max<int64_t>(1, ckk);
      d.ldb = std::max<int64_t>(1, cols);
      d.ldc = std::max<int64_t>(1, cols);
      d.beta = bias.defined() ? 1.0 : 0.0;
      for (int64_t gi = 0; gi < s.groups; ++gi) {
        for (int64_t i = 0; i < S; ++i)
          cpu::im2col(px + (n0 + i) * x.strides()[0] + gi * s.Cg * is.c, is, geo, col.get() + i * ohw, cols);
        if (bias.defined()) {
          const T* pb = cpu::ptr<T>(bc) + gi * s.Og;
          for (int64_t r = 0; r < s.Og; ++r) std::fill_n(wide.get() + r * cols, cols, pb[r]);
        }
        cpu::gemm<T>(d, pw + gi * s.Og * ckk, col.get(), wide.get());
        scatter_chunk(wide.get(), s.O, gi * s.Og, s.Og, ohw, n0, S, po);
      }
    }
  });
  return out;
}

// gx (N, C, H, W), contiguous, from g (N, O, OH, OW) contiguous and the weight.
void conv2d_grad_input(const Tensor& g, const Tensor& w, const Conv2dParams& p, const ConvShapes& s, const Tensor& gx) {
  const Tensor wc = contiguous(w);
  const cpu::ConvGeometry geo = geometry(s, p);
  const int64_t ohw = geo.col_cols(), ckk = geo.col_rows(), chw = s.Cg * s.H * s.W;
  const int64_t chunk = samples_per_chunk(s, std::max(ckk, s.Og));
  visit_floating(g.dtype(), "conv2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    auto gcol = scratch<T>(ckk * chunk * ohw);  // (Cg·KH·KW, S·OH·OW)
    auto gw = scratch<T>(s.Og * chunk * ohw);   // (Og, S·OH·OW)
    std::vector<A> image(static_cast<std::size_t>(chw));                // one sample's (Cg, H, W) gradient
    const T* pg = cpu::ptr<T>(g);
    const T* pw = cpu::ptr<T>(wc);
    T* px = cpu::ptr<T>(gx);
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      const int64_t S = std::min(chunk, s.N - n0), cols = S * ohw;
      cpu::GemmDims d;  // gcol (Cg·KH·KW, S·OH·OW) = W_gᵀ · g_g (Og, S·OH·OW)
      d.m = ckk;
      d.n = cols;
      d.k = s.Og;
      d.trans_a = cpu::Trans::yes;
      d.lda = std::max<int64_t>(1, ckk);
      d.ldb = std::max<int64_t>(1, cols);
      d.ldc = std::max<int64_t>(1, cols);
      for (int64_t gi = 0; gi < s.groups; ++gi) {
        gather_chunk(pg, s.O, gi * s.Og, s.Og, ohw, n0, S, gw.get());
        cpu::gemm<T>(d, pw + gi * s.Og * ckk, gw.get(), gcol.get());
        for (int64_t i = 0; i < S; ++i) {
          std::fill(image.begin(), image.end(), A(0));
          cpu::col2im(gcol.get() + i * ohw, cols, geo, image.data());
          T* dst = px + ((n0 + i) * s.C + gi * s.Cg) * s.H * s.W;
          for (int64_t e = 0; e < chw; ++e) dst[e] = cpu::convert<T>(image[static_cast<std::size_t>(e)]);
        }
      }
    }
  });
}

// gw (O, Cg, KH, KW), contiguous, from g (N, O, OH, OW) contiguous and the input x (any strides).
void conv2d_grad_weight(const Tensor& g, const Tensor& x, const Conv2dParams& p, const ConvShapes& s,
                        const Tensor& gw) {
  const cpu::ConvGeometry geo = geometry(s, p);
  const int64_t ohw = geo.col_cols(), ckk = geo.col_rows();
  const int64_t chunk = samples_per_chunk(s, std::max(ckk, s.Og));
  visit_floating(g.dtype(), "conv2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    auto col = scratch<T>(ckk * chunk * ohw);     // (Cg·KH·KW, S·OH·OW)
    auto gwide = scratch<T>(s.Og * chunk * ohw);  // (Og, S·OH·OW)
    std::vector<A> acc(static_cast<std::size_t>(s.O * ckk), A(0));      // (O, Cg·KH·KW), summed over samples
    const T* pg = cpu::ptr<T>(g);
    const T* px = cpu::ptr<T>(x);
    const cpu::ImageStrides is = image_strides(x);
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      const int64_t S = std::min(chunk, s.N - n0), cols = S * ohw;
      cpu::GemmDims d;  // gw_g (Og, Cg·KH·KW) += g_g (Og, S·OH·OW) · colᵀ (S·OH·OW, Cg·KH·KW)
      d.m = s.Og;
      d.n = ckk;
      d.k = cols;
      d.trans_b = cpu::Trans::yes;
      d.lda = std::max<int64_t>(1, cols);
      d.ldb = std::max<int64_t>(1, cols);
      d.ldc = std::max<int64_t>(1, ckk);
      d.beta = 1.0;
      for (int64_t gi = 0; gi < s.groups; ++gi) {
        for (int64_t i = 0; i < S; ++i)
          cpu::im2col(px + (n0 + i) * x.strides()[0] + gi * s.Cg * is.c, is, geo, col.get() + i * ohw, cols);
        gather_chunk(pg, s.O, gi * s.Og, s.Og, ohw, n0, S, gwide.get());
        cpu::gemm_acc<T>(d, gwide.get(), col.get(), acc.data() + gi * s.Og * ckk);
      }
    }
    T* pgw = cpu::ptr<T>(gw);
    for (std::size_t i = 0; i < acc.size(); ++i) pgw[i] = cpu::convert<T>(acc[i]);
  });
}

// On CUDA, g_x is added into the input's gradient gathered so far (a residual input's other branch) by cuDNN with
// beta = 1 (Note [Gradients accumulated in place]). Keeps x only for g_W and W (and cuDNN's filter) only for g_x,
// as linear does (Note [What a product keeps] in grad/pipeline.h): a frozen convolution keeps no input.
class Conv2dBackward final : public AccumulatingNode {
 public:
  // filter: CUDA only, the filter the forward gave cuDNN (reused by backward data), else undefined.
  // x_grad, w_grad: whether g_x, g_W can be asked for (the node's edges, fixed when it is connected).
  Conv2dBackward(const Tensor& x, const Tensor& w, const Tensor& filter, const Conv2dParams& p, const ConvShapes& s,
                 bool x_grad, bool w_grad)
      : AccumulatingNode(x.is_cuda()), p_(p), s_(s), has_filter_(x_grad && filter.defined()) {
    save(w_grad ? x : Tensor());
    save(x_grad ? w : Tensor());
    if (has_filter_) save(filter);
  }
  std::string name() const override { return "Conv2dBackward"; }

 private:
  std::vector<Tensor> run(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) override {
    const Tensor& x = saved(0);  // (N, C, H, W) or nhwc (N, H, W, C); undefined without g_W
    const Tensor& w = saved(1);  // (O, C/groups, KH, KW); undefined without g_x
    const Tensor g = contiguous(grads[0]);  // (N, O, OH, OW) or nhwc (N, OH, OW, O)
    const bool nhwc = p_.layout == ConvLayout::nhwc;
    const ConvShapes& s = s_;
    Tensor gx, gw, gb;
    bool accumulate = false;
    if (needs_input_grad(0)) {
      const Shape xs = nhwc ? Shape{s.N, s.H, s.W, s.C} : Shape{s.N, s.C, s.H, s.W};  // x's shape
      accumulate = g.is_cuda() && !into.empty() && usable_grad_buffer(into[0], xs, g.dtype(), g.device());
      gx = accumulate ? into[0] : empty(xs, {g.dtype(), g.device()});
    }
    if (g.is_cuda()) {
#ifdef HADATRAIN_CUDA
      const cuda::ConvProblem cp = cudnn_problem(s, p_, g.dtype());
      if (gx.defined()) {
        const bool reuse = has_filter_ && saved(2).dtype() == cp.dtype;
        cuda_ops::conv2d_backward_data(cp, g, reuse ? saved(2) : cuda_ops::conv2d_filter(cp, w), gx, accumulate);
      }
      // NHWC: the (O, KH, KW, C/groups) gradient cuDNN writes, handed on as an (O, C/groups, KH, KW) view; the
      // cast to the master dtype (or the accumulation) that follows transposes it in its own pass.
      if (needs_input_grad(1)) gw = cuda_ops::conv2d_backward_filter(cp, x, g);
#else
      no_cuda_kernel("conv2d backward");
#endif
    } else {
      HT_ASSERT(!nhwc, "conv2d backward: the CPU path takes NCHW");
      if (gx.defined()) conv2d_grad_input(g, w, p_, s, gx);
      if (needs_input_grad(1)) {
        gw = empty(Shape{s.O, s.Cg, s.KH, s.KW}, {g.dtype(), g.device()});
        conv2d_grad_weight(g, x, p_, s, gw);
      }
    }
    if (needs_input_grad(2)) gb = nhwc ? sum(g, {0, 1, 2}) : sum(g, {0, 2, 3});  // (O)
    return {gx, gw, gb};
  }

  Conv2dParams p_;
  ConvShapes s_;  // x's and W's sizes: either may not be kept
  bool has_filter_;
};

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  common_device("conv2d", {&x, &weight, &bias});
  const ConvShapes s = conv_shapes(x, weight, bias, p);
  if (p.layout == ConvLayout::nhwc && !x.is_cuda()) {  // the CPU reference: through NCHW and back
    Conv2dParams q = p;
    q.layout = ConvLayout::nchw;
    return contiguous(permute(conv2d(permute(x, {0, 3, 1, 2}), weight, bias, q), {0, 2, 3, 1}));  // (N, OH, OW, O)
  }
  Tensor filter;
  Tensor out =
      conv2d_forward(x.detach(), weight.detach(), bias.defined() ? bias.detach() : Tensor(), p, s, &filter);
  if (needs_grad({&x, &weight, &bias}))
    connect(std::make_shared<Conv2dBackward>(x, weight, filter, p, s, needs_grad({&x}), needs_grad({&weight})),
            {&x, &weight, &bias}, {&out});
  return out;
}

Tensor conv2d_input_grad(const Tensor& g, const Tensor& weight, int64_t height, int64_t width, const Conv2dParams& p) {
  common_device("conv2d_input_grad", {&g, &weight});
  const bool nhwc = p.layout == ConvLayout::nhwc;
  HT_CHECK(g.dim() == 4, "conv2d_input_grad: g must be {}, got {}", nhwc ? "(N, OH, OW, O) (layout nhwc)" : "(N, O, OH, OW)",
           g.describe());
  HT_CHECK(weight.dim() == 4, "conv2d_input_grad: weight must be (O, C/groups, KH, KW), got {}", weight.describe());
  HT_CHECK(height >= 1 && width >= 1, "conv2d_input_grad: input size must be positive, got {}x{}", height, width);
  // The input's shape in the layout, as a zero-stride view of no elements (never read), so that conv_shapes
  // checks every relation.
  const int64_t N = g.size(0), C = weight.size(1) * p.groups;
  const Tensor like = empty(Shape{0}, {g.dtype(), g.device()});
  const Shape xs = nhwc ? Shape{N, height, width, C} : Shape{N, C, height, width};
  const ConvShapes s = conv_shapes(make_view(like, xs, Strides{0, 0, 0, 0}, 0), weight, Tensor(), p);
  const int64_t OH = g.size(nhwc ? 1 : 2), OW = g.size(nhwc ? 2 : 3), O = g.size(nhwc ? 3 : 1);
  HT_CHECK(O == s.O && OH == s.OH && OW == s.OW,
           "conv2d_input_grad: g {} does not match the output of a {}x{} input with weight {} (expected {} channels on "
           "a {}x{} grid)",
           g.describe(), height, width, weight.describe(), s.O, s.OH, s.OW);
  if (!g.is_cuda() && nhwc) {  // the CPU reference: through NCHW and back
    Conv2dParams q = p;
    q.layout = ConvLayout::nchw;
    return contiguous(permute(conv2d_input_grad(permute(g, {0, 3, 1, 2}), weight, height, width, q), {0, 2, 3, 1}));
  }
  const Tensor gc = contiguous(g.detach());
  Tensor gx = empty(xs, {g.dtype(), g.device()});
  if (gx.numel() == 0) return gx;
  if (g.is_cuda()) {
#ifdef HADATRAIN_CUDA
    const cuda::ConvProblem cp = cudnn_problem(s, p, g.dtype());
    cuda_ops::conv2d_backward_data(cp, gc, cuda_ops::conv2d_filter(cp, weight.detach()), gx);
#else
    no_cuda_kernel("conv2d_input_grad");
#endif
  } else {
    conv2d_grad_input(gc, weight.detach(), p, s, gx);
  }
  return gx;
}

Tensor conv2d_weight_grad(const Tensor& x, const Tensor& g, int64_t kernel_h, int64_t kernel_w, const Conv2dParams& p) {
  common_device("conv2d_weight_grad", {&x, &g});
  const bool nhwc = p.layout == ConvLayout::nhwc;
  const char* layout = nhwc ? "(N, OH, OW, O) (layout nhwc)" : "(N, O, OH, OW)";
  HT_CHECK(g.dim() == 4, "conv2d_weight_grad: g must be {}, got {}", layout, g.describe());
  HT_CHECK(x.dtype() == g.dtype(), "conv2d_weight_grad: x {} and g {} must have the same dtype", x.describe(),
           g.describe());
  HT_CHECK(kernel_h >= 1 && kernel_w >= 1, "conv2d_weight_grad: kernel size must be positive, got {}x{}", kernel_h,
           kernel_w);
  HT_CHECK(x.dim() == 4, "conv2d_weight_grad: x must be {}, got {}",
           nhwc ? "(N, H, W, C) (layout nhwc)" : "(N, C, H, W)", x.describe());
  const int64_t O = g.size(nhwc ? 3 : 1), C = x.size(nhwc ? 3 : 1);
  HT_CHECK(C % p.groups == 0, "conv2d_weight_grad: x {} has {} channels, not divisible by groups = {}", x.describe(), C,
           p.groups);
  // The weight's shape as a zero-stride view of no elements (never read), so that conv_shapes checks every relation.
  const Tensor like = empty(Shape{0}, {g.dtype(), g.device()});
  const Shape ws{O, C / p.groups, kernel_h, kernel_w};
  const ConvShapes s = conv_shapes(x, make_view(like, ws, Strides{0, 0, 0, 0}, 0), Tensor(), p);
  const int64_t OH = g.size(nhwc ? 1 : 2), OW = g.size(nhwc ? 2 : 3);
  HT_CHECK(g.size(0) == s.N && OH == s.OH && OW == s.OW,
           "conv2d_weight_grad: g {} does not match the output of x {} with a {}x{} kernel (expected {} samples on a "
           "{}x{} grid)",
           g.describe(), x.describe(), kernel_h, kernel_w, s.N, s.OH, s.OW);
  if (!g.is_cuda() && nhwc) {  // the CPU reference: through NCHW
    Conv2dParams q = p;
    q.layout = ConvLayout::nchw;
    return conv2d_weight_grad(permute(x, {0, 3, 1, 2}), permute(g, {0, 3, 1, 2}), kernel_h, kernel_w, q);
  }
  const Tensor gc = contiguous(g.detach());
  Tensor gw = empty(ws, {g.dtype(), g.device()});
  if (gw.numel() == 0) return gw;
  if (g.is_cuda()) {
#ifdef HADATRAIN_CUDA
    const cuda::ConvProblem cp = cudnn_problem(s, p, g.dtype());
    gw = contiguous(cuda_ops::conv2d_backward_filter(cp, contiguous(x.detach()), gc));
#else
    no_cuda_kernel("conv2d_weight_grad");
#endif
  } else {
    conv2d_grad_weight(gc, x.detach(), p, s, gw);
  }
  return gw;
}

}  // namespace ht
