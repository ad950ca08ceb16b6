// Scaled dot-product attention with grouped KV heads and an optional causal mask:
//   q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> out (B, Hq, T, Dv)
//   out[t] = sum_s P[t, s] v[s],  P = softmax_s(scale * q[t] . k[s]) over the keys query t may see.
// Query head h reads kv head h / (Hq / Hkv). scale 0 means 1 / sqrt(D).
//
// Note [Causal alignment and empty rows]
// Causal attention aligns the queries with the END of the keys (a decode step with a KV cache has T < S):
// query t sees keys s <= t + (S - T). When S >= T every query sees at least key 0. When S < T the first
// T - S queries see no key at all; their output is defined as 0 (and they pass no gradient), rather than
// the NaN a softmax over an empty set would give.
//
// The CPU reference runs plain loops in double. Forward saves q, k, v and the per-row logsumexp
// lse[t] = log sum_s exp(score[t, s]) (f32, f64 for f64 inputs; -inf for empty rows) instead of the (T, S)
// probabilities; backward recomputes P = exp(score - lse) and applies
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P * (dP - rowsum(dP * P)),  dQ = scale dS K,  dK = scale dSᵀ Q,
// summing dK and dV over the query heads that share a kv head.
//
// On CUDA, bf16/f16 inputs with D == Dv in {64, 128} take the fused FlashAttention-2 style kernels
// (cuda/kernels/flash_attention.cu, cuda_ops::flash_attention_applies); their backward also needs the output
// (dsum = rowsum(dO * O) replaces rowsum(dP * P)), which the node then saves. The fused kernels take element
// strides for every operand, so strided views (e.g. transpose(1, 2) of a (B, T, H, D) projection) are read
// in place when D is contiguous and rows are 16-byte aligned (cuda_ops::flash_strides), and copied otherwise.
// Everything else takes the straightforward kernels of cuda/kernels/attention.cu (contiguous copies).
// attention_qkv_packed (attention_qkv_packed.cpp) is the packed-projection variant used by SelfAttention.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/attention_glue.h"
#include "cuda/glue/flash_attention_glue.h"
#endif

namespace ht {
namespace {

struct AttnDims {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  double scale;
  AttnMask mask;

