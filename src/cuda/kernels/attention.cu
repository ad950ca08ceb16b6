// Scaled-dot-product attention kernels (see attention.cuh): one block per query row (b, h, t).
// Forward: three passes over the visible keys (max score, sum of exponentials, weighted sum of v in
// tiles of blockDim keys) recomputing each score q . k[s]; nothing of size S is stored.
// Backward: rowsum(dP * P) in one pass, then per tile of keys P and dS = P (dP - rowsum) in shared
// memory; dQ accumulates in shared memory, dK and dV are added with atomicAdd into acc-precision buffers.
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

constexpr int kAttnBlock = 128;

template <class T> struct AttnAcc { using type = float; };
template <> struct AttnAcc<float> { using type = double; };
template <> struct AttnAcc<double> { using type = double; };
template <class T> using lse_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ inline float exp_(float x) { return expf(x); }
__device__ inline double exp_(double x) { return ::exp(x); }
__device__ inline float log_(float x) { return logf(x); }
__device__ inline double log_(double x) { return ::log(x); }
__device__ inline float max_(float a, float b) { return fmaxf(a, b); }
__device__ inline double max_(double a, double b) { return fmax(a, b); }

// Reduces v over the block (all threads get the result). `red` holds 32 values.
template <class A, class Op>
__device__ A block_reduce(A v, Op op, A* red) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();  // an earlier call's readers are done with red
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) v = op(v, red[w]);
  return v;
}

// The row this block works on and its operands' base offsets.
struct Row {
  int64_t row, t, kv;  // kv: (b, h / group) as a flat kv-head index
  int64_t visible;     // keys [0, visible) are seen

  __device__ explicit Row(const AttnShape& s) {
    row = blockIdx.x;
    t = row % s.T;
    const int64_t bh = row / s.T, h = bh % s.Hq, b = bh / s.Hq;
    kv = b * s.Hkv + h / (s.Hq / s.Hkv);
    if (s.causal) {
      const int64_t n = t + s.S - s.T + 1;
      visible = n < 0 ? 0 : (n > s.S ? s.S : n);
    } else {
      visible = s.S;
    }
  }
};

template <class T, class A>
__device__ A dot(const A* x, const T* y, int64_t n) {
  A acc = 0;
  for (int64_t e = 0; e < n; ++e) acc += x[e] * convert<A>(y[e]);
  return acc;
}

