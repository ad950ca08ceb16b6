// Dropout (Philox mask recomputed from (seed, stream, element), identical to the CPU's) and rotary
// position embedding (angles, cos and sin in double, as the CPU reference). See dropout_rope.cuh.
#include "hadatrain/tensor/philox.h"
#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/dropout_rope.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

template <class T>
__global__ void dropout_kernel(T* out, const T* in, DropoutArgs a) {
  using A = acc_t<T>;  // the CPU's acc_t: float, double for f64
  const A scale = static_cast<A>(1.0 / (1.0 - a.p));
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = uniform_from_word(philox_word(a.seed, a.stream, static_cast<uint64_t>(i)));
    out[i] = static_cast<double>(u) >= a.p ? convert<T>(convert<A>(in[i]) * scale) : convert<T>(A(0));
  }
}

// One thread per rotation pair (row, t, j).
template <class T>
__global__ void rope_kernel(T* out, const T* in, RopeArgs a) {
  const int64_t half = a.D / 2, pairs = a.rows * a.T * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < pairs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % half, rt = idx / half, t = rt % a.T;
    const int64_t i0 = a.interleaved ? 2 * j : j, i1 = a.interleaved ? 2 * j + 1 : j + half;
    const double angle = static_cast<double>(a.offset + t) * rope_inv_freq_at(a.freq, j);
    double s, c;
    sincos(angle, &s, &c);
    s *= a.sign;
    const T* row = in + rt * a.D;
    T* orow = out + rt * a.D;
    const double x0 = to_double(row[i0]), x1 = to_double(row[i1]);
    orow[i0] = convert<T>(x0 * c - x1 * s);
    orow[i1] = convert<T>(x1 * c + x0 * s);
  }
}

}  // namespace

void launch_dropout(DType dt, void* out, const void* in, const DropoutArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<cuda::grid_for(a.n), cuda::kBlock, 0, stream>>>(static_cast<T*>(out),
                                                                         static_cast<const T*>(in), a);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("dropout", dt);
  HT_CHECK_LAUNCH("dropout");
}

void launch_rope(DType dt, void* out, const void* in, const RopeArgs& a, cudaStream_t stream) {
  const int64_t pairs = a.rows * a.T * (a.D / 2);
  if (pairs == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<cuda::grid_for(pairs), cuda::kBlock, 0, stream>>>(static_cast<T*>(out),
                                                                        static_cast<const T*>(in), a);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("rotary_embedding", dt);
  HT_CHECK_LAUNCH("rotary_embedding");
}

}  // namespace ht::kernels
