// Unary math: neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu (erf and tanh forms), silu, clamp.
// Each has a forward formula and a derivative formula side by side (UNARY_OPS table below); backward
// multiplies the incoming gradient by the derivative evaluated at the saved input (or output).
#include <cmath>
#include <type_traits>

#include "cpu/elementwise_cpu.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/elementwise.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/elementwise_glue.h"
#endif

namespace ht {
namespace {

enum class Unary { neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu_erf, gelu_tanh, silu, clamp };

struct UnaryInfo {
  const char* name;
  bool floating_only;
};

UnaryInfo info(Unary u) {
  switch (u) {
    case Unary::neg: return {"neg", false};
    case Unary::abs: return {"abs", false};
    case Unary::exp: return {"exp", true};
    case Unary::log: return {"log", true};
    case Unary::sqrt: return {"sqrt", true};
    case Unary::rsqrt: return {"rsqrt", true};
    case Unary::tanh: return {"tanh", true};
    case Unary::sigmoid: return {"sigmoid", true};
    case Unary::relu: return {"relu", false};
    case Unary::gelu_erf: return {"gelu", true};
    case Unary::gelu_tanh: return {"gelu_tanh", true};
    case Unary::silu: return {"silu", true};
    case Unary::clamp: return {"clamp", false};
  }
  return {"?", false};
}

struct ClampRange {
  double lo = 0, hi = 0;
};

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;

// f(x)
template <class A>
A forward_value(Unary u, A x, ClampRange r) {
  using std::exp;
  switch (u) {
    case Unary::neg: return -x;
    case Unary::abs: return x < 0 ? -x : x;
    case Unary::exp: return exp(x);
    case Unary::log: return std::log(x);
    case Unary::sqrt: return std::sqrt(x);
    case Unary::rsqrt: return A(1) / std::sqrt(x);
    case Unary::tanh: return std::tanh(x);
    case Unary::sigmoid: return A(1) / (A(1) + exp(-x));
    case Unary::relu: return (x > 0 || x != x) ? x : A(0);  // NaN propagates
    case Unary::gelu_erf: return A(0.5) * x * (A(1) + std::erf(x * A(0.7071067811865476)));
    case Unary::gelu_tanh:
      return A(0.5) * x * (A(1) + std::tanh(A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x)));
    case Unary::silu: return x / (A(1) + exp(-x));
    case Unary::clamp: return x < A(r.lo) ? A(r.lo) : (x > A(r.hi) ? A(r.hi) : x);
  }
  return x;
}

// f'(x)
template <class A>
A derivative(Unary u, A x, ClampRange r) {
  using std::exp;
  switch (u) {
    case Unary::neg: return A(-1);
    case Unary::abs: return x > 0 ? A(1) : (x < 0 ? A(-1) : A(0));
    case Unary::exp: return exp(x);
    case Unary::log: return A(1) / x;
    case Unary::sqrt: return A(0.5) / std::sqrt(x);
    case Unary::rsqrt: return A(-0.5) / (x * std::sqrt(x));
    case Unary::tanh: {
      const A t = std::tanh(x);
      return A(1) - t * t;
    }
    case Unary::sigmoid: {
      const A s = A(1) / (A(1) + exp(-x));
      return s * (A(1) - s);
    }
    case Unary::relu: return x > 0 ? A(1) : A(0);
    case Unary::gelu_erf: {
      const A cdf = A(0.5) * (A(1) + std::erf(x * A(0.7071067811865476)));
      const A pdf = exp(A(-0.5) * x * x) * A(0.3989422804014327);
      return cdf + x * pdf;
    }
    case Unary::gelu_tanh: {
      const A inner = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
      const A t = std::tanh(inner);
      const A dinner = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluC) * x * x);
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
    }
    case Unary::silu: {
      const A s = A(1) / (A(1) + exp(-x));
      return s * (A(1) + x * (A(1) - s));
    }
    case Unary::clamp: return (x >= A(r.lo) && x <= A(r.hi)) ? A(1) : A(0);
  }
  return A(0);
}

#ifdef HADATRAIN_CUDA
kernels::UnaryOp kernel_op(Unary u) {
  switch (u) {
    case Unary::neg: return kernels::UnaryOp::neg;
    case Unary::abs: return kernels::UnaryOp::abs;
    case Unary::exp: return kernels::UnaryOp::exp;
    case Unary::log: return kernels::UnaryOp::log;
    case Unary::sqrt: return kernels::UnaryOp::sqrt;
    case Unary::rsqrt: return kernels::UnaryOp::rsqrt;
    case Unary::tanh: return kernels::UnaryOp::tanh;
    case Unary::sigmoid: return kernels::UnaryOp::sigmoid;
    case Unary::relu: return kernels::UnaryOp::relu;
    case Unary::gelu_erf: return kernels::UnaryOp::gelu_erf;
    case Unary::gelu_tanh: return kernels::UnaryOp::gelu_tanh;
    case Unary::silu: return kernels::UnaryOp::silu;
    case Unary::clamp: return kernels::UnaryOp::clamp;
  }
  return kernels::UnaryOp::neg;
}
#endif