  int64_t group() const { return Hq / Hkv; }
  // Keys [0, visible(t)) are visible to query t (Note [Causal alignment and empty rows]).
  int64_t visible(int64_t t) const { return mask == AttnMask::causal ? std::clamp<int64_t>(t + S - T + 1, 0, S) : S; }
  // Row-major offsets into the contiguous double copies.
  std::size_t qi(int64_t b, int64_t h, int64_t t) const { return static_cast<std::size_t>(((b * Hq + h) * T + t) * D); }
  std::size_t ki(int64_t b, int64_t h, int64_t s) const { return static_cast<std::size_t>(((b * Hkv + h) * S + s) * D); }
  std::size_t vi(int64_t b, int64_t h, int64_t s) const { return static_cast<std::size_t>(((b * Hkv + h) * S + s) * Dv); }
  std::size_t oi(int64_t b, int64_t h, int64_t t) const { return static_cast<std::size_t>(((b * Hq + h) * T + t) * Dv); }
  std::size_t li(int64_t b, int64_t h, int64_t t) const { return static_cast<std::size_t>((b * Hq + h) * T + t); }
#ifdef HADATRAIN_CUDA
  kernels::AttnShape cuda_shape() const { return {B, Hq, Hkv, T, S, D, Dv, scale, mask == AttnMask::causal ? 1 : 0}; }
#endif
};

// scale * q[b, h, t] . k[b, h / group, s]
double score(const AttnDims& d, const std::vector<double>& q, const std::vector<double>& k, int64_t b, int64_t h,
             int64_t t, int64_t s) {
  const double* qr = &q[d.qi(b, h, t)];
  const double* kr = &k[d.ki(b, h / d.group(), s)];
  double acc = 0;
  for (int64_t e = 0; e < d.D; ++e) acc += qr[e] * kr[e];
  return d.scale * acc;
}

DType lse_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// Which kernels the forward ran (the backward runs the matching ones).
enum class AttnPath { reference, fused };

class AttentionBackward final : public Node {
 public:
  // `out` is saved only for the fused path (AttnPath::fused), whose backward reads it.
  AttentionBackward(const AttnDims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                    AttnPath path = AttnPath::reference, const Tensor& out = Tensor())
      : d_(d), path_(path) {
    save(q);
    save(k);
    save(v);
    save(lse);
    if (path_ == AttnPath::fused) save(out);
  }
  std::string name() const override { return "ScaledDotProductAttentionBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const AttnDims& d = d_;
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    if (grads[0].is_cuda()) {
#ifdef HADATRAIN_CUDA
      auto g = path_ == AttnPath::fused
                   ? cuda_ops::flash_attention_backward(saved(0), saved(1), saved(2), saved(4), saved(3), grads[0],
                                                        d.cuda_shape())
                   : cuda_ops::attention_backward(saved(0), saved(1), saved(2), saved(3), grads[0], d.cuda_shape());
      for (std::size_t i = 0; i < 3; ++i)
        if (!needs_input_grad(i)) g[i] = Tensor();
      return {g[0], g[1], g[2]};
#else
      no_cuda_kernel("scaled_dot_product_attention backward");
#endif
    }
    const std::vector<double> q = saved(0).to_vector<double>(), k = saved(1).to_vector<double>(),
                              v = saved(2).to_vector<double>(), lse = saved(3).to_vector<double>();
    const std::vector<double> dout = grads[0].to_vector<double>();  // (B, Hq, T, Dv)
    std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    std::vector<double> p(static_cast<std::size_t>(d.S)), dp(p.size());
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.Hq; ++h) {
        const int64_t hk = h / d.group();
        for (int64_t t = 0; t < d.T; ++t) {
          const int64_t n = d.visible(t);  // empty rows (n = 0) pass no gradient
          const double* go = &dout[d.oi(b, h, t)];
          double row = 0;  // rowsum(dP * P)
          for (int64_t s = 0; s < n; ++s) {
            const std::size_t su = static_cast<std::size_t>(s);
            p[su] = std::exp(score(d, q, k, b, h, t, s) - lse[d.li(b, h, t)]);
            const double* vr = &v[d.vi(b, hk, s)];
            double acc = 0;
            for (int64_t e = 0; e < d.Dv; ++e) acc += go[e] * vr[e];
            dp[su] = acc;
            row += acc * p[su];
          }
          for (int64_t s = 0; s < n; ++s) {
            const std::size_t su = static_cast<std::size_t>(s);
            double* dvr = &dv[d.vi(b, hk, s)];
            for (int64_t e = 0; e < d.Dv; ++e) dvr[e] += p[su] * go[e];
            const double ds = p[su] * (dp[su] - row);
            const double* kr = &k[d.ki(b, hk, s)];
            const double* qr = &q[d.qi(b, h, t)];
            double* dqr = &dq[d.qi(b, h, t)];
            double* dkr = &dk[d.ki(b, hk, s)];
            for (int64_t e = 0; e < d.D; ++e) {
              dqr[e] += d.scale * ds * kr[e];
              dkr[e] += d.scale * ds * qr[e];
            }
          }
        }
      }
    auto out = [&](std::size_t i, const std::vector<double>& g) {
      return needs_input_grad(i) ? from_vector(g, saved(i).shape(), {saved(i).dtype(), saved(i).device()}) : Tensor();
    };
    return {out(0, dq), out(1, dk), out(2, dv)};
  }

