// HALO's row kernels (launchers and contract: cuda/kernels/halo.cuh). Bit-identical to the CPU reference in
// src/grad/halo_quant.cpp: the same f32 operations in the same order (Note [HALO rotations], Note [HALO
// quantiser] in include/hadatrain/grad/pipeline_halo.h), explicit _rn intrinsics so nothing is contracted.
#include <type_traits>

#include "cuda/kernels/halo.cuh"
#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/halo_fast.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "hadatrain/tensor/scalar_types.h"

namespace ht::kernels {
namespace {

using namespace halo_detail;

constexpr int kThreads = 512;
constexpr int64_t kMaxRotation = 32768;  // grad::kHaloMaxRotation

__device__ __forceinline__ float load_in(DType dt, const void* x, int64_t i) {
  if (dt == DType::bf16) return detail::bf16_bits_to_float(static_cast<const uint16_t*>(x)[i]);
  if (dt == DType::f16) return detail::f16_bits_to_float(static_cast<const uint16_t*>(x)[i]);
  return static_cast<const float*>(x)[i];
}

__device__ __forceinline__ void store_out(void* out, DType dt, int64_t i, float v) {
  if (dt == DType::bf16) static_cast<uint16_t*>(out)[i] = detail::float_to_bf16_bits(v);
  else static_cast<float*>(out)[i] = v;
}

// Note [HALO butterflies in registers]
// Each butterfly stage h pairs elements i and i + h ((i / h) even) and writes (a + b, a − b); a stage's pairs are
// independent, so any schedule that runs the stages in order gives the CPU's bits. When the power-of-two runs are
// at least 256 long (P >= 256), a thread loads 8 consecutive values and runs stages 1, 2, 4 in registers, and the
// 32 lanes of a warp, which hold 256 consecutive values, run stages 8 ... 128 through shuffles (the lane with bit
// s clear holds a and keeps a + b, its partner keeps a − b); the stages from 256 on go through shared memory, one
// barrier each. n is then a multiple of 256, so every warp's lanes are all active in the shuffles.
//
// Row r of x, zero-padded to n, into buf, rotated (Note [HALO rotations]); ends synchronised.
template <int K>
__device__ void rotate_row(float* buf, const HaloRowsArgs& a, const HaloSigns& s, int64_t r) {
  const int n = static_cast<int>(a.n), C = static_cast<int>(a.C);
  const int P = n / K, half = P / 2;
  int h = 1;
  if (P >= 256) {  // Note [HALO butterflies in registers]
    const int lane = threadIdx.x % 32;
    for (int c = threadIdx.x; c < n / 8; c += blockDim.x) {
      float v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int i = c * 8 + e;
        v[e] = i < C ? load_in(a.in_dtype, a.x, r * a.C + i) : 0.0f;
      }
#pragma unroll
      for (int hh = 1; hh < 8; hh <<= 1)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if ((e / hh) % 2 == 0) {
            const float u = v[e], w = v[e + hh];
            v[e] = __fadd_rn(u, w);
            v[e + hh] = __fsub_rn(u, w);
          }
#pragma unroll
      for (int bit = 1; bit < 32; bit <<= 1)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float o = __shfl_xor_sync(0xffffffffU, v[e], bit);
          v[e] = lane & bit ? __fsub_rn(o, v[e]) : __fadd_rn(v[e], o);
        }
#pragma unroll
      for (int e = 0; e < 8; ++e) buf[c * 8 + e] = v[e];
    }
    h = 256;
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i < C ? load_in(a.in_dtype, a.x, r * a.C + i) : 0.0f;
  }
  __syncthreads();
  for (; h < P; h <<= 1) {
    for (int t = threadIdx.x; t < n / 2; t += blockDim.x) {
      const int seg = t / half, tt = t - seg * half;
      const int i = seg * P + (tt / h) * 2 * h + tt % h;
      const float u = buf[i], v = buf[i + h];
      buf[i] = __fadd_rn(u, v);
      buf[i + h] = __fsub_rn(u, v);
    }
    __syncthreads();
  }
  if constexpr (K > 1) {
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
      float u[K];  // column p of the (K, P) view, in registers: the results can go straight back to buf
#pragma unroll
      for (int k = 0; k < K; ++k) u[k] = buf[k * P + p];
      if constexpr (grad::paley::pair_form(K)) {
        paired_kk_column<K>(buf + p, P, u, s);
      } else {
#pragma unroll 1
        for (int i = 0; i < K; ++i) {
          float acc = 0.0f;
#pragma unroll
          for (int k = 0; k < K; ++k) {
            const bool neg = a.inverse ? (s.row[i] >> k) & 1U : (s.row[k] >> i) & 1U;
            acc = neg ? __fsub_rn(acc, u[k]) : __fadd_rn(acc, u[k]);
          }
          buf[i * P + p] = acc;
        }
      }
    }
    __syncthreads();
  }
}

