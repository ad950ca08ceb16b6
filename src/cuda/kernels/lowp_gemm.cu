// Low-precision GEMM helpers (see lowp_gemm.cuh): the zero-padding batched 2-D copy and the fallback "NT"
// product kernels. The products are exact in fp32 for fp8 inputs (at most 4 + 4 significant bits), so
// the fp8 kernel differs from the CPU reference (double accumulation) only by the fp32 accumulation order.
// int8 accumulates in uint32 arithmetic: the same two's-complement wrap as cuBLASLt's int32 accumulator
// and the CPU reference, without signed-overflow undefined behaviour.
#include "cuda/kernels/lowp_gemm.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hadatrain/tensor/scalar_types.h"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

template <class T>
__global__ void pad_copy_kernel(PadCopyArgs p) {
  const T* src = static_cast<const T*>(p.src);
  T* dst = static_cast<T*>(p.dst);
  const int64_t per = p.dst_rows * p.dst_cols, total = per * p.batch;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / per, r = (i % per) / p.dst_cols, c = i % p.dst_cols;
    T v{};
    if (r < p.rows && c < p.cols) v = src[b * p.src_batch_stride + r * p.src_ld + c];
    dst[b * p.dst_batch_stride + r * p.dst_ld + c] = v;
  }
}

__device__ float fp8_value(DType dt, uint8_t bits) {
  return dt == DType::f8e4m3 ? detail::e4m3_bits_to_float(bits) : detail::e5m2_bits_to_float(bits);
}

// One thread per output element (batch, row, col); grid-stride.
__global__ void lowp_gemm_nt_kernel(LowpKernelArgs g) {
  const int64_t per = g.m * g.n, total = per * g.batch;
  const bool fp8 = g.a_dtype != DType::i8;
  const float scale = fp8 ? (g.scale_a ? *g.scale_a : 1.0f) * (g.scale_b ? *g.scale_b : 1.0f) : 1.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / per, r = (i % per) / g.n, c = i % g.n;
    const int64_t ai = bt * g.stride_a + r * g.lda, bi = bt * g.stride_b + c * g.ldb, ci = bt * g.stride_c + r * g.ldc + c;
    if (!fp8) {
      const int8_t* a = static_cast<const int8_t*>(g.a) + ai;
      const int8_t* b = static_cast<const int8_t*>(g.b) + bi;
      uint32_t acc = 0;
      for (int64_t k = 0; k < g.k; ++k)
        acc += static_cast<uint32_t>(static_cast<int32_t>(a[k]) * static_cast<int32_t>(b[k]));
      static_cast<int32_t*>(g.c)[ci] = static_cast<int32_t>(acc);
    } else {
      const uint8_t* a = static_cast<const uint8_t*>(g.a) + ai;
      const uint8_t* b = static_cast<const uint8_t*>(g.b) + bi;
      float acc = 0.0f;
      for (int64_t k = 0; k < g.k; ++k)
        acc = __fadd_rn(acc, __fmul_rn(fp8_value(g.a_dtype, a[k]), fp8_value(g.b_dtype, b[k])));
      const float v = __fmul_rn(acc, scale);
      if (g.c_dtype == DType::bf16) static_cast<bf16*>(g.c)[ci] = bf16(v);
      else static_cast<float*>(g.c)[ci] = v;
    }
  }
}

// Rows on blockIdx.y / threadIdx.y (a grid-stride loop over rows), column chunks of kVec elements on
// blockIdx.x / threadIdx.x: the row's scale is read once per chunk, without per-element index divisions
// (the 64-bit divisions of a flat index cost more than the pass's memory traffic). vec: 16-byte chunks
// (the pointers aligned, cols a multiple of kVec); otherwise element by element within the chunk.
constexpr int kVec = 8;           // elements per thread and chunk
constexpr int kRowThreads = 8;    // threadIdx.y
constexpr int kColThreads = 32;   // threadIdx.x

struct RowChunk {
  int64_t row, rows, col, cols;
};

template <class F>
__device__ __forceinline__ void for_row_chunks(int64_t rows, int64_t cols, F&& f) {
  const int64_t chunks = (cols + kVec - 1) / kVec;
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kRowThreads) + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * kRowThreads)
    for (int64_t c = blockIdx.x * static_cast<int64_t>(kColThreads) + threadIdx.x; c < chunks;
         c += static_cast<int64_t>(gridDim.x) * kColThreads)
      f(r, c * kVec, cols - c * kVec < kVec ? static_cast<int>(cols - c * kVec) : kVec);
}

