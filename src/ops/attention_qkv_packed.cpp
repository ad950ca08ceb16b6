// attention_qkv_packed: multi-head self-attention on a packed projection. qkv (B, N, 3 dim) is laid out
// [q | k | v] along its last dim, each part (H, D) with dim = H D (the output of one Linear(dim, 3 dim), as
// in a ViT block); the result is (B, N, dim) laid out (B, N, H, D), ready for the output projection. It
// equals
//   t = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)                    // (3, B, H, N, D)
//   scaled_dot_product_attention(t[0], t[1], t[2]).transpose(1, 2).reshape(B, N, dim)
// which is exactly what runs on the CPU and for every CUDA case the fused kernels do not cover (f32, f64,
// other head dims): autograd through those views gives the gradient, and the CPU result is the reference.
//
// When the fused kernels apply (CUDA, bf16/f16, D in {64, 128}) nothing is copied: the kernels read q, k, v
// as strided (B, H, N, D) views of qkv and write the output straight into its (B, N, H, D) layout, and the
// backward writes dq, dk, dv into the three slots of ONE (B, N, 3 dim) gradient buffer (dq through the
// kernels' fp32 accumulator). The gradient of the composition instead materialises each select's gradient
// as a zero-filled full-size tensor, sums the three and copies the permuted result back.
#include <array>
#include <cmath>

#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/flash_attention_glue.h"
#endif

namespace ht {
namespace {

// The (B, H, N, D) views of q, k and v inside t (B, N, 3 H D) (views when t's layout allows, as for any
// contiguous t).
std::array<Tensor, 3> split_heads(const Tensor& t, int64_t heads, int64_t D) {
  const Tensor p = t.reshape({t.size(0), t.size(1), 3, heads, D}).permute({2, 0, 3, 1, 4});  // (3, B, H, N, D)
  return {select(p, 0, 0), select(p, 0, 1), select(p, 0, 2)};
}

#ifdef HADATRAIN_CUDA
// The (B, H, N, D) view of a (B, N, H D) tensor.
Tensor heads_view(const Tensor& t, int64_t heads, int64_t D) {
  return t.reshape({t.size(0), t.size(1), heads, D}).permute({0, 2, 1, 3});
}

class AttentionQkvPackedBackward final : public Node {
 public:
  // qkv: the tensor whose views the forward read: the op's input itself when it is contiguous, so that a qkv
  // product that offers its output is kept instead of it (Note [Recomputed outputs]); else the contiguous copy.
  AttentionQkvPackedBackward(const kernels::AttnShape& s, const Tensor& qkv, const Tensor& out, const Tensor& lse)
      : s_(s) {
    save(qkv);  // (B, N, 3 dim)
    save(out);  // (B, N, dim): the fused backward needs rowsum(dO * O)
    save(lse);  // (B, H, N) f32
  }
  std::string name() const override { return "AttentionQkvPackedBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    const Tensor& qkv = saved(0);
    const auto [q, k, v] = split_heads(qkv, s_.Hq, s_.D);
    Tensor dqkv = empty(qkv.shape(), {qkv.dtype(), qkv.device()});  // (B, N, 3 dim), every element written
    const auto [dq, dk, dv] = split_heads(dqkv, s_.Hq, s_.D);
    cuda_ops::flash_attention_backward_into(
        {dq, dk, dv},
        {q, k, v, heads_view(saved(1), s_.Hq, s_.D), saved(2), heads_view(grads[0], s_.Hq, s_.D)}, s_);
    return {dqkv};
  }

 private:
  kernels::AttnShape s_;
};
#endif

}  // namespace

Tensor attention_qkv_packed(const Tensor& qkv, int64_t heads, const AttentionOptions& opts) {
  const char* op = "attention_qkv_packed";
  HT_CHECK(qkv.defined() && qkv.dim() == 3, "{}: expected qkv (B, N, 3 dim), got {}", op,
           qkv.defined() ? qkv.describe() : std::string("an undefined tensor"));
  check_floating(op, {&qkv});
  HT_CHECK(heads > 0, "{}: heads must be positive, got {}", op, heads);
  HT_CHECK(qkv.size(2) > 0 && qkv.size(2) % 3 == 0,
           "{}: the last dim of qkv (B, N, 3 dim) must be a positive multiple of 3 (q, k and v side by side); got {}",
           op, qkv.describe());
  const int64_t B = qkv.size(0), N = qkv.size(1), dim = qkv.size(2) / 3;
  HT_CHECK(dim % heads == 0, "{}: heads ({}) must divide dim = qkv.size(2) / 3 = {}; got qkv {}", op, heads, dim,
           qkv.describe());
  HT_CHECK(std::isfinite(opts.scale), "{}: scale must be finite (0 means 1/sqrt(D)), got {}", op, opts.scale);
  const int64_t D = dim / heads;

#ifdef HADATRAIN_CUDA
  if (qkv.is_cuda()) {
    const double scale = opts.scale != 0.0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(D));
    const kernels::AttnShape s{B, heads, heads, N, N, D, D, scale, opts.mask == AttnMask::causal ? 1 : 0};
    if (cuda_ops::flash_attention_applies(qkv.dtype(), s)) {
      const Tensor packed = qkv.detach().contiguous();      // qkv itself unless it is a strided view
      const auto [q, k, v] = split_heads(packed, heads, D);  // (B, H, N, D) views of packed
      Tensor out = empty({B, N, dim}, {qkv.dtype(), qkv.device()});  // (B, N, H, D)
      const Tensor lse = cuda_ops::flash_attention_forward_into(heads_view(out, heads, D), q, k, v, s);
      if (needs_grad({&qkv}))
        connect(std::make_shared<AttentionQkvPackedBackward>(s, qkv.is_contiguous() ? qkv : packed, out, lse), {&qkv},
                {&out});
      return out;
    }
  }
#endif
  // The reference composition (CPU, and CUDA cases without fused kernels).
  const auto [q, k, v] = split_heads(qkv, heads, D);
  return scaled_dot_product_attention(q, k, v, opts).transpose(1, 2).reshape({B, N, dim});  // (B, N, dim)
}

}  // namespace ht
