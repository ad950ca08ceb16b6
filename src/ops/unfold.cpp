// unfold2d / fold2d (include/hadatrain/ops/unfold.h): token-major im2col x (N, C, H, W) -> cols (N, L, C·kh·kw)
// and its adjoint col2im cols -> (N, C, H, W). Each is the other's backward. CPU loops here read like the
// definition; fold gathers every image element's contributions in ascending (i, j) order in acc_t (fp32 /
// fp64), the order the CUDA kernel (cuda/kernels/unfold_fold.cu) uses too, so both backends give the same bits.
#include "hadatrain/ops/unfold.h"

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/shape_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/unfold_glue.h"
#endif

namespace ht {
namespace {

// Validated sizes of one unfold / fold problem.
struct FoldShape {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  int64_t cols() const { return C * kh * kw; }  // C·kh·kw
  int64_t L() const { return OH * OW; }
  int64_t kh = 1, kw = 1;
};

FoldShape fold_shape(const char* op, int64_t N, int64_t C, int64_t H, int64_t W, const Unfold2dParams& p) {
  HT_CHECK(C >= 0, "{}: image must have C >= 0, got C {}", op, C);
  const Unfold2dGrid grid = unfold2d_grid(op, H, W, p);
  FoldShape s;
  s.N = N;
  s.C = C;
  s.H = H;
  s.W = W;
  s.kh = p.kernel_h;
  s.kw = p.kernel_w;
  s.OH = grid.h;
  s.OW = grid.w;
  return s;
}

// cols (N, L, C·kh·kw) contiguous <- x (N, C, H, W) any strides.
void unfold_cpu(const Tensor& cols, const Tensor& x, const FoldShape& s, const Unfold2dParams& p) {
  const int64_t xn = x.strides()[0], xc = x.strides()[1], xh = x.strides()[2], xw = x.strides()[3];
  visit_floating(x.dtype(), "unfold2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(x);
    T* dst = cpu::ptr<T>(cols);
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t oh = 0; oh < s.OH; ++oh)
        for (int64_t ow = 0; ow < s.OW; ++ow)
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t i = 0; i < s.kh; ++i)
              for (int64_t j = 0; j < s.kw; ++j) {
                const int64_t ih = oh * p.stride_h - p.pad_h + i * p.dilation_h;
                const int64_t iw = ow * p.stride_w - p.pad_w + j * p.dilation_w;
                const bool inside = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
                *dst++ = inside ? px[n * xn + c * xc + ih * xh + iw * xw] : cpu::convert<T>(0.0);
              }
  });
}

// x (N, C, H, W) any strides (contiguous or channels-last) <- the sum of each element's entries of cols (N, L,
// C·kh·kw) any strides.
void fold_cpu(const Tensor& x, const Tensor& cols, const FoldShape& s, const Unfold2dParams& p) {
  const int64_t cn = cols.strides()[0], cl = cols.strides()[1], ck = cols.strides()[2];
  const Strides& xs = x.strides();
  visit_floating(cols.dtype(), "fold2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* pc = cpu::ptr<T>(cols);
    T* dst = cpu::ptr<T>(x);
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t c = 0; c < s.C; ++c)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t w = 0; w < s.W; ++w) {
            A acc = A(0);
            for (int64_t i = 0; i < s.kh; ++i) {
              const int64_t th = h + p.pad_h - i * p.dilation_h;  // = oh·stride_h
              if (th < 0 || th % p.stride_h != 0 || th / p.stride_h >= s.OH) continue;
              const int64_t oh = th / p.stride_h;
              for (int64_t j = 0; j < s.kw; ++j) {
                const int64_t tw = w + p.pad_w - j * p.dilation_w;
                if (tw < 0 || tw % p.stride_w != 0 || tw / p.stride_w >= s.OW) continue;
                const int64_t ow = tw / p.stride_w;
                acc += cpu::convert<A>(pc[n * cn + (oh * s.OW + ow) * cl + ((c * s.kh + i) * s.kw + j) * ck]);
              }
            }
            dst[n * xs[0] + c * xs[1] + h * xs[2] + w * xs[3]] = cpu::convert<T>(acc);
          }
  });
}

}  // namespace

