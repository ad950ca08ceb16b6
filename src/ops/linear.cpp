// linear: y = x·Wᵀ + b for x (..., in), W (out, in) and an optional bias b (out) -> y (..., out).
// It is its own op with its own Node (not matmul + add) because it is where the gradient pipelines plug
// in later (DESIGN.md, "The gradient-pipeline plug-in point"): the forward product, what is saved and the
// two backward products g_x = g·W and g_W = gᵀ·x all live here. The bias gradient stays outside them.
// The forward runs as one GEMM over the flattened rows, with W passed transposed (no copy) and the bias
// pre-loaded into the output (beta = 1), so narrow dtypes round each output once.
#include "cpu/gemm.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/gemm_glue.h"
#endif

namespace ht {
namespace {

// x (..., in) -> (rows, in); rows is the product of the leading dims (well defined when in = 0).
Tensor as_rows(const Tensor& x) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < x.dim(); ++i) rows *= x.shape()[i];
  return reshape(x, {rows, x.shape().back()});
}

void check_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  common_device("linear", {&x, &w, &bias});
  HT_CHECK(x.dim() >= 1, "linear: input x must have at least 1 dim (..., in), got {}", x.describe());
  HT_CHECK(w.dim() == 2, "linear: weight must be (out, in), got {}", w.describe());
  HT_CHECK(x.shape().back() == w.shape()[1],
           "linear: input x {} has {} features in its last dim but weight {} expects in = {}", x.describe(),
           x.shape().back(), w.describe(), w.shape()[1]);
  HT_CHECK(x.dtype() == w.dtype(), "linear: input x {} and weight {} have different dtypes; convert one with .to()",
           x.describe(), w.describe());
  if (bias.defined()) {
    HT_CHECK(bias.dim() == 1 && bias.shape()[0] == w.shape()[0],
             "linear: bias must be (out) = ({}) for weight {}, got {}", w.shape()[0], w.describe(), bias.describe());
    HT_CHECK(bias.dtype() == w.dtype(), "linear: bias {} and weight {} have different dtypes", bias.describe(),
             w.describe());
  }
  check_floating("linear", {&x, &w, &bias});
}

// Forward on detached tensors: y2 (rows, out) = x2 (rows, in) · Wᵀ (in, out) [+ bias].
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Tensor x2 = as_rows(x);  // (R, in)
  const int64_t R = x2.shape()[0], in = w.shape()[1], out_f = w.shape()[0];
  Shape out_shape = x.shape();
  out_shape[x.dim() - 1] = out_f;
  Tensor y = empty({R, out_f}, {x.dtype(), x.device()});  // (R, out)
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::linear(y, x2, w, bias);  // cuBLASLt, the bias in its epilogue where it applies
    return reshape(y, out_shape);
#else
    no_cuda_kernel("linear");
#endif
  }
  const cpu::GemmOperand xo = cpu::gemm_operand(x2);
  const cpu::GemmOperand wt = cpu::gemm_operand(w.transpose(0, 1));  // Wᵀ (in, out): a transposed view
  cpu::GemmDims d = cpu::gemm_dims(R, out_f, in, xo.layout, wt.layout);
  d.beta = bias.defined() ? 1.0 : 0.0;
  visit_floating(x.dtype(), "linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* py = cpu::ptr<T>(y);
    if (bias.defined()) {
      const T* pb = cpu::ptr<T>(bias);
      const int64_t sb = bias.strides()[0];
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < out_f; ++j) py[r * out_f + j] = pb[j * sb];
    }
    cpu::gemm<T>(d, cpu::ptr<T>(xo.t), cpu::ptr<T>(wt.t), py);
  });
  return reshape(y, out_shape);
}

// Keeps x only for g_W and W only for g_x: a frozen weight's layer (LoRA's base, a frozen projection) keeps no
// input, so an activation no other op keeps is freed after the forward (Note [What a product keeps] in
// grad/pipeline.h). Which gradients can be asked for is fixed when the node is connected (its edges).
class LinearBackward final : public Node {
 public:
  LinearBackward(const Tensor& x, const Tensor& w, bool x_grad, bool w_grad) : x_shape_(x.shape()) {
    save(w_grad ? x : Tensor());
    save(x_grad ? w : Tensor());
  }
  std::string name() const override { return "LinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor g2 = as_rows(grads[0]);  // (R, out)
    Tensor gx, gw, gb;
    if (needs_input_grad(0)) gx = reshape(matmul(g2, saved(1)), x_shape_);         // (R, in) = g·W
    if (needs_input_grad(1)) gw = matmul(transpose(g2, 0, 1), as_rows(saved(0)));  // (out, in) = gᵀ·x
    if (needs_input_grad(2)) gb = sum(g2, {0});                                  // (out)
    return {gx, gw, gb};
  }

 private:
  Shape x_shape_;  // (..., in)
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear(x, weight, bias);
  Tensor out = linear_forward(x.detach(), weight.detach(), bias.defined() ? bias.detach() : Tensor());
  if (needs_grad({&x, &weight, &bias}))
    connect(std::make_shared<LinearBackward>(x, weight, needs_grad({&x}), needs_grad({&weight})), {&x, &weight, &bias},
            {&out});
  return out;
}

}  // namespace ht
