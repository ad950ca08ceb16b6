// Fused multi-tensor SGD and AdamW steps (see optim.cuh). blockIdx.y picks the tensor; the blocks along x
// stride over its elements. Every operation is an explicitly rounded double op (__dadd_rn, __dmul_rn,
// __ddiv_rn, __dsqrt_rn) in the CPU reference's order, so nvcc cannot fuse them into FMAs.
#include <cstring>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/optim.cuh"

namespace ht::kernels {
namespace {

__device__ inline double add(double a, double b) { return __dadd_rn(a, b); }
__device__ inline double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ inline double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ inline double div(double a, double b) { return __ddiv_rn(a, b); }

template <class T>
__global__ void sgd_step_kernel(const __grid_constant__ OptimBatch<SgdTensor> tensors, const SgdHyper* hp) {
  const SgdTensor& d = tensors.t[blockIdx.y];
  const SgdHyper h = *hp;
  T* p = static_cast<T*>(d.p);
  const T* g = static_cast<const T*>(d.g);
  T* buf = static_cast<T*>(d.buf);
  const double one_minus_damp = 1.0 - h.dampening;
  const double lr = mul(h.lr, d.lr_scale);  // the CPU's lr * lr_scale
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < d.n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double pk = static_cast<double>(p[k]);
    double step = add(static_cast<double>(g[k]), mul(d.weight_decay, pk));
    if (buf) {
      const double b = d.first ? step : add(mul(h.momentum, static_cast<double>(buf[k])), mul(one_minus_damp, step));
      buf[k] = static_cast<T>(b);
      step = h.nesterov ? add(step, mul(h.momentum, b)) : b;
    }
    p[k] = static_cast<T>(sub(pk, mul(lr, step)));
  }
}

// One AdamW element update: the CPU reference's operations in its order (see the file comment).
template <class T>
__device__ inline void adamw_element(T& p, T g, T& m, T& v, const AdamWHyper& h, double lr, double decay) {
  const double omb1 = 1 - h.beta1, omb2 = 1 - h.beta2;
  const double gk = static_cast<double>(g);
  const double mk = add(mul(h.beta1, static_cast<double>(m)), mul(omb1, gk));
  const double vk = add(mul(h.beta2, static_cast<double>(v)), mul(mul(omb2, gk), gk));
  m = static_cast<T>(mk);
  v = static_cast<T>(vk);
  const double denom = add(__dsqrt_rn(div(vk, h.bc2)), h.eps);
  p = static_cast<T>(sub(mul(static_cast<double>(p), decay), div(mul(lr, div(mk, h.bc1)), denom)));
}

// Each thread updates V-element packs (16 bytes of p, g, m and v each: more bytes in flight per thread) while
// all four buffers of its tensor are 16-byte aligned, then the remaining elements (all of them when not
// aligned) one at a time; every element takes adamw_element either way.
template <class T>
__global__ void adamw_step_kernel(const __grid_constant__ OptimBatch<AdamWTensor> tensors, const AdamWHyper* hp) {
  constexpr int V = static_cast<int>(16 / sizeof(T));
  const AdamWTensor& d = tensors.t[blockIdx.y];
  const AdamWHyper h = *hp;
  const double lr = mul(h.lr, d.lr_scale);                 // the CPU's lr * lr_scale
  const double decay = sub(1.0, mul(lr, d.weight_decay));  // the CPU's 1 - lr * wd (exactly 1 when wd = 0)
  T* p = static_cast<T*>(d.p);
  const T* g = static_cast<const T*>(d.g);
  T* m = static_cast<T*>(d.m);
  T* v = static_cast<T*>(d.v);
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (aligned_to(p, 16) && aligned_to(g, 16) && aligned_to(m, 16) && aligned_to(v, 16)) {
    const int64_t packs = d.n / V;
    for (int64_t i = first; i < packs; i += stride) {
      Pack<T, V> pp = reinterpret_cast<const Pack<T, V>*>(p)[i];
      const Pack<T, V> pg = reinterpret_cast<const Pack<T, V>*>(g)[i];
      Pack<T, V> pm = reinterpret_cast<const Pack<T, V>*>(m)[i];
      Pack<T, V> pv = reinterpret_cast<const Pack<T, V>*>(v)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) adamw_element(pp.v[k], pg.v[k], pm.v[k], pv.v[k], h, lr, decay);
      reinterpret_cast<Pack<T, V>*>(p)[i] = pp;
      reinterpret_cast<Pack<T, V>*>(m)[i] = pm;
      reinterpret_cast<Pack<T, V>*>(v)[i] = pv;
    }
    done = packs * V;
  }
  for (int64_t k = done + first; k < d.n; k += stride) adamw_element(p[k], g[k], m[k], v[k], h, lr, decay);
}

struct HyperBytes {
  unsigned char b[64];
};

__global__ void store_hyper_kernel(unsigned char* dst, HyperBytes v, int bytes) {
  for (int i = static_cast<int>(threadIdx.x); i < bytes; i += static_cast<int>(blockDim.x)) dst[i] = v.b[i];
}

dim3 grid_of(int count, int64_t max_n) {
  constexpr int64_t kMaxX = 1024;  // blocks per tensor; larger tensors are walked with a grid stride
  int64_t x = (max_n + cuda::kBlock - 1) / cuda::kBlock;
  x = x < 1 ? 1 : (x > kMaxX ? kMaxX : x);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(count));
}

}  // namespace

void launch_sgd_step(DType dt, const OptimBatch<SgdTensor>& tensors, int count, int64_t max_n, const SgdHyper* h,
                     cudaStream_t stream) {
  if (count == 0) return;
  if (count > kOptimBatch) HT_CUDA_CHECK(cudaErrorInvalidValue);  // the caller splits into batches
  const dim3 grid = grid_of(count, max_n);
  if (dt == DType::f32) sgd_step_kernel<float><<<grid, cuda::kBlock, 0, stream>>>(tensors, h);
  else if (dt == DType::f64) sgd_step_kernel<double><<<grid, cuda::kBlock, 0, stream>>>(tensors, h);
  else HT_UNSUPPORTED_DTYPE("sgd_step", dt);
  HT_CHECK_LAUNCH("sgd_step");
}

void launch_adamw_step(DType dt, const OptimBatch<AdamWTensor>& tensors, int count, int64_t max_n,
                       const AdamWHyper* h, cudaStream_t stream) {
  if (count == 0) return;
  if (count > kOptimBatch) HT_CUDA_CHECK(cudaErrorInvalidValue);
  const dim3 grid = grid_of(count, max_n);
  if (dt == DType::f32) adamw_step_kernel<float><<<grid, cuda::kBlock, 0, stream>>>(tensors, h);
  else if (dt == DType::f64) adamw_step_kernel<double><<<grid, cuda::kBlock, 0, stream>>>(tensors, h);
  else HT_UNSUPPORTED_DTYPE("adamw_step", dt);
  HT_CHECK_LAUNCH("adamw_step");
}

void launch_store_hyper(void* dst, const void* src, int bytes, cudaStream_t stream) {
  if (bytes <= 0 || bytes > static_cast<int>(sizeof(HyperBytes))) HT_CUDA_CHECK(cudaErrorInvalidValue);
  HyperBytes v{};
  std::memcpy(v.b, src, static_cast<std::size_t>(bytes));
  store_hyper_kernel<<<1, 64, 0, stream>>>(static_cast<unsigned char*>(dst), v, bytes);
  HT_CHECK_LAUNCH("store_hyper");
}

}  // namespace ht::kernels
