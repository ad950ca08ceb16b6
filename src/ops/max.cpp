// max and argmax along one dim, and max over all elements, for every dtype but packed int4.
// The first maximal element wins; NaN counts as larger than everything, so the first NaN wins and max
// returns NaN (PyTorch's rule).
// Gradient of max: each line's incoming gradient goes entirely to its argmax (the first maximal element);
// tied elements get zero. PyTorch's max(x, dim) does the same; its all-element max(x) splits the gradient
// evenly among ties instead, but here max(x) is max over the flattened tensor and also routes to the first.
#include <cmath>
#include <type_traits>

#include "cpu/convert.h"
#include "cpu/lines.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/rows_glue.h"
#endif

namespace ht {
namespace {

template <class A>
bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return std::isnan(v);
  else return false;
}

struct MaxResult {
  Tensor values;   // keepdim shape, x's dtype (undefined when not asked for)
  Tensor indices;  // keepdim shape, i64
};

enum class WantValues { no, yes };

// The first maximal element of every line along dim d (NaN is maximal).
MaxResult max_lines(const Tensor& x, int d, WantValues want, const char* op) {
  const int64_t len = cpu::line_length(x, d), sx = cpu::line_stride(x, d);
  HT_CHECK(len > 0, "{}: cannot reduce dim {} of size 0 in {}", op, d, x.describe());
  HT_CHECK(x.dtype() != DType::i4x2, "{}: packed int4 is not supported, got {}", op, x.describe());
  const Shape ks = cpu::keepdim_shape(x.shape(), d);
  MaxResult r;
  r.indices = empty(ks, {DType::i64, x.device()});
  r.values = empty(ks, {x.dtype(), x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::max(want == WantValues::yes ? r.values : Tensor(), r.indices, x, d);
#else
    no_cuda_kernel(op);
#endif
  } else {
    visit_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, int4x2>) {
        using A = acc_t<T>;
        const T* px = cpu::ptr<T>(x);
        T* pv = cpu::ptr<T>(r.values);
        int64_t* pi = cpu::ptr<int64_t>(r.indices);
        cpu::for_each_line<3>(x.shape(), d, {x.strides(), r.values.strides(), r.indices.strides()},
                              [&](const std::array<int64_t, 3>& base) {
                                int64_t best = 0;
                                A best_v = cpu::convert<A>(px[base[0]]);
                                for (int64_t j = 1; j < len && !is_nan(best_v); ++j) {
                                  const A v = cpu::convert<A>(px[base[0] + j * sx]);
                                  if (is_nan(v) || v > best_v) {
                                    best = j;
                                    best_v = v;
                                  }
                                }
                                pi[base[2]] = best;
                                pv[base[1]] = px[base[0] + best * sx];
                              });
      }
    });
  }
  if (want == WantValues::no) r.values = Tensor();
  return r;
}

Shape drop_dim(const Shape& s, int d) {
  Shape out = s;
  if (!out.empty()) out.erase(d);
  return out;
}

// Backward of max along dim: g goes to the saved argmax of each line, zero elsewhere.
class MaxBackward final : public Node {
 public:
  MaxBackward(Shape in_shape, int dim) : in_shape_(in_shape), dim_(dim) {}
  std::string name() const override { return "MaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& idx = saved(0);  // keepdim shape, i64
    const Tensor g = reshape(grads[0], idx.shape());
    // positions along dim, shaped (1, .., L, .., 1) so that it broadcasts against idx to in_shape
    const int64_t len = in_shape_.empty() ? 1 : in_shape_[dim_];
    Shape pos_shape;
    pos_shape.resize(in_shape_.size(), 1);
    if (!in_shape_.empty()) pos_shape[dim_] = len;
    const Tensor pos = reshape(arange(len, {DType::i64, g.device()}), pos_shape);
    const Tensor chosen = eq(pos, idx);  // (in_shape) bool
    return {where(chosen, g, zeros({}, {g.dtype(), g.device()}))};
  }

 private:
  Shape in_shape_;
  int dim_;
};

}  // namespace

Tensor max(const Tensor& x, int64_t dim, KeepDim keep) {
  const int d = wrap_dim(dim, x.dim(), "max");
  MaxResult r = max_lines(x.detach(), d, WantValues::yes, "max");
  Tensor out = keep == KeepDim::yes ? r.values : reshape(r.values, drop_dim(x.shape(), d));
  if (needs_grad({&x})) {
    auto node = std::make_shared<MaxBackward>(x.shape(), d);
    node->save(r.indices);
    connect(node, {&x}, {&out});
  }
  return out;
}

Tensor max(const Tensor& x) {
  HT_CHECK(x.numel() > 0, "max: cannot take the max of an empty tensor {}", x.describe());
  return max(reshape(x, {x.numel()}), 0, KeepDim::no);  // gradient flows back through the reshape
}

Tensor argmax(const Tensor& x, int64_t dim, KeepDim keep) {
  const int d = wrap_dim(dim, x.dim(), "argmax");
  const MaxResult r = max_lines(x.detach(), d, WantValues::no, "argmax");
  return keep == KeepDim::yes ? r.indices : reshape(r.indices, drop_dim(x.shape(), d));
}

}  // namespace ht