template <int K>
__global__ void rotate_kernel(HaloRowsArgs a, HaloSigns s, void* out, DType out_dtype, int cols, float mult) {
  extern __shared__ float buf[];
  for (int64_t r = blockIdx.x; r < a.R; r += gridDim.x) {
    rotate_row<K>(buf, a, s, r);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) store_out(out, out_dtype, r * cols + i, __fmul_rn(buf[i], mult));
    __syncthreads();  // before the next row overwrites buf
  }
}

template <int K>
__global__ void absmax_rotated_kernel(HaloRowsArgs a, HaloSigns s, float* absmax) {
  extern __shared__ float buf[];
  float m = 0.0f;
  for (int64_t r = blockIdx.x; r < a.R; r += gridDim.x) {
    rotate_row<K>(buf, a, s, r);
    for (int i = threadIdx.x; i < a.n; i += blockDim.x) m = fmaxf(m, fabsf(buf[i]));
    __syncthreads();
  }
  block_max_into(absmax, m);
}

template <int K>
__global__ void quantize_rotated_kernel(HaloRowsArgs a, HaloSigns s, uint8_t* codes, bool int8, const float* absmax,
                                        float* scale) {
  extern __shared__ float buf[];
  const auto [m, r] = quant_step(absmax, scale, int8);
  for (int64_t row = blockIdx.x; row < a.R; row += gridDim.x) {
    rotate_row<K>(buf, a, s, row);
    for (int i = threadIdx.x; i < a.n; i += blockDim.x) codes[row * a.n + i] = code_of(buf[i], m, r, int8);
    __syncthreads();
  }
}

// The unrotated quantiser passes and the int32 epilogue: V = 16 / sizeof(element) elements per thread and step
// (one 16-byte load) when the pointers allow (vec), the tail (count % V) element by element; a step's codes leave
// in one V-byte store and its four scaled products in one 16- or 8-byte store.
template <DType DT>
__global__ void absmax_plain_kernel(HaloRowsArgs a, float* absmax, bool vec) {
  constexpr int V = Vec16<DT>::V;
  float m = 0.0f;
  const int64_t count = a.R * a.C, groups = vec ? count / V : 0;
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = tid; g < groups; g += step) {
    float v[V];
    Vec16<DT>::load(a.x, g * V, v);
#pragma unroll
    for (int e = 0; e < V; ++e) m = fmaxf(m, fabsf(v[e]));
  }
  for (int64_t i = groups * V + tid; i < count; i += step) m = fmaxf(m, fabsf(load_elem<DT>(a.x, i)));
  block_max_into(absmax, m);
}

template <DType DT>
__global__ void quantize_plain_kernel(HaloRowsArgs a, uint8_t* codes, bool int8, const float* absmax, float* scale,
                                      bool vec) {
  constexpr int V = Vec16<DT>::V;
  const auto [m, r] = quant_step(absmax, scale, int8);
  const int64_t count = a.R * a.C, groups = vec ? count / V : 0;
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = tid; g < groups; g += step) {
    float v[V];
    Vec16<DT>::load(a.x, g * V, v);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < V / 4; ++j) w[j] = codes4(v + 4 * j, m, r, int8);  // Note [HALO codes by four]
    if constexpr (V == 4) reinterpret_cast<uint32_t*>(codes)[g] = w[0];
    else reinterpret_cast<uint2*>(codes)[g] = make_uint2(w[0], w[1]);
  }
  for (int64_t i = groups * V + tid; i < count; i += step) codes[i] = code_of(load_elem<DT>(a.x, i), m, r, int8);
}

