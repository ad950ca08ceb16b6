// Tensor-level glue of the row kernels (see rows_glue.h). CUDA builds only.
//
// Note [Device-side target check]
// Targets (cross_entropy) and ids (embedding) live on the device with the logits / table, so the range check
// runs in the kernel: an out-of-range value sets status[1] = n - (its index) with atomicMax (so the first
// bad index wins), and the op reads the 2-element status back with one small copy after the launch, then
// throws the CPU path's message. That copy synchronises the host with the stream once per call; the
// alternative (no check) would turn a wrong label into a silent out-of-bounds read. Cross-entropy can defer
// it (TargetCheck::deferred: the flag is folded into a per-device record read by check_deferred_targets),
// so a training step never waits for the device; status[0], the number of counted rows that mean
// reduction and the backward divide by, stays on the device. Embedding ids defer the same way into the
// same record, which also keeps which op failed.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/rows_glue.h"

#include "hadatrain/autograd/node.h"

#include <array>
#include <mutex>
#include <vector>

#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#include "cuda/glue/elementwise_glue.h"

namespace ht::cuda_ops {
namespace {

struct OnDevice {
  explicit OnDevice(const Tensor& t) : guard(t.device().index), stream(cuda::current_stream(t.device().index)) {}
  cuda::DeviceGuard guard;
  cudaStream_t stream;
};

// Statistic / loss dtype: f64 for f64, f32 otherwise.
DType stat_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// The dims of an n-dim tensor with d moved last.
Dims dim_last_order(int n, int d) {
  Dims order;
  for (int i = 0; i < n; ++i)
    if (i != d) order.push_back(i);
  order.push_back(d);
  return order;
}

// x dense with dim d last (a copy only when x is not already so).
Tensor rows_of(const Tensor& x, int d) {
  if (x.dim() == 0 || d == x.dim() - 1) return x.contiguous();
  return x.permute(dim_last_order(x.dim(), d)).contiguous();
}

unsigned long long* status_ptr(const Tensor& status) { return static_cast<unsigned long long*>(status.data_ptr()); }

// A norm parameter (D) for the row kernels: as it is when it is dense and of the rows' narrow dtype (bf16 /
// f16: the kernels read it directly, `narrow`), else converted to the statistics dtype sd.
Tensor norm_param(const Tensor& p, DType x_dtype, DType sd, bool& narrow) {
  narrow = false;
  if (!p.defined()) return Tensor();
  if (p.dtype() == x_dtype && (x_dtype == DType::bf16 || x_dtype == DType::f16) && p.is_contiguous()) {
    narrow = true;
    return p;
  }
  return to_dtype(p, sd).contiguous();
}

// The first bad index recorded in a status read back from the device, or -1.
int64_t first_bad(const std::vector<int64_t>& st, int64_t n) { return st[1] == 0 ? -1 : n - st[1]; }

}  // namespace

void softmax(kernels::SoftmaxKind kind, const Tensor& out, const Tensor& x, int d) {
  const int64_t len = x.dim() == 0 ? 1 : x.size(d);
  const int64_t rows = len == 0 ? 0 : x.numel() / len;
  const Tensor in = rows_of(x, d);
  const bool direct = x.dim() == 0 || d == x.dim() - 1;
  const Tensor dst = direct ? out : empty(in.shape(), {out.dtype(), out.device()});
  OnDevice on(out);
  kernels::launch_softmax(x.dtype(), kind, dst.data_ptr(), in.data_ptr(), rows, len, on.stream);
  if (!direct) copy_(out.permute(dim_last_order(x.dim(), d)), dst);
}

Tensor softmax_backward(kernels::SoftmaxKind kind, const Tensor& g, const Tensor& y, int d) {
  const int64_t len = y.dim() == 0 ? 1 : y.size(d);
  const int64_t rows = len == 0 ? 0 : y.numel() / len;
  const Tensor yr = rows_of(y, d), gr = rows_of(to_dtype(g, y.dtype()), d);
  const bool direct = y.dim() == 0 || d == y.dim() - 1;
  Tensor gx = empty(y.shape(), {y.dtype(), y.device()});
  const Tensor dst = direct ? gx : empty(yr.shape(), {y.dtype(), y.device()});
  OnDevice on(gx);
  kernels::launch_softmax_backward(y.dtype(), kind, dst.data_ptr(), gr.data_ptr(), yr.data_ptr(), rows, len, on.stream);
  if (!direct) copy_(gx.permute(dim_last_order(y.dim(), d)), dst);
  return gx;
}

namespace {

// Per device: the largest status[1] (n - first bad row) of the deferred checks since the last
// check_deferred_targets, the class count (cross-entropy) or table size (embedding) of the call that set it,
// and which op that was (an i64 triple on the device).
struct DeferredTargets {
  std::mutex mutex;
  std::array<Tensor, cuda::kMaxDevices> record;
};
DeferredTargets& deferred_targets() {
  static DeferredTargets d;
  return d;
}

enum class DeferredOp : int64_t { cross_entropy = 0, embedding = 1 };

// Folds a call's status (2, on the device) into the device's record without a host synchronisation:
// record = (status[1], classes, op) when status[1] > record[0].
void defer_status(const Tensor& status, int64_t classes, DeferredOp op) {
  DeferredTargets& d = deferred_targets();
  std::lock_guard<std::mutex> lock(d.mutex);
  Tensor& rec = d.record[static_cast<std::size_t>(status.device().index)];
  // Process lifetime; if its stream is destroyed first, the allocator frees it on the legacy stream.
  if (!rec.defined()) rec = ht::zeros({3}, {DType::i64, status.device()});
  const Tensor bad = ht::select(status, 0, 1), prev = ht::select(rec, 0, 0);
  const Tensor cls = ht::full({}, static_cast<double>(classes), {DType::i64, status.device()});
  const Tensor which = ht::full({}, static_cast<double>(op), {DType::i64, status.device()});
  ht::copy_(rec, ht::where(ht::gt(bad, prev), ht::stack({bad, cls, which}, 0), rec));
}

}  // namespace

Tensor cross_entropy(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& opts) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const Tensor x = logits.contiguous();                        // (N, C)
  const Tensor t = to_dtype(target, DType::i64).contiguous();  // (N)
  const bool none = opts.reduction == Reduction::none;
  const Tensor loss = none ? out : empty({n}, {lse.dtype(), lse.device()});  // (N)
  const Tensor status = zeros({2}, {DType::i64, logits.device()});
  {
    OnDevice on(out);
    kernels::launch_cross_entropy({logits.dtype(), x.data_ptr(), static_cast<const int64_t*>(t.data_ptr()), n, c,
                                   opts.ignore_index, opts.label_smoothing, lse.data_ptr(), loss.data_ptr(),
                                   status_ptr(status)},
                                  on.stream);
  }
  if (opts.target_check == TargetCheck::sync) {
    const std::vector<int64_t> st = status.to_vector<int64_t>();  // the one small copy
    const int64_t bad = first_bad(st, n);
    if (bad >= 0) {
      const int64_t value = t.to_vector<int64_t>()[static_cast<std::size_t>(bad)];
      HT_CHECK(false,
               "cross_entropy: target[{}] = {} is out of range for {} classes (expected 0..{}, or ignore_index {})", bad,
               value, c, c - 1, opts.ignore_index);
    }
  } else {
    defer_status(status, c, DeferredOp::cross_entropy);  // status[1] > 0 only on a failure
  }
  const Tensor count = ht::to_dtype(ht::select(status, 0, 0), DType::f64);  // () f64
  if (!none) {
    // mean over no counted rows: 0 / 0 = NaN, as on the CPU
    cuda_ops::sum(out, loss, {true}, 1.0);
    if (opts.reduction == Reduction::mean) ht::copy_(out, ht::div(out, ht::to_dtype(count, out.dtype())));
  }
  return count;
}

