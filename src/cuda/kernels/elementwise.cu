// Elementwise kernels: binary arithmetic, comparisons, unary math with the scalar ops, where.
// The formulas are the CPU reference's (src/ops/arithmetic.cpp, unary.cpp, compare.cpp, where.cpp), read
// side by side; the op is runtime data in the functor, so each dtype instantiates one flat and one
// strided kernel per family.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/map.cuh"

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

// ---- fast forms for 16-bit results --------------------------------------------------------------------
// Note [Fast GELU / SiLU for bf16 and f16]
// Results rounded to bf16 (8 significant bits) or f16 (11) do not need erff / tanhf / expf to full float
// accuracy, and those calls made the bf16 GELU compute-bound (about 0.7 of copy bandwidth). For bf16 / f16
// the hot kernels use forms with one hardware exp (ex2.approx) and one approximate division:
//   erf(|z|) = 1 - p(t) exp(-z^2), t = 1 / (1 + 0.3275911 |z|)  (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7),
//   0.5 x (1 + tanh(u)) = x sigmoid(2u),  1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u)),
// so the float result differs from the erff / tanhf one by a few 1e-7 absolute, far below a bf16 / f16 ulp
// of any value that is not itself tiny (tests compare within one ulp plus the dtype's absolute tolerance).
// f32 and f64 keep the exact library formulas of forward_value / derivative.

HT_DEV float fast_sigmoid(float v) { return __fdividef(1.0f, 1.0f + __expf(-v)); }

// Phi(x) = 0.5 (1 + erf(x / sqrt 2)) and the normal density phi(x), sharing exp(-x^2 / 2).
HT_DEV void fast_normal(float x, float& cdf, float& pdf) {
  const float e = __expf(-0.5f * x * x);
  const float t = __fdividef(1.0f, fmaf(0.3275911f * 0.7071067811865476f, fabsf(x), 1.0f));
  const float p = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f),
                           0.254829592f);
  const float tail = 0.5f * p * e;  // 0.5 erfc(|x| / sqrt 2)
  cdf = x < 0.0f ? tail : 1.0f - tail;
  pdf = e * 0.3989422804014327f;
}

HT_DEV float fast_gelu_tanh_inner(float x) { return 0.7978845608028654f * (x + 0.044715f * x * x * x); }

template <UnaryOp U>
HT_DEV float fast_forward(float x) {
  if constexpr (U == UnaryOp::gelu_erf) {
    float cdf, pdf;
    fast_normal(x, cdf, pdf);
    return x * cdf;
  } else if constexpr (U == UnaryOp::gelu_tanh) {
    return x * fast_sigmoid(2.0f * fast_gelu_tanh_inner(x));
  } else {
    static_assert(U == UnaryOp::silu);
    return x * fast_sigmoid(x);
  }
}

template <UnaryOp U>
HT_DEV float fast_derivative(float x) {
  if constexpr (U == UnaryOp::gelu_erf) {
    float cdf, pdf;
    fast_normal(x, cdf, pdf);
    return cdf + x * pdf;
  } else if constexpr (U == UnaryOp::gelu_tanh) {
    const float s = fast_sigmoid(2.0f * fast_gelu_tanh_inner(x));
    const float dinner = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    return s + 2.0f * x * s * (1.0f - s) * dinner;
  } else {
    static_assert(U == UnaryOp::silu);
    const float s = fast_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  }
}

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
template <UnaryOp U>
inline constexpr bool has_fast_form_v = U == UnaryOp::gelu_erf || U == UnaryOp::gelu_tanh || U == UnaryOp::silu;

// The hot unary ops with the op fixed at compile time (forward value, floating types only): the switch in
// forward_value folds away, so the per-element work is the formula itself. Same formulas as UnaryF (bf16 /
// f16 GELU and SiLU: the fast forms above); bf16 / f16 results are rounded by the hardware cvt
// (store_cast, the same bits but NaN payloads: see there).
template <class T, UnaryOp U>
struct FixedUnaryF {
  using A = acc_t<T>;
  A s0;
  HT_DEV T operator()(T tx) const {
    const A x = convert<A>(tx);
    if constexpr (U == UnaryOp::add_scalar) return store_cast<T>(x + s0);
    else if constexpr (U == UnaryOp::mul_scalar) return store_cast<T>(x * s0);
    else if constexpr (is_16bit_float_v<T> && has_fast_form_v<U>) return store_cast<T>(fast_forward<U>(x));
    else return store_cast<T>(forward_value<A>(U, x, A(0), A(0)));
  }
};