__global__ void scale_i32_kernel(const int32_t* acc, int64_t count, const float* s_a, const float* s_b, float mult,
                                 void* out, DType out_dtype, bool vec) {
  const float alpha = __fmul_rn(__fmul_rn(*s_a, *s_b), mult);
  const int64_t groups = vec ? count / 4 : 0;
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = tid; g < groups; g += step) {
    const int4 q = __ldg(reinterpret_cast<const int4*>(acc) + g);
    const float v[4] = {__fmul_rn(__int2float_rn(q.x), alpha), __fmul_rn(__int2float_rn(q.y), alpha),
                        __fmul_rn(__int2float_rn(q.z), alpha), __fmul_rn(__int2float_rn(q.w), alpha)};
    if (out_dtype == DType::f32) {
      reinterpret_cast<float4*>(out)[g] = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      const uint32_t lo = bf16_pair(v[0], v[1]), hi = bf16_pair(v[2], v[3]);  // Note [HALO bf16 pairs]
      reinterpret_cast<uint2*>(out)[g] = make_uint2(lo, hi);
    }
  }
  for (int64_t i = groups * 4 + tid; i < count; i += step)
    store_out(out, out_dtype, i, __fmul_rn(__int2float_rn(acc[i]), alpha));
}

// Threads per block of a row kernel: kThreads, or fewer when the kernel's registers per thread do not allow that
// many in one block (the K×K stage keeps a column of K floats per thread: K = 60 needs more than the 128
// registers that 512 threads may each have), rounded down to whole warps (the shuffle butterflies and
// block_max need full warps; every loop over a row strides by blockDim.x, so any multiple of 32 gives the same
// values). Asked once per kernel (cudaFuncGetAttributes is not a stream operation, so a first call while a step
// is being recorded is fine too).
template <auto kernel>
int row_threads() {
  static const int threads = [] {
    cudaFuncAttributes attr{};
    HT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    const int limit = attr.maxThreadsPerBlock < kThreads ? attr.maxThreadsPerBlock : kThreads;
    return limit < 32 ? 32 : limit / 32 * 32;  // at most 255 registers per thread: 256 threads always fit
  }();
  return threads;
}

// Launches kernel over the rows with n floats of shared memory. Above the default 48 KiB the kernel is opted in
// once, to the largest rotation's 128 KiB, at its first such launch (an eager one before any graph recording: the
// attribute call is not a stream operation).
template <auto kernel, class... Args>
void launch_rows(const HaloRowsArgs& a, cudaStream_t stream, Args... args) {
  const size_t smem = static_cast<size_t>(a.n) * sizeof(float);
  opt_in_shared<kernel>(smem, kMaxRotation * sizeof(float));
  kernel<<<row_grid(a.R), row_threads<kernel>(), smem, stream>>>(a, args...);
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// f(std::integral_constant<DType, DT>{}) for the plain kernels' input dtypes (f32, bf16, f16).
template <class F>
void with_plain_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f(std::integral_constant<DType, DType::f32>{});
    case DType::bf16: return f(std::integral_constant<DType, DType::bf16>{});
    case DType::f16: return f(std::integral_constant<DType, DType::f16>{});
    default: HT_UNSUPPORTED_DTYPE("halo plain quantiser", dt);
  }
}

template <DType DT>
unsigned plain_grid(const HaloRowsArgs& a) {
  return cuda::grid_for((a.R * a.C + Vec16<DT>::V - 1) / Vec16<DT>::V);
}

}  // namespace

void launch_halo_rotate(const HaloRowsArgs& a, const HaloSigns& signs, void* out, DType out_dtype, int64_t cols,
                        float mult, cudaStream_t stream) {
  if (halo_fast::applies(a)) return halo_fast::rotate(a, signs, out, out_dtype, cols, mult, stream);
  with_k(a.k, [&](auto k) {
    launch_rows<rotate_kernel<decltype(k)::value>>(a, stream, signs, out, out_dtype, static_cast<int>(cols), mult);
  });
  HT_CHECK_LAUNCH("halo_rotate");
}

void launch_halo_absmax(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, cudaStream_t stream) {
  HT_CUDA_CHECK(cudaMemsetAsync(absmax, 0, sizeof(float), stream));
  if (a.n == 0) {
    const bool vec = aligned(a.x, 16);
    with_plain_dtype(a.in_dtype, [&](auto dt) {
      constexpr DType DT = decltype(dt)::value;
      absmax_plain_kernel<DT><<<plain_grid<DT>(a), cuda::kBlock, 0, stream>>>(a, absmax, vec);
    });
    HT_CHECK_LAUNCH("halo_absmax_plain");
    return;
  }
  if (halo_fast::applies(a)) return halo_fast::absmax(a, signs, absmax, stream);
  with_k(a.k, [&](auto k) { launch_rows<absmax_rotated_kernel<decltype(k)::value>>(a, stream, signs, absmax); });
  HT_CHECK_LAUNCH("halo_absmax_rotated");
}

