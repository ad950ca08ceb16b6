// Binary arithmetic with broadcasting (add, sub, mul, div, maximum, minimum), the scalar forms, pow, and
// the in-place optimiser updates add_ / mul_. Each backward reduces its gradient to the input's shape.
#include <cmath>

#include "cpu/elementwise_cpu.h"
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

enum class Arith { add, sub, mul, div, max, min };

const char* arith_name(Arith op) {
  switch (op) {
    case Arith::add: return "add";
    case Arith::sub: return "sub";
    case Arith::mul: return "mul";
    case Arith::div: return "div";
    case Arith::max: return "maximum";
    case Arith::min: return "minimum";
  }
  return "?";
}

template <class A>
A apply_arith(Arith op, A x, A y) {
  switch (op) {
    case Arith::add: return x + y;
    case Arith::sub: return x - y;
    case Arith::mul: return x * y;
    case Arith::div:
      if constexpr (std::is_integral_v<A>) {
        HT_CHECK(y != 0, "div: integer division by zero");
        return x / y;
      } else {
        return x / y;
      }
    case Arith::max: return (x != x || x > y) ? x : y;  // NaN propagates
    case Arith::min: return (x != x || x < y) ? x : y;
  }
  return x;
}

// Calls run(f) with f(x, y) = apply_arith(op, x, y) for a fixed op, so the op is chosen once per tensor
// and the element loop inlines the arithmetic.
template <class Run>
void with_arith(Arith op, Run&& run) {
  switch (op) {
    case Arith::add: return run([](auto x, auto y) { return apply_arith(Arith::add, x, y); });
    case Arith::sub: return run([](auto x, auto y) { return apply_arith(Arith::sub, x, y); });
    case Arith::mul: return run([](auto x, auto y) { return apply_arith(Arith::mul, x, y); });
    case Arith::div: return run([](auto x, auto y) { return apply_arith(Arith::div, x, y); });
    case Arith::max: return run([](auto x, auto y) { return apply_arith(Arith::max, x, y); });
    case Arith::min: return run([](auto x, auto y) { return apply_arith(Arith::min, x, y); });
  }
}

#ifdef HADATRAIN_CUDA
kernels::BinaryOp kernel_op(Arith op) {
  switch (op) {
    case Arith::add: return kernels::BinaryOp::add;
    case Arith::sub: return kernels::BinaryOp::sub;
    case Arith::mul: return kernels::BinaryOp::mul;
    case Arith::div: return kernels::BinaryOp::div;
    case Arith::max: return kernels::BinaryOp::max;
    case Arith::min: return kernels::BinaryOp::min;
  }
  return kernels::BinaryOp::add;
}
#endif

Tensor arith_forward(Arith op, const Tensor& a, const Tensor& b) {
  const char* name = arith_name(op);
  const Device dev = common_device(name, {&a, &b});
  const DType dt = promote_types(a.dtype(), b.dtype());
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, {dt, dev});
  const Tensor ac = a.dtype() == dt ? a.detach() : to_dtype(a.detach(), dt);
  const Tensor bc = b.dtype() == dt ? b.detach() : to_dtype(b.detach(), dt);
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    HT_CHECK(dt != DType::i4x2, "{}: packed int4 takes part in no arithmetic", name);
    cuda_ops::binary(kernel_op(op), 1.0, out, ac, bc);
    return out;
#else
    no_cuda_kernel(name);
#endif
  }
  visit_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int4x2>) HT_FAIL("{}: packed int4 takes part in no arithmetic", name);
    else with_arith(op, [&](auto f) { cpu::binary_map<T, T>(out, ac, bc, f); });
  });
  return out;
}

// Reduces a broadcast gradient to an input's shape and dtype.
Tensor grad_for(const Tensor& g, const Shape& shape, DType dtype) {
  Tensor r = g.shape() == shape ? g : sum_to(g, shape);
  return r.dtype() == dtype ? r : to_dtype(r, dtype);
}