// ---- GELU (erf) forward, bf16 / f16 (Note [GELU forward kernel]) ----------------------------------------
// Note [GELU forward kernel]
// bf16 / f16 gelu (erf) forward, flat and aligned (f32 / f64, unaligned or strided launches take the generic
// kernels with fast_forward): gelu_erf_fwd, one block per kGeluPacks * 256 packs with all of a thread's packs
// loaded before any is computed (no grid-stride loop: the whole tensor in one launch of short blocks), and
// gelu_erf_lean: the same Abramowitz & Stegun 7.1.26 form as fast_forward with the constants folded (0.5 into
// the polynomial, -1/2 log2(e) into the exponent) and single-instruction rcp.approx / ex2.approx, about 12
// FP32 instructions and 2 MUFU per element instead of about 16 and 2; it differs from fast_forward by a few
// float ulps (results rounded to bf16 / f16 nearly always agree bit for bit). It replaced map1_flat with
// fast_forward<gelu_erf> (0.66 -> 0.78 of copy bandwidth on an H200, bf16 16640 x 1536).
constexpr int kGeluPacks = 4;

HT_DEV float rcp_approx(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
HT_DEV float ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// x Phi(x) with Phi's tail 0.5 erfc(|x| / sqrt 2) = p(t) exp(-x^2 / 2), t = 1 / (1 + 0.3275911 |x| / sqrt 2),
// p = 0.5 * the A&S polynomial (non-finite x as fast_forward: NaN stays NaN, +inf -> inf, -inf -> NaN).
HT_DEV float gelu_erf_lean(float x) {
  const float t = rcp_approx(fmaf(0.3275911f * 0.7071067811865476f, fabsf(x), 1.0f));
  float p = fmaf(t, 0.5f * 1.061405429f, 0.5f * -1.453152027f);
  p = fmaf(t, p, 0.5f * 1.421413741f);
  p = fmaf(t, p, 0.5f * -0.284496736f);
  p = fmaf(t, p, 0.5f * 0.254829592f);
  const float tail = p * t * ex2_approx(x * x * -0.7213475204444817f);  // -log2(e) / 2
  return x * (x < 0.0f ? tail : 1.0f - tail);
}

// The V results of a pack are rounded two at a time by cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 (the rounding of
// store_cast's cvt.rn) instead of store_cast per element (a cvt, a NaN test and patch, and the packing of
// halves: integer-pipe work that made the ALU the busiest pipe). A pack with a NaN result takes store_cast
// (the CPU's NaN code), so the bits are those of store_cast element by element.
template <class T, int V>
HT_DEV Pack<T, V> round_pack(const float (&y)[V]) {
  Pack<T, V> o;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  bool nan = false;
#pragma unroll
  for (int k = 0; k < V; ++k) nan = nan || y[k] != y[k];
  if (!nan) {
    uint32_t w[V / 2];
    cvt_pairs<T>(y, w);
    memcpy(&o, w, sizeof w);
    return o;
  }
#endif
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = store_cast<T>(y[k]);
  return o;
}

template <class T>
__global__ void gelu_erf_fwd(T* __restrict__ out, const T* __restrict__ in, int64_t nv, int64_t n) {
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  const P* pin = reinterpret_cast<const P*>(in);
  P* pout = reinterpret_cast<P*>(out);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (kGeluPacks * 256) + threadIdx.x;
  P v[kGeluPacks];
#pragma unroll
  for (int k = 0; k < kGeluPacks; ++k)
    if (base + k * 256 < nv) v[k] = pin[base + k * 256];
#pragma unroll
  for (int k = 0; k < kGeluPacks; ++k) {
    if (base + k * 256 < nv) {
      float y[V];
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] = gelu_erf_lean(convert<float>(v[k].v[j]));
      pout[base + k * 256] = round_pack<T, V>(y);
    }
  }
  const int64_t r = nv * V + global_thread();  // the last n % V elements
  if (r < n) out[r] = store_cast<T>(gelu_erf_lean(convert<float>(in[r])));
}