void launch_halo_quantize_given(const HaloRowsArgs& a, const HaloSigns& signs, void* codes, DType code_dtype,
                                const float* absmax, float* scale, cudaStream_t stream) {
  const bool int8 = code_dtype == DType::i8;
  if (!int8 && code_dtype != DType::f8e4m3) HT_UNSUPPORTED_DTYPE("halo_quantize", code_dtype);
  auto* out = static_cast<uint8_t*>(codes);
  if (a.n == 0) {
    with_plain_dtype(a.in_dtype, [&](auto dt) {
      constexpr DType DT = decltype(dt)::value;
      const bool vec = aligned(a.x, 16) && aligned(out, Vec16<DT>::V);
      quantize_plain_kernel<DT><<<plain_grid<DT>(a), cuda::kBlock, 0, stream>>>(a, out, int8, absmax, scale, vec);
    });
    HT_CHECK_LAUNCH("halo_quantize_plain");
    return;
  }
  if (halo_fast::applies(a) && aligned(out, 4)) return halo_fast::quantize(a, signs, out, int8, absmax, scale, stream);
  with_k(a.k, [&](auto k) {
    launch_rows<quantize_rotated_kernel<decltype(k)::value>>(a, stream, signs, out, int8, absmax, scale);
  });
  HT_CHECK_LAUNCH("halo_quantize_rotated");
}

void launch_halo_quantize(const HaloRowsArgs& a, const HaloSigns& signs, void* codes, DType code_dtype, float* absmax,
                          float* scale, cudaStream_t stream) {
  if (code_dtype != DType::i8 && code_dtype != DType::f8e4m3) HT_UNSUPPORTED_DTYPE("halo_quantize", code_dtype);
  launch_halo_absmax(a, signs, absmax, stream);
  launch_halo_quantize_given(a, signs, codes, code_dtype, absmax, scale, stream);
}

void launch_halo_quantize_pair(const HaloRowsArgs& a, const HaloSigns& signs, void* codes, void* codes_plain,
                               DType code_dtype, float* absmax, float* scale, float* scale_plain, cudaStream_t stream) {
  const bool int8 = code_dtype == DType::i8;
  if (!int8 && code_dtype != DType::f8e4m3) HT_UNSUPPORTED_DTYPE("halo_quantize_pair", code_dtype);
  if (a.n > 0 && halo_fast::applies(a) && aligned(codes, 4)) {
    HT_CUDA_CHECK(cudaMemsetAsync(absmax, 0, 2 * sizeof(float), stream));
    halo_fast::absmax_pair(a, signs, absmax, absmax + 1, stream);
    halo_fast::quantize_pair(a, signs, static_cast<uint8_t*>(codes), static_cast<uint8_t*>(codes_plain), int8, absmax,
                             absmax + 1, scale, scale_plain, stream);
    return;
  }
  launch_halo_quantize(a, signs, codes, code_dtype, absmax, scale, stream);
  HaloRowsArgs plain = a;
  plain.n = 0;
  plain.k = 1;
  launch_halo_quantize(plain, signs, codes_plain, code_dtype, absmax + 1, scale_plain, stream);
}

void launch_halo_scale_i32(const int32_t* acc, int64_t count, const float* s_a, const float* s_b, float mult,
                           void* out, DType out_dtype, cudaStream_t stream) {
  if (out_dtype != DType::f32 && out_dtype != DType::bf16) HT_UNSUPPORTED_DTYPE("halo_scale_i32", out_dtype);
  const bool vec = aligned(acc, 16) && aligned(out, out_dtype == DType::f32 ? 16 : 8);
  scale_i32_kernel<<<cuda::grid_for((count + 3) / 4), cuda::kBlock, 0, stream>>>(acc, count, s_a, s_b, mult, out,
                                                                                  out_dtype, vec);
  HT_CHECK_LAUNCH("halo_scale_i32");
}

}  // namespace ht::kernels
