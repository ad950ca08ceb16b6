// Elementwise kernels: binary arithmetic, comparisons, unary math with the scalar ops, where.
// The formulas are the CPU reference's (src/ops/arithmetic.cpp, unary.cpp, compare.cpp, where.cpp), read
// side by side; the op is runtime data in the functor, so each dtype instantiates one flat and one
// strided kernel per family.
#include "kernels/elementwise.h"
#include "kernels/map.cuh"

namespace ht::kernels {
namespace {

// ---- binary arithmetic --------------------------------------------------------------------------------

template <class T>
struct ArithF {
  using A = acc_t<T>;
  BinaryOp op;
  A alpha;
  HT_DEV T operator()(T ta, T tb) const {
    const A x = convert<A>(ta), y = convert<A>(tb);
    A r = x;
    switch (op) {
      case BinaryOp::add: r = x + y; break;
      case BinaryOp::sub: r = x - y; break;
      case BinaryOp::mul: r = x * y; break;
      case BinaryOp::div: r = (std::is_integral_v<A> && y == A(0)) ? A(0) : x / y; break;  // host checks ints
      case BinaryOp::max: r = (x != x || x > y) ? x : y; break;  // NaN propagates
      case BinaryOp::min: r = (x != x || x < y) ? x : y; break;
      case BinaryOp::add_scaled: r = x + alpha * y; break;
    }
    return convert<T>(r);
  }
};

template <class T>
struct CompareF {
  using A = acc_t<T>;
  CompareOp op;
  HT_DEV bool operator()(T ta, T tb) const {
    const A x = convert<A>(ta), y = convert<A>(tb);
    switch (op) {
      case CompareOp::eq: return x == y;
      case CompareOp::ne: return x != y;
      case CompareOp::lt: return x < y;
      case CompareOp::le: return x <= y;
      case CompareOp::gt: return x > y;
      case CompareOp::ge: return x >= y;
    }
    return false;
  }
};

// ---- unary math ---------------------------------------------------------------------------------------

HT_DEV float m_exp(float x) { return expf(x); }
HT_DEV double m_exp(double x) { return exp(x); }
HT_DEV float m_log(float x) { return logf(x); }
HT_DEV double m_log(double x) { return log(x); }
HT_DEV float m_sqrt(float x) { return sqrtf(x); }
HT_DEV double m_sqrt(double x) { return sqrt(x); }
HT_DEV float m_tanh(float x) { return tanhf(x); }
HT_DEV double m_tanh(double x) { return tanh(x); }
HT_DEV float m_erf(float x) { return erff(x); }
HT_DEV double m_erf(double x) { return erf(x); }

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;

// f(x) for the unary math ops (A = float or double).
template <class A>
HT_DEV A forward_value(UnaryOp u, A x, A lo, A hi) {
  switch (u) {
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return x < 0 ? -x : x;
    case UnaryOp::exp: return m_exp(x);
    case UnaryOp::log: return m_log(x);
    case UnaryOp::sqrt: return m_sqrt(x);
    case UnaryOp::rsqrt: return A(1) / m_sqrt(x);
    case UnaryOp::tanh: return m_tanh(x);
    case UnaryOp::sigmoid: return A(1) / (A(1) + m_exp(-x));
    case UnaryOp::relu: return (x > 0 || x != x) ? x : A(0);  // NaN propagates
    case UnaryOp::gelu_erf: return A(0.5) * x * (A(1) + m_erf(x * A(0.7071067811865476)));
    case UnaryOp::gelu_tanh: return A(0.5) * x * (A(1) + m_tanh(A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x)));
    case UnaryOp::silu: return x / (A(1) + m_exp(-x));
    case UnaryOp::clamp: return x < lo ? lo : (x > hi ? hi : x);
    default: return x;
  }
}

// f'(x)
template <class A>
HT_DEV A derivative(UnaryOp u, A x, A lo, A hi) {
  switch (u) {
    case UnaryOp::neg: return A(-1);
    case UnaryOp::abs: return x > 0 ? A(1) : (x < 0 ? A(-1) : A(0));
    case UnaryOp::exp: return m_exp(x);
    case UnaryOp::log: return A(1) / x;
    case UnaryOp::sqrt: return A(0.5) / m_sqrt(x);
    case UnaryOp::rsqrt: return A(-0.5) / (x * m_sqrt(x));
    case UnaryOp::tanh: {
      const A t = m_tanh(x);
      return A(1) - t * t;
    }
    case UnaryOp::sigmoid: {
      const A s = A(1) / (A(1) + m_exp(-x));
      return s * (A(1) - s);
    }
    case UnaryOp::relu: return x > 0 ? A(1) : A(0);
    case UnaryOp::gelu_erf: {
      const A cdf = A(0.5) * (A(1) + m_erf(x * A(0.7071067811865476)));
      const A pdf = m_exp(A(-0.5) * x * x) * A(0.3989422804014327);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const A inner = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
      const A t = m_tanh(inner);
      const A dinner = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluC) * x * x);
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
    }
    case UnaryOp::silu: {
      const A s = A(1) / (A(1) + m_exp(-x));
      return s * (A(1) + x * (A(1) - s));
    }
    case UnaryOp::clamp: return (x >= lo && x <= hi) ? A(1) : A(0);
    default: return A(0);
  }
}