Unfold2dGrid unfold2d_grid(const char* op, int64_t H, int64_t W, const Unfold2dParams& p) {
  HT_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1, "{}: kernel size must be >= 1, got ({}, {})", op, p.kernel_h,
           p.kernel_w);
  HT_CHECK(p.stride_h >= 1 && p.stride_w >= 1, "{}: stride must be >= 1, got ({}, {})", op, p.stride_h, p.stride_w);
  HT_CHECK(p.dilation_h >= 1 && p.dilation_w >= 1, "{}: dilation must be >= 1, got ({}, {})", op, p.dilation_h,
           p.dilation_w);
  HT_CHECK(p.pad_h >= 0 && p.pad_w >= 0, "{}: padding must be >= 0, got ({}, {})", op, p.pad_h, p.pad_w);
  HT_CHECK(H >= 1 && W >= 1, "{}: image must have H >= 1, W >= 1, got H {}, W {}", op, H, W);
  const int64_t eff_h = p.dilation_h * (p.kernel_h - 1) + 1, eff_w = p.dilation_w * (p.kernel_w - 1) + 1;
  const int64_t in_h = H + 2 * p.pad_h, in_w = W + 2 * p.pad_w;
  HT_CHECK(in_h >= eff_h && in_w >= eff_w,
           "{}: the dilated kernel {}x{} is larger than the padded image {}x{} (H {}, W {}, padding ({}, {}))", op,
           eff_h, eff_w, in_h, in_w, H, W, p.pad_h, p.pad_w);
  return {(in_h - eff_h) / p.stride_h + 1, (in_w - eff_w) / p.stride_w + 1};
}

Tensor unfold2d(const Tensor& x, const Unfold2dParams& p) {
  HT_CHECK(x.dim() == 4, "unfold2d: x must be (N, C, H, W), got {}", x.describe());
  check_floating("unfold2d", {&x});
  const FoldShape s = fold_shape("unfold2d", x.size(0), x.size(1), x.size(2), x.size(3), p);
  Tensor xd = x.detach();
  Tensor out = empty({s.N, s.L(), s.cols()}, {x.dtype(), x.device()});  // (N, L, C·kh·kw)
  if (out.numel() > 0) {
    if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
      cuda_ops::unfold2d(out, xd, cuda_ops::UnfoldProblem{s.N, s.C, s.H, s.W, s.OH, s.OW, p});
#else
      no_cuda_kernel("unfold2d");
#endif
    } else {
      unfold_cpu(out, xd, s, p);
    }
  }
  const Fold2dParams fp{s.C, s.H, s.W, p};
  record("Unfold2dBackward", {&x}, out, [fp](FunctionNode&, std::vector<Tensor>&& g) -> std::vector<Tensor> {
    if (!g[0].defined()) return {Tensor{}};
    return {fold2d(g[0], fp)};
  });
  return out;
}

Tensor fold2d(const Tensor& cols, const Fold2dParams& p) {
  HT_CHECK(cols.dim() == 3, "fold2d: cols must be (N, L, C·kh·kw), got {}", cols.describe());
  check_floating("fold2d", {&cols});
  const FoldShape s = fold_shape("fold2d", cols.size(0), p.channels, p.height, p.width, p.window);
  HT_CHECK(cols.size(1) == s.L() && cols.size(2) == s.cols(),
           "fold2d: cols {} must be (N, L, C·kh·kw) = (N, {}, {}) for a {}x{}x{} image with a {}x{} kernel "
           "(output grid {}x{})",
           cols.describe(), s.L(), s.cols(), s.C, s.H, s.W, s.kh, s.kw, s.OH, s.OW);
  Tensor cd = cols.detach();
  Tensor out = p.channels_last ? permute(empty({s.N, s.H, s.W, s.C}, {cols.dtype(), cols.device()}), {0, 3, 1, 2})
                               : empty({s.N, s.C, s.H, s.W}, {cols.dtype(), cols.device()});
  if (out.numel() > 0) {
    if (cols.is_cuda()) {
#ifdef HADATRAIN_CUDA
      cuda_ops::fold2d(out, cd, cuda_ops::UnfoldProblem{s.N, s.C, s.H, s.W, s.OH, s.OW, p.window});
#else
      no_cuda_kernel("fold2d");
#endif
    } else {
      fold_cpu(out, cd, s, p.window);
    }
  }
  const Unfold2dParams up = p.window;
  record("Fold2dBackward", {&cols}, out, [up](FunctionNode&, std::vector<Tensor>&& g) -> std::vector<Tensor> {
    if (!g[0].defined()) return {Tensor{}};
    return {unfold2d(g[0], up)};
  });
  return out;
}

}  // namespace ht