dim3 row_chunk_grid(int64_t rows, int64_t cols) {
  const int64_t chunks = (cols + kVec - 1) / kVec;
  const int64_t gx = std::min<int64_t>((chunks + kColThreads - 1) / kColThreads, 1024);
  const int64_t gy = std::min<int64_t>((rows + kRowThreads - 1) / kRowThreads, 65535);
  return dim3(static_cast<unsigned>(std::max<int64_t>(gx, 1)), static_cast<unsigned>(std::max<int64_t>(gy, 1)));
}

__device__ __forceinline__ void store_scaled(void* out, DType dt, int64_t i, const float* v, int n, bool vec) {
  if (dt == DType::bf16) {
    bf16* o = static_cast<bf16*>(out) + i;
    if (vec) {
      alignas(16) bf16 b[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) b[k] = bf16(v[k]);
      *reinterpret_cast<uint4*>(o) = *reinterpret_cast<const uint4*>(b);
    } else {
      for (int k = 0; k < n; ++k) o[k] = bf16(v[k]);
    }
  } else {
    float* o = static_cast<float*>(out) + i;
    if (vec) {
      reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      for (int k = 0; k < n; ++k) o[k] = v[k];
    }
  }
}

__device__ __forceinline__ float scale_of(const ScaleI32Args& g) {
  return __fmul_rn(__fmul_rn(g.scale_a ? *g.scale_a : 1.0f, g.scale_b ? *g.scale_b : 1.0f), g.mult);
}

// Element by element within each chunk: pointers not 16-byte aligned or cols not a multiple of kVec.
__global__ void __launch_bounds__(kColThreads * kRowThreads) scale_i32_kernel(ScaleI32Args g) {
  const float s = scale_of(g);
  for_row_chunks(g.n / g.cols, g.cols, [&](int64_t r, int64_t c, int n) {
    const float f = g.row_scale ? __fmul_rn(s, g.row_scale[r / g.rows_per_scale]) : s;
    const int64_t i = r * g.cols + c;
    float v[kVec];
    for (int k = 0; k < n; ++k) v[k] = __fmul_rn(static_cast<float>(g.acc[i + k]), f);
    store_scaled(g.out, g.out_dtype, i, v, n, false);
  });
}

// The 16-byte path: kScaleChunks chunks of a row per thread (kColThreads apart, so a warp's loads stay
// contiguous), all loads issued before the first store. One chunk a thread (32 bytes in flight) reached 2.0 TB/s
// on the H200 at 4096 × 4096 (ncu); the pass is pure streaming, so its speed is the bytes kept in flight.
constexpr int kScaleChunks = 4;

__global__ void __launch_bounds__(kColThreads * kRowThreads) scale_i32_vec_kernel(ScaleI32Args g) {
  const float s = scale_of(g);
  const int64_t rows = g.n / g.cols, chunks = g.cols / kVec, span = kColThreads * kScaleChunks;
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kRowThreads) + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * kRowThreads) {
    const float f = g.row_scale ? __fmul_rn(s, g.row_scale[r / g.rows_per_scale]) : s;
    const int4* src = reinterpret_cast<const int4*>(g.acc + r * g.cols);
    for (int64_t c0 = blockIdx.x * span + threadIdx.x; c0 < chunks; c0 += static_cast<int64_t>(gridDim.x) * span) {
      int4 q[kScaleChunks][2];
#pragma unroll
      for (int u = 0; u < kScaleChunks; ++u) {
        const int64_t c = c0 + u * kColThreads;
        if (c < chunks) {
          q[u][0] = src[2 * c];
          q[u][1] = src[2 * c + 1];
        }
      }
#pragma unroll
      for (int u = 0; u < kScaleChunks; ++u) {
        const int64_t c = c0 + u * kColThreads;
        if (c >= chunks) break;
        const int e[kVec] = {q[u][0].x, q[u][0].y, q[u][0].z, q[u][0].w, q[u][1].x, q[u][1].y, q[u][1].z, q[u][1].w};
        float v[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = __fmul_rn(static_cast<float>(e[k]), f);
        store_scaled(g.out, g.out_dtype, r * g.cols + c * kVec, v, kVec, true);
      }
    }
  }
}

template <class C>
__device__ __forceinline__ float code_value(C c) {
  if constexpr (std::is_same_v<C, int8_t>) return static_cast<float>(c);
  else return detail::e4m3_bits_to_float(c);
}