class ArithBackward final : public Node {
 public:
  ArithBackward(Arith op, const Tensor& a, const Tensor& b)
      : op_(op), a_shape_(a.shape()), b_shape_(b.shape()), a_dtype_(a.dtype()), b_dtype_(b.dtype()) {
    if (op != Arith::add && op != Arith::sub) {  // add/sub need only the metadata above
      save(a);
      save(b);
    }
  }
  std::string name() const override { return std::string(arith_name(op_)) + "Backward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    switch (op_) {
      case Arith::add: ga = g; gb = g; break;
      case Arith::sub: ga = g; gb = neg(g); break;
      case Arith::mul:
        if (needs_input_grad(0)) ga = mul(g, saved(1));
        if (needs_input_grad(1)) gb = mul(g, saved(0));
        break;
      case Arith::div:
        if (needs_input_grad(0)) ga = div(g, saved(1));
        if (needs_input_grad(1)) gb = neg(div(mul(g, saved(0)), mul(saved(1), saved(1))));
        break;
      case Arith::max:
      case Arith::min: {
        // The larger (smaller) input takes the gradient; ties split it evenly.
        const Tensor& a = saved(0);
        const Tensor& b = saved(1);
        const Tensor a_wins = op_ == Arith::max ? gt(a, b) : lt(a, b);
        const Tensor b_wins = op_ == Arith::max ? lt(a, b) : gt(a, b);
        const Tensor half = mul(g, 0.5);
        ga = where(a_wins, g, where(b_wins, zeros_like(g), half));
        gb = where(b_wins, g, where(a_wins, zeros_like(g), half));
        break;
      }
    }
    return {needs_input_grad(0) ? grad_for(ga, a_shape_, a_dtype_) : Tensor(),
            needs_input_grad(1) ? grad_for(gb, b_shape_, b_dtype_) : Tensor()};
  }

 private:
  Arith op_;
  Shape a_shape_, b_shape_;
  DType a_dtype_, b_dtype_;
};

Tensor arith(Arith op, const Tensor& a, const Tensor& b) {
  Tensor out = arith_forward(op, a, b);
  if (needs_grad({&a, &b})) {
    check_floating(arith_name(op), {&out});
    connect(std::make_shared<ArithBackward>(op, a, b), {&a, &b}, {&out});
  }
  return out;
}

// Ops with a scalar operand: out = f(a) with a's dtype; backward multiplies by a constant or formula.
enum class ScalarOp { add, mul, rsub, pow };

const char* scalar_name(ScalarOp op) {
  switch (op) {
    case ScalarOp::add: return "add_scalar";
    case ScalarOp::mul: return "mul_scalar";
    case ScalarOp::rsub: return "rsub_scalar";
    case ScalarOp::pow: return "pow";
  }
  return "?";
}

#ifdef HADATRAIN_CUDA
kernels::UnaryOp kernel_op(ScalarOp op) {
  switch (op) {
    case ScalarOp::add: return kernels::UnaryOp::add_scalar;
    case ScalarOp::mul: return kernels::UnaryOp::mul_scalar;
    case ScalarOp::rsub: return kernels::UnaryOp::rsub_scalar;
    case ScalarOp::pow: return kernels::UnaryOp::pow_scalar;
  }
  return kernels::UnaryOp::add_scalar;
}
#endif

class ScalarBackward final : public Node {
 public:
  ScalarBackward(ScalarOp op, double s, const Tensor& a) : op_(op), s_(s) {
    if (op == ScalarOp::pow) save(a);
  }
  std::string name() const override { return std::string(scalar_name(op_)) + "Backward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& g = grads[0];
    switch (op_) {
      case ScalarOp::add: return {g};
      case ScalarOp::mul: return {mul(g, s_)};
      case ScalarOp::rsub: return {neg(g)};
      case ScalarOp::pow: return {mul(g, mul(pow(saved(0), s_ - 1.0), s_))};
    }
    return {Tensor()};
  }

 private:
  ScalarOp op_;
  double s_;
};