 private:
  AttnDims d_;
  AttnPath path_;
};

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  const char* op = "scaled_dot_product_attention";
  const Device dev = common_device(op, {&q, &k, &v});
  HT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "{}: expected q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv); got q {}, k {}, v {}", op,
           q.describe(), k.describe(), v.describe());
  check_floating(op, {&q, &k, &v});
  HT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "{}: q, k and v must share a dtype; got q {}, k {}, v {}",
           op, q.describe(), k.describe(), v.describe());
  HT_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "{}: batch sizes differ: q {}, k {}, v {}", op,
           q.describe(), k.describe(), v.describe());
  HT_CHECK(k.size(1) == v.size(1) && k.size(2) == v.size(2),
           "{}: k (B, Hkv, S, D) and v (B, Hkv, S, Dv) must agree on Hkv and S; got k {}, v {}", op, k.describe(),
           v.describe());
  HT_CHECK(k.size(3) == q.size(3), "{}: q and k must share the head dim D; got q {}, k {}", op, q.describe(),
           k.describe());
  HT_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0,
           "{}: the number of query heads ({}) must be a multiple of the number of kv heads ({}); got q {}, k {}", op,
           q.size(1), k.size(1), q.describe(), k.describe());
  HT_CHECK(std::isfinite(opts.scale), "{}: scale must be finite (0 means 1/sqrt(D)), got {}", op, opts.scale);
  HT_CHECK(opts.scale != 0.0 || q.size(3) > 0, "{}: the default scale 1/sqrt(D) needs D > 0, got q {}", op,
           q.describe());

  const int64_t D = q.size(3);
  const AttnDims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), D, v.size(3),
                   opts.scale != 0.0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(D)), opts.mask};
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    if (cuda_ops::flash_attention_applies(q.dtype(), d.cuda_shape())) {
      auto [result, lse_t] = cuda_ops::flash_attention_forward(q.detach(), k.detach(), v.detach(), d.cuda_shape());
      if (needs_grad({&q, &k, &v}))
        connect(std::make_shared<AttentionBackward>(d, q, k, v, lse_t, AttnPath::fused, result), {&q, &k, &v},
                {&result});
      return result;
    }
    auto [result, lse_t] = cuda_ops::attention_forward(q.detach(), k.detach(), v.detach(), d.cuda_shape());
    if (needs_grad({&q, &k, &v}))
      connect(std::make_shared<AttentionBackward>(d, q, k, v, lse_t), {&q, &k, &v}, {&result});
    return result;
#else
    no_cuda_kernel(op);
#endif
  }

  const std::vector<double> qd = q.detach().to_vector<double>(), kd = k.detach().to_vector<double>(),
                            vd = v.detach().to_vector<double>();
  std::vector<double> out(static_cast<std::size_t>(d.B * d.Hq * d.T * d.Dv), 0.0);  // (B, Hq, T, Dv)
  std::vector<double> lse(static_cast<std::size_t>(d.B * d.Hq * d.T), -std::numeric_limits<double>::infinity());
  std::vector<double> sc(static_cast<std::size_t>(d.S));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group();
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t n = d.visible(t);
        if (n == 0) continue;  // empty row: output 0, lse -inf
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < n; ++s) {
          sc[static_cast<std::size_t>(s)] = score(d, qd, kd, b, h, t, s);
          mx = std::max(mx, sc[static_cast<std::size_t>(s)]);
        }
        double denom = 0;
        for (int64_t s = 0; s < n; ++s) denom += std::exp(sc[static_cast<std::size_t>(s)] - mx);
        double* orow = &out[d.oi(b, h, t)];
        for (int64_t s = 0; s < n; ++s) {
          const double pr = std::exp(sc[static_cast<std::size_t>(s)] - mx) / denom;
          const double* vr = &vd[d.vi(b, hk, s)];
          for (int64_t e = 0; e < d.Dv; ++e) orow[e] += pr * vr[e];
        }
        lse[d.li(b, h, t)] = mx + std::log(denom);
      }
    }

  Tensor result = from_vector(out, {d.B, d.Hq, d.T, d.Dv}, {q.dtype(), dev});
  if (needs_grad({&q, &k, &v})) {
    const Tensor lse_t = from_vector(lse, {d.B, d.Hq, d.T}, {lse_dtype(q.dtype()), dev});
    connect(std::make_shared<AttentionBackward>(d, q, k, v, lse_t), {&q, &k, &v}, {&result});
  }
  return result;
}

}  // namespace ht
