// Fused SwiGLU forward and backward (swiglu.cuh). Each thread moves 16-byte packs of every operand.
//
// Note [SwiGLU bits]
// The kernels reproduce, bit for bit, what CUDA's silu op and mul op give one after the other (so fusing changes
// no result): float arithmetic for bf16 / f16 / f32 (double for f64); silu and its derivative in the forms of
// cuda/kernels/elementwise.cu (bf16 / f16: the fast sigmoid 1 / (1 + e^-x) with __expf and __fdividef, Note
// [Fast GELU / SiLU for bf16 and f16]; f32 / f64: x / (1 + exp(-x)) and s (1 + x (1 - s)) with the library exp);
// the intermediate silu(g) and dy * u rounded to the dtype as the separate ops store them. Products of two
// bf16 / f16 values are exact in float, so the one rounding of each product matches the mul op's.
#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/swiglu.cuh"

namespace ht::kernels {
namespace {

template <class T>
inline constexpr bool is_16bit_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// silu(x) and silu'(x) in the compute type A of T (Note [SwiGLU bits]).
template <class T, class A>
HT_DEV A silu_of(A x) {
  if constexpr (is_16bit_v<T>) return x * __fdividef(1.0f, 1.0f + __expf(-x));
  else if constexpr (std::is_same_v<A, float>) return x / (1.0f + expf(-x));
  else return x / (1.0 + exp(-x));
}

template <class T, class A>
HT_DEV A silu_grad_of(A x) {
  A s;
  if constexpr (is_16bit_v<T>) s = __fdividef(1.0f, 1.0f + __expf(-x));
  else if constexpr (std::is_same_v<A, float>) s = 1.0f / (1.0f + expf(-x));
  else s = 1.0 / (1.0 + exp(-x));
  return s * (A(1) + x * (A(1) - s));
}

// The rounding of the separate ops: bf16 / f16 by the hardware cvt (store_cast), f32 / f64 exact.
template <class T, class A>
HT_DEV T rnd(A v) { return store_cast<T>(v); }

template <class T>
HT_DEV T swiglu_value(T g, T u) {
  using A = acc_t<T>;
  const T s = rnd<T>(silu_of<T>(convert<A>(g)));
  return rnd<T>(convert<A>(s) * convert<A>(u));
}

template <class T>
HT_DEV void swiglu_grads(T dy, T g, T u, T& dg, T& du) {
  using A = acc_t<T>;
  const A x = convert<A>(g), d = convert<A>(dy);
  const T s = rnd<T>(silu_of<T>(x));
  du = rnd<T>(d * convert<A>(s));
  const T ds = rnd<T>(d * convert<A>(u));
  dg = rnd<T>(convert<A>(ds) * silu_grad_of<T>(x));
}

// V elements per thread and step (V = 1: unaligned buffers); the last n % V elements go one per thread.
template <class T, int V>
__global__ void swiglu_fwd_kernel(T* y, const T* g, const T* u, int64_t n) {
  const int64_t packs = n / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, V> pg = reinterpret_cast<const Pack<T, V>*>(g)[i];
    const Pack<T, V> pu = reinterpret_cast<const Pack<T, V>*>(u)[i];
    Pack<T, V> py;
#pragma unroll
    for (int k = 0; k < V; ++k) py.v[k] = swiglu_value(pg.v[k], pu.v[k]);
    reinterpret_cast<Pack<T, V>*>(y)[i] = py;
  }
  const int64_t r = packs * V + first;
  if (r < n) y[r] = swiglu_value(g[r], u[r]);
}

template <class T, int V>
__global__ void swiglu_bwd_kernel(T* dg, T* du, const T* dy, const T* g, const T* u, int64_t n) {
  const int64_t packs = n / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, V> pd = reinterpret_cast<const Pack<T, V>*>(dy)[i];
    const Pack<T, V> pg = reinterpret_cast<const Pack<T, V>*>(g)[i];
    const Pack<T, V> pu = reinterpret_cast<const Pack<T, V>*>(u)[i];
    Pack<T, V> og, ou;
#pragma unroll
    for (int k = 0; k < V; ++k) swiglu_grads(pd.v[k], pg.v[k], pu.v[k], og.v[k], ou.v[k]);
    reinterpret_cast<Pack<T, V>*>(dg)[i] = og;
    reinterpret_cast<Pack<T, V>*>(du)[i] = ou;
  }
  const int64_t r = packs * V + first;
  if (r < n) swiglu_grads(dy[r], g[r], u[r], dg[r], du[r]);
}

// Blocks for `packs` packs, and at least enough threads for the n % V tail.
unsigned blocks_for(int64_t packs) { return cuda::grid_for(packs < 16 ? 16 : packs); }

}  // namespace

void launch_swiglu_forward(DType dt, void* y, const void* g, const void* u, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = static_cast<int>(16 / sizeof(T));
    auto* py = static_cast<T*>(y);
    const auto* pg = static_cast<const T*>(g);
    const auto* pu = static_cast<const T*>(u);
    if (aligned_to(y, 16) && aligned_to(g, 16) && aligned_to(u, 16))
      swiglu_fwd_kernel<T, V><<<blocks_for(n / V), cuda::kBlock, 0, stream>>>(py, pg, pu, n);
    else
      swiglu_fwd_kernel<T, 1><<<blocks_for(n), cuda::kBlock, 0, stream>>>(py, pg, pu, n);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("swiglu", dt);
  HT_CHECK_LAUNCH("swiglu_forward");
}

void launch_swiglu_backward(DType dt, const SwigluBackwardArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = static_cast<int>(16 / sizeof(T));
    auto* dg = static_cast<T*>(a.dg);
    auto* du = static_cast<T*>(a.du);
    const auto* dy = static_cast<const T*>(a.dy);
    const auto* g = static_cast<const T*>(a.g);
    const auto* u = static_cast<const T*>(a.u);
    if (aligned_to(dg, 16) && aligned_to(du, 16) && aligned_to(dy, 16) && aligned_to(g, 16) && aligned_to(u, 16))
      swiglu_bwd_kernel<T, V><<<blocks_for(a.n / V), cuda::kBlock, 0, stream>>>(dg, du, dy, g, u, a.n);
    else
      swiglu_bwd_kernel<T, 1><<<blocks_for(a.n), cuda::kBlock, 0, stream>>>(dg, du, dy, g, u, a.n);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("swiglu", dt);
  HT_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace ht::kernels
