// where(cond, a, b) and masked_fill, with broadcasting; gradients flow to the selected side.
#include "cpu/loops.h"
#include "cpu/convert.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/elementwise_glue.h"
#endif

namespace ht {
namespace {

Tensor where_forward(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Device dev = common_device("where", {&cond, &a, &b});
  HT_CHECK(cond.dtype() == DType::b8, "where: condition must be bool, got {}", cond.describe());
  const DType dt = promote_types(a.dtype(), b.dtype());
  const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = empty(shape, {dt, dev});
  const Tensor ac = to_dtype(a.detach(), dt), bc = to_dtype(b.detach(), dt);
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::where(out, cond, ac, bc);
    return out;
#else
    no_cuda_kernel("where");
#endif
  }
  visit_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int4x2>) HT_FAIL("where: packed int4 is not supported");
    else {
      T* o = cpu::ptr<T>(out);
      const bool* c = cpu::ptr<bool>(cond);
      const T* pa = cpu::ptr<T>(ac);
      const T* pb = cpu::ptr<T>(bc);
      cpu::for_each_offset<4>(shape,
                              {out.strides(), cpu::broadcast_strides(cond, shape), cpu::broadcast_strides(ac, shape),
                               cpu::broadcast_strides(bc, shape)},
                              [&](const std::array<int64_t, 4>& off) { o[off[0]] = c[off[1]] ? pa[off[2]] : pb[off[3]]; });
    }
  });
  return out;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = where_forward(cond, a, b);
  if (needs_grad({&a, &b})) {
    const Shape as = a.shape(), bs = b.shape();
    const DType adt = a.dtype(), bdt = b.dtype();
    auto node = std::make_shared<FunctionNode>("WhereBackward", [as, bs, adt, bdt](FunctionNode& self,
                                                                                   std::vector<Tensor>&& g) {
      const Tensor& c = self.saved(0);
      const Tensor zero = zeros({}, {g[0].dtype(), g[0].device()});
      Tensor ga, gb;
      if (self.needs_input_grad(0)) ga = to_dtype(sum_to(where(c, g[0], zero), as), adt);
      if (self.needs_input_grad(1)) gb = to_dtype(sum_to(where(c, zero, g[0]), bs), bdt);
      return std::vector<Tensor>{ga, gb};
    });
    node->save(cond);
    connect(node, {&a, &b}, {&out});
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  HT_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(),
           "masked_fill: mask {} does not broadcast to {}", mask.describe(), x.describe());
  return where(mask, full({}, value, {x.dtype(), x.device()}), x);
}

}  // namespace ht
