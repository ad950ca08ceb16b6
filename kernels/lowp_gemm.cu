// Low-precision GEMM helpers (see lowp_gemm.h): the zero-padding batched 2-D copy and the fallback "NT"
// product kernels. The products are exact in fp32 for fp8 inputs (at most 4 + 4 significant bits), so
// the fp8 kernel differs from the CPU reference (double accumulation) only by the fp32 accumulation order.
// int8 accumulates in uint32 arithmetic: the same two's-complement wrap as cuBLASLt's int32 accumulator
// and the CPU reference, without signed-overflow undefined behaviour.
#include "kernels/lowp_gemm.h"

#include <cstdint>

#include "hadatrain/tensor/scalar_types.h"
#include "kernels/launch.h"

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

// Four elements per thread and iteration with 16-byte loads when both pointers are aligned and cols % 4 == 0
// (vec: the four share a row); the rest element by element.
__device__ __forceinline__ float row_factor(const ScaleI32Args& g, float s, int64_t i) {
  return g.row_scale ? __fmul_rn(s, g.row_scale[i / g.cols / g.rows_per_scale]) : s;
}

__global__ void scale_i32_kernel(ScaleI32Args g, bool vec) {
  const float s = __fmul_rn(__fmul_rn(g.scale_a ? *g.scale_a : 1.0f, g.scale_b ? *g.scale_b : 1.0f), g.mult);
  const int64_t quads = vec ? g.n / 4 : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const bool bf = g.out_dtype == DType::bf16;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads; q += stride) {
    const int4 a = reinterpret_cast<const int4*>(g.acc)[q];
    const float f = row_factor(g, s, 4 * q);
    const float v[4] = {__fmul_rn(static_cast<float>(a.x), f), __fmul_rn(static_cast<float>(a.y), f),
                        __fmul_rn(static_cast<float>(a.z), f), __fmul_rn(static_cast<float>(a.w), f)};
    if (bf) {
      bf16* o = static_cast<bf16*>(g.out) + 4 * q;
#pragma unroll
      for (int k = 0; k < 4; ++k) o[k] = bf16(v[k]);
    } else {
      reinterpret_cast<float4*>(g.out)[q] = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
  for (int64_t i = 4 * quads + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.n; i += stride) {
    const float v = __fmul_rn(static_cast<float>(g.acc[i]), row_factor(g, s, i));
    if (bf) static_cast<bf16*>(g.out)[i] = bf16(v);
    else static_cast<float*>(g.out)[i] = v;
  }
}

__global__ void scale_rows_kernel(ScaleRowsArgs g) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.n; i += stride) {
    const float f = g.row_scale[i / g.cols / g.rows_per_scale];
    if (g.dtype == DType::bf16) {
      bf16* p = static_cast<bf16*>(g.data) + i;
      *p = bf16(__fmul_rn(static_cast<float>(*p), f));
    } else {
      float* p = static_cast<float*>(g.data) + i;
      *p = __fmul_rn(*p, f);
    }
  }
}

}  // namespace

void launch_scale_i32(const ScaleI32Args& g, cudaStream_t stream) {
  if (g.n == 0) return;
  if (g.out_dtype != DType::f32 && g.out_dtype != DType::bf16) HT_UNSUPPORTED_DTYPE("scale_i32", g.out_dtype);
  const bool vec = reinterpret_cast<uintptr_t>(g.acc) % 16 == 0 && reinterpret_cast<uintptr_t>(g.out) % 16 == 0 &&
                   g.cols % 4 == 0;
  scale_i32_kernel<<<ht::cuda::grid_for(g.n / 4 + 1), ht::cuda::kBlock, 0, stream>>>(g, vec);
  HT_CHECK_LAUNCH("scale_i32");
}

void launch_scale_rows(const ScaleRowsArgs& g, cudaStream_t stream) {
  if (g.n == 0) return;
  if (g.dtype != DType::f32 && g.dtype != DType::bf16) HT_UNSUPPORTED_DTYPE("scale_rows", g.dtype);
  scale_rows_kernel<<<ht::cuda::grid_for(g.n), ht::cuda::kBlock, 0, stream>>>(g);
  HT_CHECK_LAUNCH("scale_rows");
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