template <class T>
__global__ void __launch_bounds__(kAttnBlock) attention_forward_kernel(T* out, lse_t<T>* lse, const T* q, const T* k,
                                                                       const T* v, AttnShape s) {
  using A = typename AttnAcc<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* q_s = reinterpret_cast<A*>(smem_raw);  // (D)
  A* p_s = q_s + s.D;                       // (kAttnBlock)
  A* o_s = p_s + kAttnBlock;                // (Dv)
  __shared__ A red[32];
  const Row r(s);
  const int64_t n = r.visible;
  T* orow = out + r.row * s.Dv;
  if (n == 0) {  // empty row: output 0, lse -inf
    for (int64_t e = threadIdx.x; e < s.Dv; e += blockDim.x) orow[e] = convert<T>(A(0));
    if (threadIdx.x == 0) lse[r.row] = -INFINITY;
    return;
  }
  const A scale = static_cast<A>(s.scale);
  for (int64_t e = threadIdx.x; e < s.D; e += blockDim.x) q_s[e] = convert<A>(q[r.row * s.D + e]);
  for (int64_t e = threadIdx.x; e < s.Dv; e += blockDim.x) o_s[e] = 0;
  __syncthreads();
  const T* krows = k + r.kv * s.S * s.D;
  const T* vrows = v + r.kv * s.S * s.Dv;
  auto score = [&](int64_t key) { return scale * dot(q_s, krows + key * s.D, s.D); };

  A mx = -INFINITY;
  for (int64_t key = threadIdx.x; key < n; key += blockDim.x) mx = max_(mx, score(key));
  mx = block_reduce(mx, [](A a, A b) { return max_(a, b); }, red);
  A denom = 0;
  for (int64_t key = threadIdx.x; key < n; key += blockDim.x) denom += exp_(score(key) - mx);
  denom = block_reduce(denom, [](A a, A b) { return a + b; }, red);
  const A row_lse = mx + log_(denom);

  for (int64_t s0 = 0; s0 < n; s0 += blockDim.x) {
    const int64_t key = s0 + threadIdx.x;
    p_s[threadIdx.x] = key < n ? exp_(score(key) - row_lse) : A(0);
    __syncthreads();
    const int64_t cnt = n - s0 < blockDim.x ? n - s0 : blockDim.x;
    for (int64_t e = threadIdx.x; e < s.Dv; e += blockDim.x) {
      A acc = 0;
      for (int64_t i = 0; i < cnt; ++i) acc += p_s[i] * convert<A>(vrows[(s0 + i) * s.Dv + e]);
      o_s[e] += acc;
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < s.Dv; e += blockDim.x) orow[e] = convert<T>(o_s[e]);
  if (threadIdx.x == 0) lse[r.row] = static_cast<lse_t<T>>(row_lse);
}

template <class T>
__global__ void __launch_bounds__(kAttnBlock)
    attention_backward_kernel(T* dq, typename AttnAcc<T>::type* dk, typename AttnAcc<T>::type* dv, const T* q,
                              const T* k, const T* v, const lse_t<T>* lse, const T* dout, AttnShape s) {
  using A = typename AttnAcc<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* q_s = reinterpret_cast<A*>(smem_raw);  // (D)
  A* dq_s = q_s + s.D;                      // (D)
  A* do_s = dq_s + s.D;                     // (Dv)
  A* p_s = do_s + s.Dv;                     // (kAttnBlock)
  A* ds_s = p_s + kAttnBlock;               // (kAttnBlock)
  __shared__ A red[32];
  const Row r(s);
  const int64_t n = r.visible;
  T* dqrow = dq + r.row * s.D;
  if (n == 0) {  // empty rows pass no gradient
    for (int64_t e = threadIdx.x; e < s.D; e += blockDim.x) dqrow[e] = convert<T>(A(0));
    return;
  }
  const A scale = static_cast<A>(s.scale);
  const A row_lse = static_cast<A>(lse[r.row]);
  for (int64_t e = threadIdx.x; e < s.D; e += blockDim.x) {
    q_s[e] = convert<A>(q[r.row * s.D + e]);
    dq_s[e] = 0;
  }
  for (int64_t e = threadIdx.x; e < s.Dv; e += blockDim.x) do_s[e] = convert<A>(dout[r.row * s.Dv + e]);
  __syncthreads();
  const T* krows = k + r.kv * s.S * s.D;
  const T* vrows = v + r.kv * s.S * s.Dv;
  A* dkrows = dk + r.kv * s.S * s.D;
  A* dvrows = dv + r.kv * s.S * s.Dv;
  auto prob = [&](int64_t key) { return exp_(scale * dot(q_s, krows + key * s.D, s.D) - row_lse); };
  auto dprob = [&](int64_t key) { return dot(do_s, vrows + key * s.Dv, s.Dv); };

  A row = 0;  // rowsum(dP * P)
  for (int64_t key = threadIdx.x; key < n; key += blockDim.x) row += prob(key) * dprob(key);
  row = block_reduce(row, [](A a, A b) { return a + b; }, red);

  for (int64_t s0 = 0; s0 < n; s0 += blockDim.x) {
    const int64_t key = s0 + threadIdx.x;
    if (key < n) {
      const A p = prob(key);
      p_s[threadIdx.x] = p;
      ds_s[threadIdx.x] = p * (dprob(key) - row);
    }
    __syncthreads();
    const int64_t cnt = n - s0 < blockDim.x ? n - s0 : blockDim.x;
    for (int64_t e = threadIdx.x; e < s.D; e += blockDim.x) {
      A acc = 0;
      for (int64_t i = 0; i < cnt; ++i) acc += ds_s[i] * convert<A>(krows[(s0 + i) * s.D + e]);
      dq_s[e] += scale * acc;
    }
    for (int64_t idx = threadIdx.x; idx < cnt * s.D; idx += blockDim.x) {
      const int64_t i = idx / s.D, e = idx % s.D;
      atomicAdd(&dkrows[(s0 + i) * s.D + e], scale * ds_s[i] * q_s[e]);
    }
    for (int64_t idx = threadIdx.x; idx < cnt * s.Dv; idx += blockDim.x) {
      const int64_t i = idx / s.Dv, e = idx % s.Dv;
      atomicAdd(&dvrows[(s0 + i) * s.Dv + e], p_s[i] * do_s[e]);
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < s.D; e += blockDim.x) dqrow[e] = convert<T>(dq_s[e]);
}

}  // namespace

void launch_attention_forward(DType dt, void* out, void* lse, const void* q, const void* k, const void* v,
                              const AttnShape& s, cudaStream_t stream) {
  const int64_t rows = s.B * s.Hq * s.T;
  if (rows == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = typename AttnAcc<T>::type;
    const std::size_t smem = static_cast<std::size_t>(s.D + kAttnBlock + s.Dv) * sizeof(A);
    attention_forward_kernel<T><<<static_cast<unsigned>(rows), kAttnBlock, smem, stream>>>(
        static_cast<T*>(out), static_cast<lse_t<T>*>(lse), static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), s);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("attention_forward", dt);
  HT_CHECK_LAUNCH("attention_forward");
}

void launch_attention_backward(DType dt, const AttnGrads& g, const void* q, const void* k, const void* v,
                               const void* lse, const void* dout, const AttnShape& s, cudaStream_t stream) {
  const int64_t rows = s.B * s.Hq * s.T;
  if (rows == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = typename AttnAcc<T>::type;
    const std::size_t smem = static_cast<std::size_t>(2 * s.D + s.Dv + 2 * kAttnBlock) * sizeof(A);
    attention_backward_kernel<T><<<static_cast<unsigned>(rows), kAttnBlock, smem, stream>>>(
        static_cast<T*>(g.dq), static_cast<A*>(g.dk_acc), static_cast<A*>(g.dv_acc), static_cast<const T*>(q),
        static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const lse_t<T>*>(lse),
        static_cast<const T*>(dout), s);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("attention_backward", dt);
  HT_CHECK_LAUNCH("attention_backward");
}

}  // namespace ht::kernels
