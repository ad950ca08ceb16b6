// sum and mean over dims (fp64 accumulation on the CPU), and sum_to, the backward of broadcasting.
#include "cpu/reduce_cpu.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/elementwise_glue.h"
#endif

namespace ht {
namespace {

Shape drop_reduced(const Shape& s, const std::vector<bool>& mask) {
  Shape out;
  for (int i = 0; i < s.size(); ++i)
    if (!mask[static_cast<std::size_t>(i)]) out.push_back(s[i]);
  return out;
}

// Backward of sum/mean: the gradient broadcast back over the reduced dims (times `scale`).
class SumBackward final : public Node {
 public:
  SumBackward(Shape in_shape, Shape keep_shape, double scale)
      : in_shape_(in_shape), keep_shape_(keep_shape), scale_(scale) {}
  std::string name() const override { return scale_ == 1.0 ? "SumBackward" : "MeanBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Tensor g = reshape(grads[0], keep_shape_);
    if (scale_ != 1.0) g = mul(g, scale_);
    return {expand(g, in_shape_)};
  }

 private:
  Shape in_shape_, keep_shape_;
  double scale_;
};

Tensor sum_impl(const Tensor& x, const Dims& dims, KeepDim keep, bool is_mean) {
  const char* op = is_mean ? "mean" : "sum";
  const auto mask = cpu::reduce_mask(x, dims, op);
  const Shape keep_shape = cpu::reduced_shape_keepdim(x.shape(), mask);
  const int64_t count = keep_shape.empty() ? 1 : x.numel() / std::max<int64_t>(numel_of(keep_shape), 1);
  HT_CHECK(!is_mean || is_floating(x.dtype()), "mean: expected a floating tensor, got {}", x.describe());
  const DType out_dt = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  Tensor out = empty(keep == KeepDim::yes ? keep_shape : drop_reduced(x.shape(), mask), {out_dt, x.device()});
  const double scale = is_mean ? 1.0 / static_cast<double>(count) : 1.0;
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::sum(out, x, mask, scale);  // fp32 accumulation for narrow dtypes, fp64 for f64, int64 for integers
#else
    no_cuda_kernel(op);
#endif
  } else {
    std::vector<double> acc(static_cast<std::size_t>(numel_of(keep_shape)), 0.0);
    cpu::reduce_visit(x, mask, [&](int64_t slot, double v) { acc[static_cast<std::size_t>(slot)] += v; });
    visit_dtype(out_dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, int4x2>) {
        T* o = cpu::ptr<T>(out);
        for (std::size_t i = 0; i < acc.size(); ++i) o[i] = cpu::convert<T>(acc[i] * scale);
      }
    });
  }
  if (needs_grad({&x})) {
    const double gscale = is_mean ? 1.0 / static_cast<double>(count) : 1.0;
    connect(std::make_shared<SumBackward>(x.shape(), keep_shape, gscale), {&x}, {&out});
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) { return sum_impl(x, {}, KeepDim::no, false); }
Tensor sum(const Tensor& x, const Dims& dims, KeepDim keep) {
  HT_CHECK(!dims.empty(), "sum: empty dim list; call sum(x) to reduce every dim");
  return sum_impl(x, dims, keep, false);
}
Tensor mean(const Tensor& x) { return sum_impl(x, {}, KeepDim::no, true); }
Tensor mean(const Tensor& x, const Dims& dims, KeepDim keep) {
  HT_CHECK(!dims.empty(), "mean: empty dim list; call mean(x) to reduce every dim");
  return sum_impl(x, dims, keep, true);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  HT_CHECK(broadcast_shapes(x.shape(), shape, "sum_to") == x.shape(), "sum_to: {} is not a broadcast of {}",
           x.describe(), to_string(shape));
  if (x.shape() == shape) return x;
  Dims dims;
  const int lead = x.dim() - shape.size();
  for (int i = 0; i < x.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) dims.push_back(i);
  Tensor r = dims.empty() ? x : sum(x, dims, KeepDim::yes);
  return reshape(r, shape);
}

}  // namespace ht
