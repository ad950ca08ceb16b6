// Tensor-level CUDA glue of conv2d (cuDNN), pooling and batch norm (see conv_pool_bn_glue.h). CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/conv_pool_bn_glue.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/shape_ops.h"
#include "cuda/kernels/batchnorm.cuh"
#include "cuda/glue/elementwise_glue.h"

namespace ht::cuda_ops {
namespace {

// The device of a launch made current for its duration, and that device's current stream.
struct OnDevice {
  explicit OnDevice(const Tensor& t) : guard(t.device().index), stream(cuda::current_stream(t.device().index)) {}
  cuda::DeviceGuard guard;
  cudaStream_t stream;
};

// Pools and batch norm have kernels for these; other floating dtypes (fp8) compute in f32.
bool has_kernel(DType dt) { return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16; }

kernels::PoolStrides pool_strides(const Tensor& x) {
  return {x.strides()[0], x.strides()[1], x.strides()[2], x.strides()[3]};
}

// t (N, C, H, W) dense in `layout`: t itself when it already is, else a copy (NHWC: an (N, H, W, C)
// contiguous buffer viewed as (N, C, H, W)).
Tensor pool_dense(const Tensor& t, kernels::PoolLayout layout) {
  if (layout == kernels::PoolLayout::nchw) return contiguous(t);
  const Tensor nhwc = permute(t, {0, 2, 3, 1});
  return nhwc.is_contiguous() ? t : permute(contiguous(nhwc), {0, 3, 1, 2});
}

// An uninitialised (N, C, H, W) tensor like `like` (shape, device), dense in `layout`, of dtype dt.
Tensor pool_empty(const Tensor& like, DType dt, kernels::PoolLayout layout) {
  const Shape& s = like.shape();
  if (layout == kernels::PoolLayout::nchw) return empty(s, {dt, like.device()});
  return permute(empty({s[0], s[2], s[3], s[1]}, {dt, like.device()}), {0, 3, 1, 2});
}

kernels::BnShape bn_shape(const Shape& shape) {
  kernels::BnShape s;
  s.N = shape[0];
  s.C = shape[1];
  s.S = 1;
  for (int d = 2; d < static_cast<int>(shape.size()); ++d) s.S *= shape[d];
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// conv2d

namespace {

bool is_nhwc(const cuda::ConvProblem& p) { return p.format == cuda::TensorFormat::nhwc; }

// Fallback for an NHWC problem that no cuDNN algorithm supports: the same problem in NCHW buffers.
cuda::ConvProblem as_nchw(const cuda::ConvProblem& p) {
  cuda::ConvProblem q = p;
  q.format = cuda::TensorFormat::nchw;
  return q;
}
Tensor nhwc_to_nchw(const Tensor& t) { return contiguous(permute(t, {0, 3, 1, 2})); }
Tensor nchw_to_nhwc(const Tensor& t) { return permute(t, {0, 2, 3, 1}); }
// The NCHW filter (O, C/groups, KH, KW) of a filter made by conv2d_filter for p.
Tensor nchw_filter(const cuda::ConvProblem& p, const Tensor& filter) {
  return is_nhwc(p) ? contiguous(permute(filter, {0, 3, 1, 2})) : filter;
}

void check_ran(bool ran, const char* what) {
  HT_ASSERT(ran, "conv2d: cuDNN returned 'unsupported' for an NCHW {} problem instead of throwing", what);
}

}  // namespace

Tensor conv2d_filter(const cuda::ConvProblem& p, const Tensor& w) {
  NoGradGuard no_grad;
  const Tensor v = is_nhwc(p) ? permute(w, {0, 2, 3, 1}) : w;  // (O, KH, KW, C/groups) for nhwc
  if (v.is_contiguous() && v.dtype() == p.dtype) return v;  // e.g. a weight cast into channels-last memory
  Tensor f = empty(v.shape(), {p.dtype, w.device()});
  copy_(f, v);  // cast and layout in one pass
  return f;
}

void conv2d_forward(const cuda::ConvProblem& p, const Tensor& x, const Tensor& filter, const Tensor& bias,
                    const Tensor& out) {
  NoGradGuard no_grad;
  OnDevice on(out);
  const Tensor xc = contiguous(to_dtype(x, p.dtype)), wc = filter;
  HT_ASSERT(wc.is_contiguous() && wc.dtype() == p.dtype, "conv2d: the filter must come from conv2d_filter");
  if (!cuda::conv2d_forward(p, xc.data_ptr(), wc.data_ptr(), out.data_ptr())) {  // nhwc unsupported
    const Tensor xn = nhwc_to_nchw(xc), wn = nchw_filter(p, filter);
    Tensor yn = empty({p.N, p.O, p.OH, p.OW}, {p.dtype, out.device()});
    check_ran(cuda::conv2d_forward(as_nchw(p), xn.data_ptr(), wn.data_ptr(), yn.data_ptr()), "forward");
    copy_(out, nchw_to_nhwc(yn));
  }
  if (bias.defined())  // out += bias (1, O, 1, 1) or nhwc (1, 1, 1, O), rounded once more in out's dtype
    binary(kernels::BinaryOp::add, 1.0, out, out, reshape(bias, is_nhwc(p) ? Shape{1, 1, 1, p.O} : Shape{1, p.O, 1, 1}));
}

void conv2d_backward_data(const cuda::ConvProblem& p, const Tensor& g, const Tensor& filter, const Tensor& gx,
                          bool accumulate) {
  NoGradGuard no_grad;
  OnDevice on(gx);
  const Tensor gc = contiguous(to_dtype(g, p.dtype)), wc = filter;
  HT_ASSERT(wc.is_contiguous() && wc.dtype() == p.dtype, "conv2d backward: the filter must come from conv2d_filter");
  HT_ASSERT(gx.is_contiguous() && gx.dtype() == p.dtype, "conv2d backward: gx {} must be dense {}", gx.describe(),
            dtype_name(p.dtype));
  if (accumulate) {
    if (cuda::conv2d_backward_data(p, gc.data_ptr(), wc.data_ptr(), gx.data_ptr(), true)) return;
    Tensor fresh = empty(gx.shape(), {p.dtype, gx.device()});  // no algorithm takes beta = 1: add separately
    conv2d_backward_data(p, g, filter, fresh, false);
    binary(kernels::BinaryOp::add, 1.0, gx, gx, fresh);
    return;
  }
  if (!cuda::conv2d_backward_data(p, gc.data_ptr(), wc.data_ptr(), gx.data_ptr())) {  // nhwc unsupported
    const Tensor gn = nhwc_to_nchw(gc), wn = nchw_filter(p, filter);
    Tensor gxn = empty({p.N, p.C, p.H, p.W}, {p.dtype, gx.device()});
    check_ran(cuda::conv2d_backward_data(as_nchw(p), gn.data_ptr(), wn.data_ptr(), gxn.data_ptr()), "backward-data");
    copy_(gx, nchw_to_nhwc(gxn));
  }
}

Tensor conv2d_backward_filter(const cuda::ConvProblem& p, const Tensor& x, const Tensor& g) {
  NoGradGuard no_grad;
  OnDevice on(g);
  const Tensor xc = contiguous(to_dtype(x, p.dtype)), gc = contiguous(to_dtype(g, p.dtype));
  const Device dev = g.device();
  if (!is_nhwc(p)) {
    Tensor gw = empty({p.O, p.C / p.groups, p.KH, p.KW}, {p.dtype, dev});
    check_ran(cuda::conv2d_backward_filter(p, xc.data_ptr(), gc.data_ptr(), gw.data_ptr()), "backward-filter");
    return gw;
  }
  // cuDNN writes the KRSC gradient (O, KH, KW, C/groups); gw is its (O, C/groups, KH, KW) view.
  Tensor gw_krsc = empty({p.O, p.KH, p.KW, p.C / p.groups}, {p.dtype, dev});
  if (cuda::conv2d_backward_filter(p, xc.data_ptr(), gc.data_ptr(), gw_krsc.data_ptr()))
    return permute(gw_krsc, {0, 3, 1, 2});
  const Tensor xn = nhwc_to_nchw(xc), gn = nhwc_to_nchw(gc);  // nhwc unsupported: through NCHW
  Tensor gw = empty({p.O, p.C / p.groups, p.KH, p.KW}, {p.dtype, dev});
  check_ran(cuda::conv2d_backward_filter(as_nchw(p), xn.data_ptr(), gn.data_ptr(), gw.data_ptr()), "backward-filter");
  return gw;
}

// ---------------------------------------------------------------------------------------------------
// pools

void max_pool2d(const Tensor& x, const kernels::PoolShape& s, const Tensor& out, const Tensor& indices) {
  NoGradGuard no_grad;
  if (!has_kernel(x.dtype())) {  // fp8: the max of exact f32 values is the same element
    Tensor tmp = pool_empty(out, DType::f32, s.layout);
    max_pool2d(to_dtype(x, DType::f32), s, tmp, indices);
    copy_(out, tmp);
    return;
  }
  OnDevice on(out);
  // nhwc: x is channels-last dense from the op; a converted fp8 input above may not be (a copy then).
  const Tensor xd = s.layout == kernels::PoolLayout::nhwc ? pool_dense(x, s.layout) : x;
  HT_ASSERT(!indices.defined() || indices.dtype() == DType::i32, "max_pool2d: indices must be i32, got {}",
            indices.describe());
  kernels::launch_max_pool2d(x.dtype(), xd.data_ptr(), pool_strides(xd), s, out.data_ptr(),
                             indices.defined() ? static_cast<int32_t*>(indices.data_ptr()) : nullptr, on.stream);
}

void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const kernels::PoolShape& s,
                         const Tensor& gx) {
  NoGradGuard no_grad;
  if (!has_kernel(gx.dtype())) {
    Tensor tmp = pool_empty(gx, DType::f32, s.layout);
    max_pool2d_backward(to_dtype(grad_out, DType::f32), indices, s, tmp);
    copy_(gx, tmp);
    return;
  }
  OnDevice on(gx);
  const Tensor go = pool_dense(to_dtype(grad_out, gx.dtype()), s.layout);
  const Tensor ic = pool_dense(indices, s.layout);
  HT_ASSERT(ic.dtype() == DType::i32, "max_pool2d backward: indices must be i32, got {}", ic.describe());
  kernels::launch_max_pool2d_backward(gx.dtype(), go.data_ptr(), static_cast<const int32_t*>(ic.data_ptr()), s,
                                      gx.data_ptr(), on.stream);
}

void avg_pool2d(kernels::AvgKind kind, const Tensor& x, const kernels::PoolShape& s, const Tensor& out) {
  NoGradGuard no_grad;
  if (!has_kernel(x.dtype())) {
    Tensor tmp = pool_empty(out, DType::f32, s.layout);
    avg_pool2d(kind, to_dtype(x, DType::f32), s, tmp);
    copy_(out, tmp);
    return;
  }
  OnDevice on(out);
  const Tensor xd = s.layout == kernels::PoolLayout::nhwc ? pool_dense(x, s.layout) : x;
  kernels::launch_avg_pool2d(x.dtype(), kind, xd.data_ptr(), pool_strides(xd), s, out.data_ptr(), on.stream);
}

void avg_pool2d_backward(kernels::AvgKind kind, const Tensor& grad_out, const kernels::PoolShape& s,
                         const Tensor& gx) {
  NoGradGuard no_grad;
  if (!has_kernel(gx.dtype())) {
    Tensor tmp = pool_empty(gx, DType::f32, s.layout);
    avg_pool2d_backward(kind, to_dtype(grad_out, DType::f32), s, tmp);
    copy_(gx, tmp);
    return;
  }
  OnDevice on(gx);
  const Tensor go = pool_dense(to_dtype(grad_out, gx.dtype()), s.layout);
  kernels::launch_avg_pool2d_backward(gx.dtype(), kind, go.data_ptr(), s, gx.data_ptr(), on.stream);
}

// ---------------------------------------------------------------------------------------------------
// batch norm

namespace {

const double* dptr(const Tensor& t) { return t.defined() ? static_cast<const double*>(t.data_ptr()) : nullptr; }
double* dptr_mut(const Tensor& t) { return t.defined() ? static_cast<double*>(t.data_ptr()) : nullptr; }

bool dense_kernel_param(const Tensor& t) { return t.is_contiguous() && has_kernel(t.dtype()); }

// A per-channel tensor as the kernels read it: the tensor itself when dense in a kernel dtype (the usual
// case: no copy, no launch), else a dense f32 copy kept alive in `keep`. Absent for an undefined tensor.
kernels::BnParam bn_param(const Tensor& t, Tensor& keep) {
  if (!t.defined()) return {};
  keep = dense_kernel_param(t) ? t : contiguous(to_dtype(t, DType::f32));
  return {keep.data_ptr(), keep.dtype()};
}

kernels::BnAct bn_act(BatchNormActivation a) {
  return a == BatchNormActivation::relu ? kernels::BnAct::relu : kernels::BnAct::none;
}

// The normalisation pass of the forward (xc dense), shared by batch_norm_forward and batch_norm_apply.
void normalize(const Tensor& xc, const BnApply& p, const Tensor& out, cudaStream_t stream) {
  Tensor keep_w, keep_b;
  kernels::BnChannels ch;
  ch.mean = dptr(p.stats.mean);
  ch.invstd = dptr(p.stats.invstd);
  ch.weight = bn_param(p.weight, keep_w);
  ch.bias = bn_param(p.bias, keep_b);
  ch.act = bn_act(p.activation);
  Tensor rc;
  if (p.residual.defined()) {
    rc = contiguous(p.residual);
    ch.act = kernels::BnAct::add_relu;
    ch.residual = rc.data_ptr();
  }
  kernels::launch_bn_normalize(xc.dtype(), xc.data_ptr(), bn_shape(xc.shape()), ch, out.data_ptr(), stream);
}

}  // namespace

BnStats batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, const BatchNormOptions& opts, const Tensor& residual,
                           const Tensor& out) {
  NoGradGuard no_grad;
  if (!has_kernel(x.dtype())) {
    Tensor tmp = empty(out.shape(), {DType::f32, out.device()});
    BnStats st = batch_norm_forward(to_dtype(x, DType::f32), weight, bias, running_mean, running_var, opts,
                                    residual.defined() ? to_dtype(residual, DType::f32) : Tensor(), tmp);
    copy_(out, tmp);
    return st;
  }
  OnDevice on(out);
  const Tensor xc = contiguous(x);
  const kernels::BnShape s = bn_shape(x.shape());
  const TensorOptions f64{DType::f64, x.device()};
  BnStats st;
  st.mean = empty({s.C}, f64);
  st.invstd = empty({s.C}, f64);
  if (opts.mode == BatchNormMode::train) {
    kernels::BnRunning run;
    Tensor rm, rv;  // the running stats themselves (updated in place), or f64 working copies copied back
    if (running_mean.defined()) {
      const bool in_place = dense_kernel_param(running_mean) && dense_kernel_param(running_var) &&
                            running_mean.dtype() == running_var.dtype();
      rm = in_place ? running_mean : contiguous(to_dtype(running_mean, DType::f64));
      rv = in_place ? running_var : contiguous(to_dtype(running_var, DType::f64));
      run.mean = rm.data_ptr();
      run.var = rv.data_ptr();
      run.dtype = rm.dtype();
      run.momentum = opts.momentum;
    }
    if (opts.num_batches_tracked.defined()) run.count = static_cast<int64_t*>(opts.num_batches_tracked.data_ptr());
    kernels::launch_bn_stats(x.dtype(), xc.data_ptr(), s, opts.eps, run, dptr_mut(st.mean), dptr_mut(st.invstd),
                             on.stream);
    if (running_mean.defined() && rm.data_ptr() != running_mean.data_ptr()) {
      copy_(running_mean, rm);
      copy_(running_var, rv);
    }
  } else {
    Tensor keep_m, keep_v;
    kernels::launch_bn_eval_stats(bn_param(running_mean, keep_m), bn_param(running_var, keep_v), s.C, opts.eps,
                                  dptr_mut(st.mean), dptr_mut(st.invstd), on.stream);
  }
  normalize(xc, {st, weight, bias, opts.activation, residual}, out, on.stream);
  return st;
}

void batch_norm_apply(const Tensor& x, const BnApply& p, const Tensor& out) {
  NoGradGuard no_grad;
  const BnStats& st = p.stats;
  HT_CHECK(st.mean.dtype() == DType::f64 && st.invstd.dtype() == DType::f64 && st.mean.is_contiguous() &&
               st.invstd.is_contiguous(),
           "batch_norm_apply: expected the forward's dense f64 statistics, got mean {} and invstd {}",
           st.mean.describe(), st.invstd.describe());
  if (!has_kernel(x.dtype())) {  // as batch_norm_forward: through f32
    Tensor tmp = empty(out.shape(), {DType::f32, out.device()});
    BnApply f32 = p;
    if (f32.residual.defined()) f32.residual = to_dtype(f32.residual, DType::f32);
    batch_norm_apply(to_dtype(x, DType::f32), f32, tmp);
    copy_(out, tmp);
    return;
  }
  OnDevice on(out);
  normalize(contiguous(x), p, out, on.stream);
}

BnGrads batch_norm_backward(const Tensor& g, const BnBackwardArgs& a, const std::array<bool, 4>& in_need) {
  std::array<bool, 4> need = in_need;
  if (need[3]) need[0] = true;  // the dx kernel writes the residual's gradient next to dx
  NoGradGuard no_grad;
  const DType dt = has_kernel(a.x_dtype) ? a.x_dtype : DType::f32;  // fp8 computes in f32
  OnDevice on(g);
  const kernels::BnShape s = bn_shape(a.x_shape);
  const bool train = a.mode == BatchNormMode::train;
  const bool fused = a.activation != BatchNormActivation::none;
  const Tensor gc = contiguous(to_dtype(g, dt));
  Tensor mean, invstd, keep_w, keep_b;  // statistics as f64 (they are f64 already when saved by the CUDA forward)
  if (a.mean.defined()) mean = contiguous(to_dtype(a.mean, DType::f64));
  invstd = contiguous(to_dtype(a.invstd, DType::f64));
  kernels::BnChannels ch;
  ch.mean = dptr(mean);
  ch.invstd = dptr(invstd);
  ch.weight = bn_param(a.weight, keep_w);
  if (fused) ch.bias = bn_param(a.bias, keep_b);
  ch.act = bn_act(a.activation);
  Tensor rc;
  if (a.residual.defined()) {
    HT_ASSERT(fused, "batch_norm backward: a residual comes with the fused relu");
    rc = contiguous(to_dtype(a.residual, dt));
    ch.act = kernels::BnAct::add_relu;
    ch.residual = rc.data_ptr();
  }
  const TensorOptions f64{DType::f64, g.device()};
  const bool need_xhat_sum = need[1] || (train && need[0]);
  Tensor xc;
  if (need_xhat_sum || fused) {
    HT_ASSERT(a.x.defined() && a.mean.defined(), "batch_norm backward: x and mean were not saved");
    xc = contiguous(to_dtype(a.x, dt));
  }
  BnGrads r;
  kernels::BnBackwardSums sums;
  Tensor sum_g, sum_gxhat;  // (C) f64, only for dx in train mode
  if (train && need[0]) {
    sum_g = empty({s.C}, f64);
    sum_gxhat = empty({s.C}, f64);
    sums.sum_g = dptr_mut(sum_g);
    sums.sum_gxhat = dptr_mut(sum_gxhat);
  }
  if (need[1]) {
    r.gw = empty({s.C}, {has_kernel(a.weight_dtype) ? a.weight_dtype : DType::f32, g.device()});
    sums.grad_weight = {r.gw.data_ptr(), r.gw.dtype()};
  }
  if (need[2]) {
    r.gb = empty({s.C}, {has_kernel(a.bias_dtype) ? a.bias_dtype : DType::f32, g.device()});
    sums.grad_bias = {r.gb.data_ptr(), r.gb.dtype()};
  }
  if (sums.sum_g || sums.grad_weight.data || sums.grad_bias.data)
    kernels::launch_bn_backward_reduce(dt, gc.data_ptr(), xc.defined() ? xc.data_ptr() : nullptr, s, ch, sums,
                                       on.stream);
  if (need[0]) {
    Tensor gx = empty(a.x_shape, {dt, g.device()}), gres;
    if (a.residual.defined()) {  // written by the dx kernel (always launched with a residual)
      gres = empty(a.x_shape, {dt, g.device()});
      ch.residual_grad = gres.data_ptr();
    }
    kernels::launch_bn_backward_dx(dt, train ? kernels::BnMode::train : kernels::BnMode::eval, gc.data_ptr(),
                                   xc.defined() ? xc.data_ptr() : nullptr, s, ch, dptr(sum_g), dptr(sum_gxhat),
                                   gx.data_ptr(), on.stream);
    if (in_need[0]) r.gx = to_dtype(gx, a.x_dtype);
    if (in_need[3]) r.gr = to_dtype(gres, a.x_dtype);
  }
  if (r.gw.defined()) r.gw = to_dtype(r.gw, a.weight_dtype);  // no-op unless fp8
  if (r.gb.defined()) r.gb = to_dtype(r.gb, a.bias_dtype);
  return r;
}

}  // namespace ht::cuda_ops
#endif