void scalar_op_cpu(ScalarOp op, double s, const Tensor& out, const Tensor& a) {
  const char* name = scalar_name(op);
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int4x2>) HT_FAIL("{}: packed int4 takes part in no arithmetic", name);
    else {
      using A = acc_t<T>;
      const A sv = static_cast<A>(s);
      cpu::unary_map<T>(out, a, [&](A x) -> A {
        switch (op) {
          case ScalarOp::add: return x + sv;
          case ScalarOp::mul: return x * sv;
          case ScalarOp::rsub: return sv - x;
          case ScalarOp::pow: return static_cast<A>(std::pow(static_cast<double>(x), s));
        }
        return x;
      });
    }
  });
}

Tensor scalar_op(ScalarOp op, const Tensor& a, double s) {
  const char* name = scalar_name(op);
  Tensor out = empty(a.shape(), {a.dtype(), a.device()});
  if (a.is_cuda()) {
#ifdef HADATRAIN_CUDA
    HT_CHECK(a.dtype() != DType::i4x2, "{}: packed int4 takes part in no arithmetic", name);
    cuda_ops::unary({kernel_op(op), kernels::UnaryMode::value, s}, out, a.detach());
#else
    no_cuda_kernel(name);
#endif
  } else {
    scalar_op_cpu(op, s, out, a);
  }
  if (needs_grad({&a})) connect(std::make_shared<ScalarBackward>(op, s, a), {&a}, {&out});
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return arith(Arith::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return arith(Arith::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return arith(Arith::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return arith(Arith::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return arith(Arith::max, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return arith(Arith::min, a, b); }
Tensor add(const Tensor& a, double s) { return scalar_op(ScalarOp::add, a, s); }
Tensor sub(const Tensor& a, double s) { return scalar_op(ScalarOp::add, a, -s); }
Tensor mul(const Tensor& a, double s) { return scalar_op(ScalarOp::mul, a, s); }
Tensor div(const Tensor& a, double s) {
  HT_CHECK(s != 0.0 || is_floating(a.dtype()), "div: integer tensor {} divided by zero", a.describe());
  return scalar_op(ScalarOp::mul, a, 1.0 / s);
}
Tensor rsub(double s, const Tensor& a) { return scalar_op(ScalarOp::rsub, a, s); }
Tensor pow(const Tensor& a, double exponent) { return scalar_op(ScalarOp::pow, a, exponent); }

void add_(const Tensor& self, const Tensor& other, double alpha) {
  HT_CHECK(!(grad_enabled() && self.requires_grad()), "add_: in-place update of {} that requires grad; use NoGradGuard",
           self.describe());
  common_device("add_", {&self, &other});
  HT_CHECK(broadcast_shapes(self.shape(), other.shape(), "add_") == self.shape(),
           "add_: {} cannot be broadcast to {}", other.describe(), self.describe());
  const Tensor oc = other.dtype() == self.dtype() ? other.detach() : to_dtype(other.detach(), self.dtype());
  mark_written(self);
  if (self.is_cuda()) {
#ifdef HADATRAIN_CUDA
    check_floating("add_", {&self});
    cuda_ops::binary(kernels::BinaryOp::add_scaled, alpha, self, self.detach(), oc);
    return;
#else
    no_cuda_kernel("add_");
#endif
  }
  visit_floating(self.dtype(), "add_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A al = static_cast<A>(alpha);
    cpu::binary_map<T, T>(self, self, oc, [al](A x, A y) { return x + al * y; });
  });
}

void mul_(const Tensor& self, double s) {
  HT_CHECK(!(grad_enabled() && self.requires_grad()), "mul_: in-place update of {} that requires grad; use NoGradGuard",
           self.describe());
  mark_written(self);
  if (self.is_cuda()) {
#ifdef HADATRAIN_CUDA
    check_floating("mul_", {&self});
    cuda_ops::unary({kernels::UnaryOp::mul_scalar, kernels::UnaryMode::value, s}, self, self.detach());
    return;
#else
    no_cuda_kernel("mul_");
#endif
  }
  visit_floating(self.dtype(), "mul_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A sv = static_cast<A>(s);
    cpu::unary_map<T>(self, self, [sv](A x) { return x * sv; });
  });
}

}  // namespace ht
