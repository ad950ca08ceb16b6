// SwiGLU: y = silu(g) * u, the gated product of LLaMA's MLP (g = gate_proj(x), u = up_proj(x)); backward
//   du = dy * silu(g),   dg = (dy * u) * silu'(g),   silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
// The result is defined as the composition mul(silu(g), u) with its intermediate rounded to the dtype, and that
// composition is the CPU reference (and the path for mixed shapes, dtypes or devices). On CUDA, one kernel
// computes the forward and one both gradients (cuda/kernels/swiglu.cu), with the bits of CUDA's silu and mul ops
// (Note [SwiGLU bits]): fusing saves the silu output's write and re-reads, forward and backward, and keeps only
// g and u for backward.
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/swiglu_glue.h"
#endif

namespace ht {
namespace {

#ifdef HADATRAIN_CUDA
bool fused_applies(const Tensor& g, const Tensor& u) {
  const DType dt = g.dtype();
  return g.is_cuda() && u.device() == g.device() && u.dtype() == dt && u.shape() == g.shape() &&
         (dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16);
}
#endif

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
#ifdef HADATRAIN_CUDA
  if (fused_applies(gate, up)) {
    Tensor y = empty(gate.shape(), {gate.dtype(), gate.device()});
    cuda_ops::swiglu_forward(y, gate.detach(), up.detach());
    if (needs_grad({&gate, &up})) {
      auto node = std::make_shared<FunctionNode>("SwigluBackward", [](FunctionNode& self, std::vector<Tensor>&& g) {
        const Tensor& gt = self.saved(0);
        Tensor dg = empty(gt.shape(), {gt.dtype(), gt.device()});
        Tensor du = empty(gt.shape(), {gt.dtype(), gt.device()});
        cuda_ops::swiglu_backward(dg, du, g[0], gt, self.saved(1));
        return std::vector<Tensor>{dg, du};
      });
      node->save(gate);
      node->save(up);
      connect(node, {&gate, &up}, {&y});
    }
    return y;
  }
#endif
  return mul(silu(gate), up);
}

}  // namespace ht