template <class A>
HT_DEV A math(UnaryOp u, UnaryMode mode, A x, A lo, A hi) {
  return mode == UnaryMode::derivative ? derivative<A>(u, x, lo, hi) : forward_value<A>(u, x, lo, hi);
}

// The unary math ops defined for integers (the op file rejects the others), in double like the CPU path.
HT_DEV double integer_math(UnaryOp u, UnaryMode mode, double x, double lo, double hi) {
  const bool d = mode == UnaryMode::derivative;
  switch (u) {
    case UnaryOp::neg: return d ? -1.0 : -x;
    case UnaryOp::abs: return d ? (x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0)) : (x < 0 ? -x : x);
    case UnaryOp::relu: return d ? (x > 0 ? 1.0 : 0.0) : (x > 0 ? x : 0.0);
    case UnaryOp::clamp: return d ? ((x >= lo && x <= hi) ? 1.0 : 0.0) : (x < lo ? lo : (x > hi ? hi : x));
    default: return 0.0;
  }
}

template <class T>
struct UnaryF {
  using A = acc_t<T>;
  UnaryOp op;
  UnaryMode mode;
  double s0, s1;
  HT_DEV T operator()(T tx) const {
    const A x = convert<A>(tx);
    A r;
    switch (op) {
      case UnaryOp::add_scalar: r = x + static_cast<A>(s0); break;
      case UnaryOp::mul_scalar: r = x * static_cast<A>(s0); break;
      case UnaryOp::rsub_scalar: r = static_cast<A>(s0) - x; break;
      case UnaryOp::pow_scalar: r = static_cast<A>(pow(static_cast<double>(x), s0)); break;
      default:
        if constexpr (std::is_integral_v<A>) {  // integers: neg abs relu clamp only, in double like the CPU
          r = static_cast<A>(integer_math(op, mode, static_cast<double>(x), s0, s1));
        } else {
          r = math<A>(op, mode, x, static_cast<A>(s0), static_cast<A>(s1));
        }
    }
    return convert<T>(r);
  }
};

// The hot unary ops with the op fixed at compile time (forward value, floating types only): the switch in
// forward_value folds away, so the per-element work is the formula itself. Same formulas as UnaryF; bf16 /
// f16 results are rounded by the hardware cvt (store_cast, the same bits but NaN payloads: see there).
template <class T, UnaryOp U>
struct FixedUnaryF {
  using A = acc_t<T>;
  A s0;
  HT_DEV T operator()(T tx) const {
    const A x = convert<A>(tx);
    if constexpr (U == UnaryOp::add_scalar) return store_cast<T>(x + s0);
    else if constexpr (U == UnaryOp::mul_scalar) return store_cast<T>(x * s0);
    else return store_cast<T>(forward_value<A>(U, x, A(0), A(0)));
  }
};