// Calls run(op) with op a std::integral_constant for u, so a loop over elements sees a fixed op.
template <class Run>
void with_unary(Unary u, Run&& run) {
  switch (u) {
#define HT_UNARY_CASE(U) \
  case Unary::U: return run(std::integral_constant<Unary, Unary::U>{});
    HT_UNARY_CASE(neg)
    HT_UNARY_CASE(abs)
    HT_UNARY_CASE(exp)
    HT_UNARY_CASE(log)
    HT_UNARY_CASE(sqrt)
    HT_UNARY_CASE(rsqrt)
    HT_UNARY_CASE(tanh)
    HT_UNARY_CASE(sigmoid)
    HT_UNARY_CASE(relu)
    HT_UNARY_CASE(gelu_erf)
    HT_UNARY_CASE(gelu_tanh)
    HT_UNARY_CASE(silu)
    HT_UNARY_CASE(clamp)
#undef HT_UNARY_CASE
  }
}

// Applies forward_value (or derivative) elementwise (the CPU loop is the reference; see cuda/kernels/elementwise.cu).
Tensor map(Unary u, const Tensor& x, ClampRange r, bool deriv) {
  const UnaryInfo in = info(u);
  if (in.floating_only) check_floating(in.name, {&x});
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    HT_CHECK(x.dtype() != DType::b8 && x.dtype() != DType::i4x2, "{}: not defined for {}", in.name, x.describe());
    cuda_ops::unary({kernel_op(u), deriv ? kernels::UnaryMode::derivative : kernels::UnaryMode::value, r.lo, r.hi},
                    out, x);
    return out;
#else
    no_cuda_kernel(in.name);
#endif
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int4x2> || std::is_same_v<T, bool>) {
      HT_FAIL("{}: not defined for {}", in.name, x.describe());
    } else {
      using A = acc_t<T>;
      if constexpr (std::is_integral_v<A>) {
        cpu::unary_map<T>(out, x, [&](A v) -> A {
          return static_cast<A>(deriv ? derivative<double>(u, static_cast<double>(v), r)
                                      : forward_value<double>(u, static_cast<double>(v), r));
        });
      } else {
        with_unary(u, [&](auto op) {  // op is a compile-time constant, so the switch folds away in the loop
          if (deriv) cpu::unary_map<T>(out, x, [&](A v) { return derivative<A>(op, v, r); });
          else cpu::unary_map<T>(out, x, [&](A v) { return forward_value<A>(op, v, r); });
        });
      }
    }
  });
  return out;
}

// g * f'(x): on CUDA one fused kernel (rounded once) when g and x match in shape and floating dtype and no
// graph of the backward is being built; otherwise composed of ops (differentiable again).
Tensor grad_of(Unary u, const Tensor& g, const Tensor& x, ClampRange r) {
#ifdef HADATRAIN_CUDA
  const DType dt = x.dtype();
  if (x.is_cuda() && g.device() == x.device() && g.dtype() == dt && g.shape() == x.shape() &&
      (dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16) && !needs_grad({&g, &x})) {
    Tensor gx = empty(x.shape(), {dt, x.device()});
    cuda_ops::unary_backward({kernel_op(u), kernels::UnaryMode::derivative, r.lo, r.hi}, gx, g, x);
    return gx;
  }
#endif
  return mul(g, map(u, x, r, true));
}

Tensor unary(Unary u, const Tensor& x, ClampRange r = {}) {
  Tensor out = map(u, x.detach(), r, false);
  if (needs_grad({&x})) {
    // The output is map(u, x) again from the kept x: the same kernel on the same input, the same bits
    // (Note [Rebuilt inputs]).
    auto node = std::make_shared<FunctionNode>(
        std::string(info(u).name) + "Backward",
        [u, r](FunctionNode& self, std::vector<Tensor>&& g) {
          return std::vector<Tensor>{grad_of(u, g[0], self.saved(0), r)};
        },
        [u, r](const FunctionNode& self) { return map(u, self.saved(0), r, false); });
    node->save(x);
    connect(node, {&x}, {&out});
  }
  return out;
}

}  // namespace

Tensor neg(const Tensor& x) { return unary(Unary::neg, x); }
Tensor abs(const Tensor& x) { return unary(Unary::abs, x); }
Tensor exp(const Tensor& x) { return unary(Unary::exp, x); }
Tensor log(const Tensor& x) { return unary(Unary::log, x); }
Tensor sqrt(const Tensor& x) { return unary(Unary::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(Unary::rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary(Unary::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(Unary::sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(Unary::relu, x); }
Tensor gelu(const Tensor& x, GeluApprox approx) {
  return unary(approx == GeluApprox::tanh ? Unary::gelu_tanh : Unary::gelu_erf, x);
}
Tensor silu(const Tensor& x) { return unary(Unary::silu, x); }
Tensor clamp(const Tensor& x, double lo, double hi) {
  HT_CHECK(lo <= hi, "clamp: lo {} is greater than hi {}", lo, hi);
  return unary(Unary::clamp, x, {lo, hi});
}

}  // namespace ht