void check_deferred_targets(int device) {
  DeferredTargets& d = deferred_targets();
  std::vector<int64_t> rec;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    const Tensor& r = d.record[static_cast<std::size_t>(device)];
    if (!r.defined()) return;
    rec = r.to_vector<int64_t>();
    if (rec[0] != 0) ht::copy_(r, ht::zeros({3}, {DType::i64, r.device()}));
  }
  if (rec[0] == 0) return;
  HT_CHECK(rec[2] != static_cast<int64_t>(DeferredOp::embedding),
           "embedding on cuda:{}: an id was out of range for a table of V = {} rows (expected 0..{}) in a step since "
           "the last check; its flat position was {} from the end of the ids",
           device, rec[1], rec[1] - 1, rec[0]);
  HT_CHECK(false,
           "cross_entropy on cuda:{}: a target was out of range for {} classes (expected 0..{}, or ignore_index) in a "
           "step since the last check; its row was {} from the end of the batch",
           device, rec[1], rec[1] - 1, rec[0]);
}

Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const CrossEntropyOptions& opts, const Tensor& count) {
  const int64_t n = logits.size(0), c = logits.size(1);
  Tensor gx = empty(logits.shape(), {logits.dtype(), logits.device()});  // (N, C)
  const Tensor x = logits.contiguous();
  const Tensor t = to_dtype(target, DType::i64).contiguous();
  // mean: the 1 / count factor is applied on the device (count is a device scalar, no host read)
  Tensor gs = ht::to_dtype(g, lse.dtype());  // (N) or ()
  if (opts.reduction == Reduction::mean) gs = ht::div(gs, ht::to_dtype(count, lse.dtype()));
  gs = gs.contiguous();
  const Tensor l = lse.contiguous();
  const bool none = opts.reduction == Reduction::none;
  OnDevice on(gx);
  kernels::launch_cross_entropy_backward({logits.dtype(), gx.data_ptr(), x.data_ptr(),
                                          static_cast<const int64_t*>(t.data_ptr()), l.data_ptr(), gs.data_ptr(),
                                          none ? 1 : 0, 1.0, n, c, opts.ignore_index, opts.label_smoothing},
                                         on.stream);
  return gx;
}