// Launches the fixed-op kernel when args is a flat, aligned forward launch of a hot op; false otherwise.
template <class T>
bool launch_fixed_unary(const UnaryArgs& args, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  if (args.mode != UnaryMode::value || !args.layout.flat() || !aligned_to(args.out, sizeof(T) * V) ||
      !aligned_to(args.in, sizeof(T) * V))
    return false;
  T* out = static_cast<T*>(args.out);
  const T* in = static_cast<const T*>(args.in);
  const acc_t<T> s0 = static_cast<acc_t<T>>(args.s0);
  auto run = [&](auto f) {  // flat kernel only: the checks above chose it
    launch_map1_flat(out, in, args.layout.numel, f, stream, "unary_fixed_kernel");
    return true;
  };
  switch (args.op) {
    case UnaryOp::relu: return run(FixedUnaryF<T, UnaryOp::relu>{s0});
    case UnaryOp::gelu_erf: return run(FixedUnaryF<T, UnaryOp::gelu_erf>{s0});
    case UnaryOp::gelu_tanh: return run(FixedUnaryF<T, UnaryOp::gelu_tanh>{s0});
    case UnaryOp::silu: return run(FixedUnaryF<T, UnaryOp::silu>{s0});
    case UnaryOp::add_scalar: return run(FixedUnaryF<T, UnaryOp::add_scalar>{s0});
    case UnaryOp::mul_scalar: return run(FixedUnaryF<T, UnaryOp::mul_scalar>{s0});
    default: return false;
  }
}

// ---- where --------------------------------------------------------------------------------------------

template <class U>  // an unsigned integer of the element's size: where copies bits
__global__ void where_kernel(U* out, const bool* cond, const U* a, const U* b, Layout<4> l) {
  for (int64_t i = global_thread(); i < l.numel; i += grid_threads()) {
    int64_t off[4];
    offsets_of(l, i, off);
    out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class U>
void where_as(const WhereArgs& w, cudaStream_t stream) {
  where_kernel<U><<<cuda::grid_for(w.layout.numel), cuda::kBlock, 0, stream>>>(
      static_cast<U*>(w.out), w.cond, static_cast<const U*>(w.a), static_cast<const U*>(w.b), w.layout);
  HT_CHECK_LAUNCH("where_kernel");
}

}  // namespace

void launch_binary(DType dt, BinaryOp op, double alpha, const BinaryArgs& args, cudaStream_t stream) {
  const bool ok = visit_compute_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const ArithF<T> f{op, static_cast<acc_t<T>>(alpha)};
    launch_map2(static_cast<T*>(args.out), static_cast<const T*>(args.a), static_cast<const T*>(args.b), args.layout,
                f, stream, "binary_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_binary", dt);
}

void launch_compare(DType dt, CompareOp op, const BinaryArgs& args, cudaStream_t stream) {
  const bool ok = visit_compute_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    launch_map2(static_cast<bool*>(args.out), static_cast<const T*>(args.a), static_cast<const T*>(args.b),
                args.layout, CompareF<T>{op}, stream, "compare_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_compare", dt);
}

void launch_unary(DType dt, const UnaryArgs& args, cudaStream_t stream) {
  const bool ok = visit_compute_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      if (launch_fixed_unary<T>(args, stream)) return;
    }
    launch_map1(static_cast<T*>(args.out), static_cast<const T*>(args.in), args.layout,
                UnaryF<T>{args.op, args.mode, args.s0, args.s1}, stream, "unary_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_unary", dt);
}

void launch_where(std::size_t itemsize, const WhereArgs& args, cudaStream_t stream) {
  if (args.layout.numel == 0) return;
  switch (itemsize) {
    case 1: return where_as<uint8_t>(args, stream);
    case 2: return where_as<uint16_t>(args, stream);
    case 4: return where_as<uint32_t>(args, stream);
    case 8: return where_as<uint64_t>(args, stream);
    default: HT_UNSUPPORTED_DTYPE("launch_where", -1);
  }
}

}  // namespace ht::kernels
