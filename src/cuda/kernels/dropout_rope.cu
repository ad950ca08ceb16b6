// Dropout (Philox mask recomputed from (seed, stream, element), identical to the CPU's) and rotary
// position embedding (angles, cos and sin in double, as the CPU reference; Note [RoPE kernel tiling]). See
// dropout_rope.cuh.
#include <algorithm>

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
  const uint64_t stream = a.stream + (a.step_word != nullptr ? static_cast<uint64_t>(*a.step_word) : 0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = uniform_from_word(philox_word(a.seed, stream, static_cast<uint64_t>(i)));
    out[i] = static_cast<double>(u) >= a.p ? convert<T>(convert<A>(in[i]) * scale) : convert<T>(A(0));
  }
}

// Note [RoPE kernel tiling]
// A block rotates P consecutive positions r = b * T + t (all H heads of each). It first fills a shared table of
// the D/2 pair frequencies, then one of cos and sign * sin for its P positions (inv_freq, angle and sincos in
// double, as the CPU reference computes them): pow runs once per block and pair, sincos once per position and
// pair, instead of both once per head and pair. Then its threads walk the block's work items (p, h, c), c
// fastest: chunk c holds V pairs j = c*V .. c*V+V-1. For V > 1 (rotate_half only) both halves of a chunk are one
// aligned V-element load each (16 bytes for bf16 / f16 / f32 / f64), which launch_rope only picks when the
// strides and pointers allow it. Consecutive items are consecutive D-chunks of consecutive heads, so a
// (B, T, H, D) input (the projection's transpose(1, 2) view) is read contiguously; any strides work.
template <class T, int V>
__global__ void rope_kernel(T* out, const T* in, RopeArgs a, int64_t positions_per_block) {
  extern __shared__ double rope_table[];  // cos (P, D/2), sign * sin (P, D/2), inv_freq (D/2)
  const int64_t half = a.D / 2, P = positions_per_block, rows = a.B * a.T;
  const int64_t r0 = blockIdx.x * P;
  double* cos_t = rope_table;
  double* sin_t = rope_table + P * half;
  double* inv_freq = rope_table + 2 * P * half;
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = rope_inv_freq_at(a.freq, j);
  __syncthreads();
  for (int64_t e = threadIdx.x; e < P * half; e += blockDim.x) {
    const int64_t p = e / half, j = e % half;
    const int64_t t = (r0 + p) % a.T;  // rows past the end compute a harmless angle that is never used
    const double angle = static_cast<double>(a.offset + t) * inv_freq[j];
    double s, c;
    sincos(angle, &s, &c);
    cos_t[e] = c;
    sin_t[e] = s * a.sign;
  }
  __syncthreads();
  const int64_t chunks = half / V, per_pos = a.H * chunks;
  for (int64_t item = threadIdx.x; item < P * per_pos; item += blockDim.x) {
    const int64_t p = item / per_pos, hc = item % per_pos, h = hc / chunks, c = hc % chunks;
    const int64_t r = r0 + p;
    if (r >= rows) break;  // items are ordered by p: every later item of this thread is past the end too
    const int64_t b = r / a.T, t = r % a.T;
    const T* src = in + b * a.in_stride[0] + h * a.in_stride[1] + t * a.in_stride[2];
    T* dst = out + b * a.out_stride[0] + h * a.out_stride[1] + t * a.out_stride[2];
    const double* cp = cos_t + p * half + c * V;
    const double* sp = sin_t + p * half + c * V;
    if constexpr (V > 1) {  // rotate_half, unit last strides, aligned (checked by launch_rope)
      const Pack<T, V> x0 = *reinterpret_cast<const Pack<T, V>*>(src + c * V);
      const Pack<T, V> x1 = *reinterpret_cast<const Pack<T, V>*>(src + half + c * V);
      Pack<T, V> y0, y1;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const double u0 = to_double(x0.v[k]), u1 = to_double(x1.v[k]);
        y0.v[k] = convert<T>(u0 * cp[k] - u1 * sp[k]);
        y1.v[k] = convert<T>(u1 * cp[k] + u0 * sp[k]);
      }
      *reinterpret_cast<Pack<T, V>*>(dst + c * V) = y0;
      *reinterpret_cast<Pack<T, V>*>(dst + half + c * V) = y1;
    } else {
      const int64_t i0 = a.interleaved ? 2 * c : c, i1 = a.interleaved ? 2 * c + 1 : c + half;
      const double u0 = to_double(src[i0 * a.in_stride[3]]), u1 = to_double(src[i1 * a.in_stride[3]]);
      dst[i0 * a.out_stride[3]] = convert<T>(u0 * cp[0] - u1 * sp[0]);
      dst[i1 * a.out_stride[3]] = convert<T>(u1 * cp[0] + u0 * sp[0]);
    }
  }
}

// True when the V-element path of rope_kernel may run: rotate_half, unit last strides, every other stride a
// multiple of V, D/2 a multiple of V and both pointers aligned to the V-element pack.
bool rope_packs_fit(const RopeArgs& a, const void* out, const void* in, int V, unsigned elem_bytes) {
  if (a.interleaved != 0 || a.in_stride[3] != 1 || a.out_stride[3] != 1 || (a.D / 2) % V != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (a.in_stride[d] % V != 0 || a.out_stride[d] % V != 0) return false;
  return aligned_to(out, V * elem_bytes) && aligned_to(in, V * elem_bytes);
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
  const int64_t half = a.D / 2, rows = a.B * a.T;
  if (half == 0 || rows == 0 || a.H == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = static_cast<int>(16 / sizeof(T));  // pairs per 16-byte pack
    const bool packed = rope_packs_fit(a, out, in, kV, sizeof(T));
    const int64_t per_pos = a.H * (packed ? half / kV : half);
    // About 4 work items per thread, and the table within kRopeTableBytes (Note [RoPE kernel tiling]).
    int64_t P = std::max<int64_t>(1, std::min<int64_t>(32, 4 * cuda::kBlock / per_pos));
    P = std::max<int64_t>(1, std::min<int64_t>(P, (kRopeTableBytes / static_cast<int64_t>(sizeof(double)) - half) /
                                                      (2 * half)));
    const std::size_t smem = static_cast<std::size_t>((2 * P + 1) * half) * sizeof(double);
    const auto blocks = static_cast<unsigned>((rows + P - 1) / P);
    if (packed)
      rope_kernel<T, kV><<<blocks, cuda::kBlock, smem, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), a, P);
    else
      rope_kernel<T, 1><<<blocks, cuda::kBlock, smem, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), a, P);
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("rotary_embedding", dt);
  HT_CHECK_LAUNCH("rotary_embedding");
}

}  // namespace ht::kernels