void norm(kernels::NormKind kind, const NormOutputs& o, const Tensor& x, const Tensor& weight, const Tensor& bias,
          double eps) {
  const int64_t d = x.shape().back();
  const int64_t rows = x.numel() / d;
  const DType sd = stat_dtype(x.dtype());
  const Tensor xc = x.contiguous();                                            // (R, D)
  bool w_narrow = false, b_narrow = false;
  const Tensor w = norm_param(weight, x.dtype(), sd, w_narrow);  // (D)
  const Tensor b = norm_param(bias, x.dtype(), sd, b_narrow);    // (D)
  OnDevice on(o.out);
  kernels::launch_norm({x.dtype(), kind, o.out.data_ptr(), o.mean.defined() ? o.mean.data_ptr() : nullptr,
                        o.rstd.data_ptr(), xc.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
                        b.defined() ? b.data_ptr() : nullptr, rows, d, eps, w_narrow, b_narrow},
                       on.stream);
}

NormGrads norm_backward(kernels::NormKind kind, const Tensor& g, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const NormGradsWanted& want,
                        const Tensor& accumulate_into) {
  const int64_t d = x.shape().back();
  const int64_t rows = x.numel() / d;
  const DType sd = rstd.dtype();
  const Tensor xc = x.contiguous();                        // (R, D)
  const Tensor gc = to_dtype(g, x.dtype()).contiguous();   // (R, D)
  const Tensor mc = mean.defined() ? mean.contiguous() : Tensor();  // (R)
  const Tensor rc = rstd.contiguous();                     // (R)
  NormGrads out;
  OnDevice on(x);
  const bool want_params = want.weight || want.bias;
  bool fused = false;  // the parameter-gradient partial sums came with gx
  Tensor pw, pb;       // (splits, D) partial sums of g * xhat and g
  if (want.x) {
    bool w_narrow = false;
    const Tensor w = norm_param(weight, x.dtype(), sd, w_narrow);  // (D)
    const bool accumulate = accumulate_into.defined();
    HT_ASSERT(!accumulate || usable_grad_buffer(accumulate_into, x.shape(), x.dtype(), x.device()),
              "norm backward: cannot accumulate into {} for x {}", accumulate_into.describe(), x.describe());
    out.gx = accumulate ? accumulate_into : empty(x.shape(), {x.dtype(), x.device()});
    kernels::NormBackwardArgs args{x.dtype(), kind, out.gx.data_ptr(), gc.data_ptr(), xc.data_ptr(),
                                   mc.defined() ? mc.data_ptr() : nullptr, rc.data_ptr(),
                                   w.defined() ? w.data_ptr() : nullptr, rows, d};
    args.weight_narrow = w_narrow;
    args.accumulate = accumulate;
    if (want_params) {
      if (const int parts = kernels::norm_backward_partials(args); parts > 0) {
        fused = true;
        if (want.weight) pw = empty({parts, d}, {sd, x.device()});
        if (want.bias) pb = empty({parts, d}, {sd, x.device()});
        args.gw_partial = pw.defined() ? pw.data_ptr() : nullptr;
        args.gb_partial = pb.defined() ? pb.data_ptr() : nullptr;
      }
    }
    kernels::launch_norm_backward(args, on.stream);
  }
  if (want_params) {
    int64_t parts = 0;
    if (fused) {
      parts = pw.defined() ? pw.size(0) : pb.size(0);
    } else {
      parts = kernels::norm_param_splits(rows, d);
      pw = want.weight ? empty({parts, d}, {sd, x.device()}) : Tensor();
      pb = want.bias ? empty({parts, d}, {sd, x.device()}) : Tensor();
      kernels::launch_norm_param_grad({x.dtype(), kind, pw.defined() ? pw.data_ptr() : nullptr,
                                       pb.defined() ? pb.data_ptr() : nullptr, gc.data_ptr(), xc.data_ptr(),
                                       mc.defined() ? mc.data_ptr() : nullptr, rc.data_ptr(), rows, d},
                                      on.stream);
    }
    // Gradients in the parameters' dtypes straight from the partial sums (one launch), else in S and converted.
    const DType wd = kernels::norm_param_dtype_ok(want.weight_dtype) ? want.weight_dtype : sd;
    const DType bd = kernels::norm_param_dtype_ok(want.bias_dtype) ? want.bias_dtype : sd;
    if (want.weight) out.gw = empty({d}, {wd, x.device()});
    if (want.bias) out.gb = empty({d}, {bd, x.device()});
    kernels::launch_norm_param_finalize({sd, pw.defined() ? pw.data_ptr() : nullptr, pb.defined() ? pb.data_ptr() : nullptr,
                                         out.gw.defined() ? out.gw.data_ptr() : nullptr, wd,
                                         out.gb.defined() ? out.gb.data_ptr() : nullptr, bd, parts, d},
                                        on.stream);
    if (out.gw.defined() && wd != want.weight_dtype) out.gw = to_dtype(out.gw, want.weight_dtype);
    if (out.gb.defined() && bd != want.bias_dtype) out.gb = to_dtype(out.gb, want.bias_dtype);
  }
  return out;
}

