// softmax and log_softmax along one dim. The CPU reference subtracts the line's max before exp and works in
// double; the output keeps the input dtype. Any dim and any layout (lines are walked through strides).
// Backward (y = the saved output, sums run along dim):
//   softmax:     gx = y * (g - sum(g * y))
//   log_softmax: gx = g - exp(y) * sum(g)
// CUDA: forward and backward are one row kernel each (cuda/kernels/rows.cu), computed in f32 (f64 for f64).
#include <cmath>
#include <vector>

#include "cpu/convert.h"
#include "cpu/lines.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/rows_glue.h"
#endif

namespace ht {
namespace {

enum class SoftmaxKind { softmax, log_softmax };

const char* kind_name(SoftmaxKind k) { return k == SoftmaxKind::softmax ? "softmax" : "log_softmax"; }

// Dtype the backward formulas run in: f64 for f64, f32 otherwise (bf16 gradients are not summed in bf16).
DType compute_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

Tensor softmax_forward(SoftmaxKind kind, const Tensor& x, int d) {
  const char* name = kind_name(kind);
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::softmax(kind == SoftmaxKind::softmax ? kernels::SoftmaxKind::softmax : kernels::SoftmaxKind::log_softmax,
                      out, x, d);
    return out;
#else
    no_cuda_kernel(name);
#endif
  }
  const int64_t len = cpu::line_length(x, d), sx = cpu::line_stride(x, d), so = cpu::line_stride(out, d);
  visit_floating(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(x);
    T* po = cpu::ptr<T>(out);
    std::vector<double> row(static_cast<std::size_t>(len));
    cpu::for_each_line<2>(x.shape(), d, {x.strides(), out.strides()}, [&](const std::array<int64_t, 2>& base) {
      double m = -INFINITY;  // a NaN in the line makes the whole line NaN below, as in PyTorch
      for (int64_t j = 0; j < len; ++j) {
        row[static_cast<std::size_t>(j)] = cpu::to_double(px[base[0] + j * sx]);
        m = std::max(m, row[static_cast<std::size_t>(j)]);
      }
      double s = 0.0;
      for (int64_t j = 0; j < len; ++j) s += std::exp(row[static_cast<std::size_t>(j)] - m);
      const double log_s = std::log(s);
      for (int64_t j = 0; j < len; ++j) {
        const double z = row[static_cast<std::size_t>(j)] - m;
        const double v = kind == SoftmaxKind::softmax ? std::exp(z) / s : z - log_s;
        po[base[1] + j * so] = cpu::convert<T>(v);
      }
    });
  });
  return out;
}

class SoftmaxBackward final : public Node {
 public:
  SoftmaxBackward(SoftmaxKind kind, int dim, DType dtype) : kind_(kind), dim_(dim), dtype_(dtype) {}
  std::string name() const override {
    return kind_ == SoftmaxKind::softmax ? "SoftmaxBackward" : "LogSoftmaxBackward";
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (saved(0).is_cuda()) {
#ifdef HADATRAIN_CUDA
      return {cuda_ops::softmax_backward(kind_ == SoftmaxKind::softmax ? kernels::SoftmaxKind::softmax
                                                                       : kernels::SoftmaxKind::log_softmax,
                                         grads[0], saved(0), dim_)};  // one fused row kernel
#endif
    }
    const DType cd = compute_dtype(dtype_);
    const Tensor y = to_dtype(saved(0), cd);
    const Tensor g = to_dtype(grads[0], cd);
    Tensor gx;
    if (kind_ == SoftmaxKind::softmax) gx = mul(y, sub(g, sum(mul(g, y), {dim_}, KeepDim::yes)));
    else gx = sub(g, mul(exp(y), sum(g, {dim_}, KeepDim::yes)));
    return {to_dtype(gx, dtype_)};
  }

 private:
  SoftmaxKind kind_;
  int dim_;
  DType dtype_;
};

Tensor softmax_op(SoftmaxKind kind, const Tensor& x, int64_t dim) {
  const char* name = kind_name(kind);
  check_floating(name, {&x});
  const int d = wrap_dim(dim, x.dim(), name);
  Tensor out = softmax_forward(kind, x.detach(), d);
  if (needs_grad({&x})) {
    auto node = std::make_shared<SoftmaxBackward>(kind, d, x.dtype());
    node->save(out);
    connect(node, {&x}, {&out});
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op(SoftmaxKind::softmax, x, dim); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_op(SoftmaxKind::log_softmax, x, dim); }

}  // namespace ht