template <class T>
void launch_gelu_erf(T* out, const T* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  const int64_t nv = n / V;
  const int64_t blocks = std::max<int64_t>(1, (nv + kGeluPacks * 256 - 1) / (kGeluPacks * 256));
  gelu_erf_fwd<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, in, nv, n);
  HT_CHECK_LAUNCH("gelu_erf_fwd");
}

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
    case UnaryOp::gelu_erf:
      if constexpr (is_16bit_float_v<T>) {
        launch_gelu_erf<T>(out, in, args.layout.numel, stream);
        return true;
      }
      return run(FixedUnaryF<T, UnaryOp::gelu_erf>{s0});
    case UnaryOp::gelu_tanh: return run(FixedUnaryF<T, UnaryOp::gelu_tanh>{s0});
    case UnaryOp::silu: return run(FixedUnaryF<T, UnaryOp::silu>{s0});
    case UnaryOp::add_scalar: return run(FixedUnaryF<T, UnaryOp::add_scalar>{s0});
    case UnaryOp::mul_scalar: return run(FixedUnaryF<T, UnaryOp::mul_scalar>{s0});
    default: return false;
  }
}

// ---- fused backward: gx = g * f'(x) ----------------------------------------------------------------------

// Any unary math op (runtime op), rounded once.
template <class T>
struct GradF {
  using A = acc_t<T>;
  UnaryOp op;
  A lo, hi;
  HT_DEV T operator()(T tg, T tx) const { return convert<T>(convert<A>(tg) * derivative<A>(op, convert<A>(tx), lo, hi)); }
};

// The hot ops with the op fixed at compile time (flat, aligned launches).
template <class T, UnaryOp U>
struct FixedGradF {
  using A = acc_t<T>;
  HT_DEV T operator()(T tg, T tx) const {
    const A x = convert<A>(tx);
    if constexpr (is_16bit_float_v<T> && has_fast_form_v<U>) return store_cast<T>(convert<A>(tg) * fast_derivative<U>(x));
    else return store_cast<T>(convert<A>(tg) * derivative<A>(U, x, A(0), A(0)));
  }
};

template <class T>
bool launch_fixed_grad(UnaryOp op, const BinaryArgs& args, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  if (!args.layout.flat() || !aligned_to(args.out, sizeof(T) * V) || !aligned_to(args.a, sizeof(T) * V) ||
      !aligned_to(args.b, sizeof(T) * V))
    return false;
  T* out = static_cast<T*>(args.out);
  const T* g = static_cast<const T*>(args.a);
  const T* x = static_cast<const T*>(args.b);
  auto run = [&](auto f) {
    launch_map2_flat(out, g, x, args.layout.numel, f, stream, "unary_grad_fixed_kernel");
    return true;
  };
  switch (op) {
    case UnaryOp::relu: return run(FixedGradF<T, UnaryOp::relu>{});
    case UnaryOp::gelu_erf: return run(FixedGradF<T, UnaryOp::gelu_erf>{});
    case UnaryOp::gelu_tanh: return run(FixedGradF<T, UnaryOp::gelu_tanh>{});
    case UnaryOp::silu: return run(FixedGradF<T, UnaryOp::silu>{});
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

void launch_unary_backward(DType dt, UnaryOp op, double s0, double s1, const BinaryArgs& args, cudaStream_t stream) {
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (args.layout.numel == 0) return;
    if constexpr (!std::is_same_v<T, double>) {
      if (launch_fixed_grad<T>(op, args, stream)) return;
    }
    using A = acc_t<T>;
    launch_map2(static_cast<T*>(args.out), static_cast<const T*>(args.a), static_cast<const T*>(args.b), args.layout,
                GradF<T>{op, static_cast<A>(s0), static_cast<A>(s1)}, stream, "unary_grad_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_unary_backward", dt);
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