void embedding(const Tensor& out, const Tensor& weight, const Tensor& ids, TargetCheck check) {
  const int64_t n = ids.numel(), v = weight.size(0), d = weight.size(1);
  const Tensor idc = to_dtype(ids, DType::i64).contiguous();  // (n)
  const Tensor status = zeros({2}, {DType::i64, weight.device()});
  {
    OnDevice on(out);
    kernels::launch_embedding({itemsize(weight.dtype()), out.data_ptr(), weight.data_ptr(),
                               static_cast<const int64_t*>(idc.data_ptr()), n, v, d, weight.stride(0),
                               weight.stride(1), status_ptr(status)},
                              on.stream);
  }
  if (n == 0 || d == 0) return;
  if (check == TargetCheck::deferred) {
    defer_status(status, v, DeferredOp::embedding);
    return;
  }
  const std::vector<int64_t> st = status.to_vector<int64_t>();  // the one small copy
  const int64_t bad = first_bad(st, n);
  if (bad >= 0) {
    const int64_t id = idc.to_vector<int64_t>()[static_cast<std::size_t>(bad)];
    HT_CHECK(false, "embedding: id {} (at flat position {}) is out of range for a table of V = {} rows (expected 0..{})",
             id, bad, v, v - 1);
  }
}

Tensor embedding_backward(const Tensor& g, const Tensor& ids, int64_t v, DType dtype) {
  const int64_t d = g.shape().back();
  const int64_t n = ids.numel();
  const Tensor gc = g.contiguous();                           // (n, D)
  const Tensor idc = to_dtype(ids, DType::i64).contiguous();  // (n)
  Tensor acc = zeros({v, d}, {stat_dtype(g.dtype()), g.device()});  // (V, D) f32 (f64 for f64)
  {
    OnDevice on(acc);
    kernels::launch_embedding_backward(g.dtype(), acc.data_ptr(), gc.data_ptr(),
                                       static_cast<const int64_t*>(idc.data_ptr()), n, d, on.stream);
  }
  return to_dtype(acc, dtype);
}

void max(const Tensor& values, const Tensor& indices, const Tensor& x, int d) {
  const int64_t len = x.dim() == 0 ? 1 : x.size(d);
  const int64_t rows = x.numel() / len;  // len > 0 (checked by the op)
  // fp8 compares exactly in f32, bool in u8; the chosen values convert back exactly.
  DType ct = x.dtype();
  if (ct == DType::f8e4m3 || ct == DType::f8e5m2) ct = DType::f32;
  if (ct == DType::b8) ct = DType::u8;
  const Tensor in = rows_of(ct == x.dtype() ? x : to_dtype(x, ct), d);
  const Tensor vals = !values.defined() || ct == values.dtype() ? values : empty(values.shape(), {ct, values.device()});
  {
    OnDevice on(indices);
    kernels::launch_max(ct, vals.defined() ? vals.data_ptr() : nullptr, static_cast<int64_t*>(indices.data_ptr()),
                        in.data_ptr(), rows, len, on.stream);
  }
  if (values.defined() && vals.data_ptr() != values.data_ptr()) copy_(values, vals);
}

}  // namespace ht::cuda_ops
#endif