// One row (a sample) per blockIdx.y step, chunks of kVec codes: 8-byte loads, two 16-byte stores when vec.
template <class C>
__global__ void __launch_bounds__(kColThreads * kRowThreads) split_scaled_kernel(SplitScaledArgs g, bool vec) {
  const C* codes = static_cast<const C*>(g.codes);
  bf16* hi = static_cast<bf16*>(g.out);
  bf16* lo = hi + g.rows * g.cols;
  for_row_chunks(g.rows, g.cols, [&](int64_t r, int64_t c, int n) {
    const float s = g.scale[r];
    const int64_t i = r * g.cols + c;
    alignas(16) bf16 h[kVec], l[kVec];
    alignas(8) C q[kVec] = {};
    if (vec) {
      *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(codes + i);
    } else {
      for (int k = 0; k < n; ++k) q[k] = codes[i + k];
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float t = __fmul_rn(code_value(q[k]), s);
      h[k] = bf16(t);
      l[k] = bf16(__fsub_rn(t, static_cast<float>(h[k])));
    }
    if (vec) {
      *reinterpret_cast<uint4*>(hi + i) = *reinterpret_cast<const uint4*>(h);
      *reinterpret_cast<uint4*>(lo + i) = *reinterpret_cast<const uint4*>(l);
    } else {
      for (int k = 0; k < n; ++k) {
        hi[i + k] = h[k];
        lo[i + k] = l[k];
      }
    }
  });
}

}  // namespace

void launch_scale_i32(const ScaleI32Args& g, cudaStream_t stream) {
  if (g.n == 0) return;
  if (g.out_dtype != DType::f32 && g.out_dtype != DType::bf16) HT_UNSUPPORTED_DTYPE("scale_i32", g.out_dtype);
  const bool vec = reinterpret_cast<uintptr_t>(g.acc) % 16 == 0 && reinterpret_cast<uintptr_t>(g.out) % 16 == 0 &&
                   g.cols % kVec == 0;
  const int64_t rows = g.n / g.cols;
  const dim3 block(kColThreads, kRowThreads);
  if (vec) scale_i32_vec_kernel<<<row_chunk_grid(rows, (g.cols + kScaleChunks - 1) / kScaleChunks), block, 0, stream>>>(g);
  else scale_i32_kernel<<<row_chunk_grid(rows, g.cols), block, 0, stream>>>(g);
  HT_CHECK_LAUNCH("scale_i32");
}

void launch_split_scaled(const SplitScaledArgs& g, cudaStream_t stream) {
  if (g.rows * g.cols == 0) return;
  const bool vec = reinterpret_cast<uintptr_t>(g.codes) % 8 == 0 && reinterpret_cast<uintptr_t>(g.out) % 16 == 0 &&
                   g.cols % kVec == 0;
  const dim3 grid = row_chunk_grid(g.rows, g.cols), block(kColThreads, kRowThreads);
  switch (g.codes_dtype) {
    case DType::i8: split_scaled_kernel<int8_t><<<grid, block, 0, stream>>>(g, vec); break;
    case DType::f8e4m3: split_scaled_kernel<uint8_t><<<grid, block, 0, stream>>>(g, vec); break;
    default: HT_UNSUPPORTED_DTYPE("split_scaled", g.codes_dtype);
  }
  HT_CHECK_LAUNCH("split_scaled");
}

void launch_pad_copy_2d(const PadCopyArgs& p, cudaStream_t stream) {
  const int64_t total = p.dst_rows * p.dst_cols * p.batch;
  if (total == 0) return;
  const unsigned grid = ht::cuda::grid_for(total);
  switch (p.elem_bytes) {
    case 1: pad_copy_kernel<uint8_t><<<grid, ht::cuda::kBlock, 0, stream>>>(p); break;
    case 2: pad_copy_kernel<uint16_t><<<grid, ht::cuda::kBlock, 0, stream>>>(p); break;
    case 4: pad_copy_kernel<uint32_t><<<grid, ht::cuda::kBlock, 0, stream>>>(p); break;
    default: HT_UNSUPPORTED_DTYPE("pad_copy_2d", p.elem_bytes);
  }
  HT_CHECK_LAUNCH("pad_copy_2d");
}

void launch_lowp_gemm_nt(const LowpKernelArgs& g, cudaStream_t stream) {
  const int64_t total = g.m * g.n * g.batch;
  if (total == 0) return;
  lowp_gemm_nt_kernel<<<ht::cuda::grid_for(total), ht::cuda::kBlock, 0, stream>>>(g);
  HT_CHECK_LAUNCH("lowp_gemm_nt");
}

}  // namespace ht::kernels
