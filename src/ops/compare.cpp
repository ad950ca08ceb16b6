// Comparisons (eq, ne, lt, le, gt, ge) with broadcasting and dtype promotion; results are bool.
// Not differentiable (they produce no floating output).
#include "cpu/elementwise_cpu.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/elementwise_glue.h"
#endif

namespace ht {
namespace {

enum class Cmp { eq, ne, lt, le, gt, ge };

const char* cmp_name(Cmp c) {
  switch (c) {
    case Cmp::eq: return "eq";
    case Cmp::ne: return "ne";
    case Cmp::lt: return "lt";
    case Cmp::le: return "le";
    case Cmp::gt: return "gt";
    case Cmp::ge: return "ge";
  }
  return "?";
}

#ifdef HADATRAIN_CUDA
kernels::CompareOp kernel_op(Cmp c) {
  switch (c) {
    case Cmp::eq: return kernels::CompareOp::eq;
    case Cmp::ne: return kernels::CompareOp::ne;
    case Cmp::lt: return kernels::CompareOp::lt;
    case Cmp::le: return kernels::CompareOp::le;
    case Cmp::gt: return kernels::CompareOp::gt;
    case Cmp::ge: return kernels::CompareOp::ge;
  }
  return kernels::CompareOp::eq;
}
#endif

Tensor compare(Cmp c, const Tensor& a, const Tensor& b) {
  const char* name = cmp_name(c);
  const Device dev = common_device(name, {&a, &b});
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), name), {DType::b8, dev});
  const Tensor ac = to_dtype(a.detach(), dt), bc = to_dtype(b.detach(), dt);
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::compare(kernel_op(c), out, ac, bc);
    return out;
#else
    no_cuda_kernel(name);
#endif
  }
  visit_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int4x2>) HT_FAIL("{}: packed int4 cannot be compared", name);
    else
      cpu::binary_map<T, bool>(out, ac, bc, [c](auto x, auto y) {
        switch (c) {
          case Cmp::eq: return x == y;
          case Cmp::ne: return x != y;
          case Cmp::lt: return x < y;
          case Cmp::le: return x <= y;
          case Cmp::gt: return x > y;
          case Cmp::ge: return x >= y;
        }
        return false;
      });
  });
  return out;
}

Tensor scalar_like(const Tensor& a, double s) { return full({}, s, {a.dtype(), a.device()}); }

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare(Cmp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(Cmp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(Cmp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(Cmp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(Cmp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(Cmp::ge, a, b); }
Tensor eq(const Tensor& a, double s) { return compare(Cmp::eq, a, scalar_like(a, s)); }
Tensor lt(const Tensor& a, double s) { return compare(Cmp::lt, a, scalar_like(a, s)); }
Tensor gt(const Tensor& a, double s) { return compare(Cmp::gt, a, scalar_like(a, s)); }

}  // namespace ht
