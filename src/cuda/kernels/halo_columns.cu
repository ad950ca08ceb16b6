// HALO's column kernels (contract: launch_halo_*_columns in cuda/kernels/halo.cuh): the rotation of a matrix's
// columns (along its rows' index), for level 2's token rotation, without the transposes the row kernels need.
// Bit-identical to transposing, rotating the rows with the row kernels (or the CPU reference) and transposing
// back: every butterfly is the same f32 __fadd_rn / __fsub_rn of the same pair, stage by stage in the same order
// (h = 1, 2, 4, ...), and the codes are the same code_of.
//
// Note [HALO column kernels]
// HALO-2 rotates g_y (T, O) along T, and rotates the g_x product back along T. With row kernels that takes a bf16
// transpose of g_y (4·T·O bytes), a byte transpose of the rotated codes (2·O·T) and a bf16 transpose of g_x's
// product (4·T·n_I): on Llama-3-8B's up_proj at 8192 tokens 0.84 of the 2.05 GB its level-2 backward moves outside
// the GEMMs. These kernels rotate the columns where they lie. A rotation of n = 2^j values (K = 1, 256 <= n <=
// 16384) of strips of kWidth = 16 columns:
//  - a cluster of kCluster = 8 CTAs of 512 threads per strip; CTA q holds rows [q·n/8, (q+1)·n/8) of the strip
//    as f32 in shared memory (n/8 rows of 64 bytes: 64 KiB at n = 8192), so the strip's n·16 values sit in the
//    cluster;
//  - pass 1: each thread loads 8 consecutive rows of 4 columns (8- or 16-byte loads; a row of the strip is 32
//    bytes of bf16, one sector), runs the stages h = 1, 2, 4 in registers and stores the values; the paired
//    quantiser's unrotated side takes the loaded values here (its codes are written transposed, (C, n): a column's
//    8 codes are 8 consecutive bytes of its output row, so the unrotated codes need no transpose either);
//  - pass 2: the stages h = 8 ... n/16 within the CTA's rows, up to four per sweep, a thread holding one column's
//    2^s values in registers; one barrier per sweep;
//  - pass 3, after a cluster barrier: the stages h = n/8, n/4, n/2 pair rows of different CTAs. CTA q finishes the
//    slab rows j of its eighth of the slab for every CTA: for each (j, four columns) a thread reads the eight
//    CTAs' values through distributed shared memory, runs the three stages in registers and writes the eight
//    rows' results (their max |v|, four codes in one 4-byte store, or four rotated values); a second cluster
//    barrier keeps every CTA's shared memory until the others have read it.
// Occupancy is what sets their speed: an earlier form with 256 threads and 16-row groups (up to 128 registers a
// thread, 16 warps an SM) was latency-bound on an H100 (Nsight Compute: 6–9 cycles per issued instruction) and
// slower than the row kernels with their transposes; at most 64 registers a thread (__launch_bounds__) give two
// CTAs of 512 threads an SM, 32 warps, with 128 of the SM's shared memory.
// Shared memory holds value (r, c) in 16-byte slot (4r + c/4) ^ (4·bit 3 of r), i.e. rows r and r ^ 1 trade
// halves of their 128-byte line when bit 3 of r is set: pass 1's quarter-warps store rows r and r + 8 (the same
// banks without the swap), pass 2's warps read rows r and r + 1, pass 3's quarter-warps rows j and j + 1 (one line
// either way): no bank conflicts.
#include <cuda_runtime.h>

#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/halo.cuh"
#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

using namespace halo_detail;

constexpr int kCluster = 8;
constexpr int kWidth = 16;
constexpr int kColThreads = 512;  // two CTAs an SM (64 registers a thread): 32 warps
constexpr int64_t kMinColumnRotation = 256;   // n/8 rows per CTA: at least four 8-row groups
constexpr int64_t kMaxColumnRotation = 16384;  // n·8 bytes of shared memory per CTA: 128 KiB

enum class ColMode { rotate, absmax, quantize };

struct ColOut {
  void* out = nullptr;  // rotate: (rows_kept, C) of out_dtype, each value times mult
  DType out_dtype = DType::f32;
  int64_t rows_kept = 0;
  float mult = 1.0f;
  float* absmax = nullptr;        // absmax: the rotated values' word
  float* absmax_plain = nullptr;  // absmax, paired: the unrotated values' word
  uint8_t* codes = nullptr;       // quantize: (n, C) rotated codes
  uint8_t* codes_plain = nullptr;  // quantize, paired: (C, n) unrotated codes
  const float* m = nullptr;
  const float* m_plain = nullptr;
  float* scale = nullptr;
  float* scale_plain = nullptr;
};

__device__ __forceinline__ int slot(int r, int cq) { return (4 * r + cq) ^ (((r >> 3) & 1) << 2); }

__device__ __forceinline__ void bfly(float& a, float& b) {
  const float u = a, v = b;
  a = __fadd_rn(u, v);
  b = __fsub_rn(u, v);
}

// Four consecutive elements of x (f32, bf16 or f16) from element i (aligned to four elements) as f32.
template <DType DT>
__device__ __forceinline__ void load4(const void* x, int64_t i, float* v) {
  if constexpr (DT == DType::f32) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(x) + i / 4);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(x) + i));
    unpack2<DT>(w.x, v);
    unpack2<DT>(w.y, v + 2);
  }
}

// Pass 2 (Note [HALO column kernels]): the stages h = 2^b0 ... 2^(b0 + S − 1) on the CTA's rc rows, a thread
// taking one column's 2^S values base + t·2^b0 (b0 >= 3, so consecutive threads read one row's 16 columns and
// then the next row's).
template <int S>
__device__ __forceinline__ void column_sweep(float* buf, int rc, int b0) {
  constexpr int G = 1 << S;
  const int tasks = kWidth * (rc >> S);
  for (int q = threadIdx.x; q < tasks; q += blockDim.x) {
    const int c = q & (kWidth - 1), g = q >> 4;
    const int base = ((g >> b0) << (b0 + S)) | (g & ((1 << b0) - 1));
    int at[G];
#pragma unroll
    for (int t = 0; t < G; ++t) {
      const int r = base + (t << b0);
      at[t] = 4 * slot(r, c >> 2) + (c & 3);
    }
    float v[G];
#pragma unroll
    for (int t = 0; t < G; ++t) v[t] = buf[at[t]];
#pragma unroll
    for (int u = 1; u < G; u <<= 1)
#pragma unroll
      for (int t = 0; t < G; ++t)
        if ((t & u) == 0) bfly(v[t], v[t + u]);
#pragma unroll
    for (int t = 0; t < G; ++t) buf[at[t]] = v[t];
  }
}

// I8: the carrier of quantize mode's codes (false in the other modes). Pair: the unrotated side (absmax and
// quantize modes).
template <DType DT, ColMode M, bool Pair, bool I8>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kColThreads, 2)
    columns_kernel(const void* x, int64_t C, int log_n, ColOut o) {
  extern __shared__ float4 cols_smem[];
  float* buf = reinterpret_cast<float*>(cols_smem);
  const int n = 1 << log_n, log_rc = log_n - 3, rc = 1 << log_rc;
  const int rank = static_cast<int>(cluster_rank());
  const int64_t col0 = static_cast<int64_t>(blockIdx.x / kCluster) * kWidth;
  const int row0 = rank * rc;
  float m = 0.0f, r = 0.0f, m_plain = 0.0f, r_plain = 0.0f, mx = 0.0f, mx_plain = 0.0f;
  if constexpr (M == ColMode::quantize) {
    m = *o.m;
    r = reciprocal_step(m, I8);
    if (blockIdx.x == 0 && threadIdx.x == 0) *o.scale = scale_of(m, I8);
    if constexpr (Pair) {
      m_plain = *o.m_plain;
      r_plain = reciprocal_step(m_plain, I8);
      if (blockIdx.x == 0 && threadIdx.x == 0) *o.scale_plain = scale_of(m_plain, I8);
    }
  }
  // pass 1: rows row0 + 8·grp + j (j < 8) of columns 4·cq ... 4·cq + 3
  for (int q = threadIdx.x; q < rc / 2; q += blockDim.x) {
    const int cq = q & 3, grp = q >> 2;
    float v[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) load4<DT>(x, (row0 + 8 * grp + j) * C + col0 + 4 * cq, v[j]);
    if constexpr (Pair && M == ColMode::absmax) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx_plain = fmaxf(mx_plain, fabsf(v[j][e]));
    } else if constexpr (Pair && M == ColMode::quantize) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // column col0 + 4·cq + e: its 8 codes, consecutive in its (C, n) row
        const float lo[4] = {v[0][e], v[1][e], v[2][e], v[3][e]}, hi[4] = {v[4][e], v[5][e], v[6][e], v[7][e]};
        *reinterpret_cast<uint2*>(o.codes_plain + (col0 + 4 * cq + e) * n + row0 + 8 * grp) =
            make_uint2(codes4<I8>(lo, m_plain, r_plain), codes4<I8>(hi, m_plain, r_plain));
      }
    }
#pragma unroll
    for (int h = 1; h < 8; h <<= 1)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if ((j & h) == 0)
#pragma unroll
          for (int e = 0; e < 4; ++e) bfly(v[j][e], v[j + h][e]);
#pragma unroll
    for (int j = 0; j < 8; ++j) cols_smem[slot(8 * grp + j, cq)] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
  }
  __syncthreads();
  // pass 2
  for (int b0 = 3; b0 < log_rc;) {
    const int s = log_rc - b0 < 4 ? log_rc - b0 : 4;
    switch (s) {
      case 1: column_sweep<1>(buf, rc, b0); break;
      case 2: column_sweep<2>(buf, rc, b0); break;
      case 3: column_sweep<3>(buf, rc, b0); break;
      default: column_sweep<4>(buf, rc, b0); break;
    }
    __syncthreads();
    b0 += s;
  }
  cluster_sync_all();
  // pass 3: slab rows j of this CTA's eighth, in every CTA of the cluster
  const int share = rc / kCluster;
  for (int q = threadIdx.x; q < share * 4; q += blockDim.x) {
    const int cq = q & 3, j = rank * share + (q >> 2), s = slot(j, cq);
    float v[kCluster][4];
#pragma unroll
    for (int p = 0; p < kCluster; ++p) {
      const float4 f = *cluster_peer(static_cast<const float4*>(cols_smem) + s, p);  // one mapa per value read
      v[p][0] = f.x, v[p][1] = f.y, v[p][2] = f.z, v[p][3] = f.w;
    }
#pragma unroll
    for (int h = 1; h < kCluster; h <<= 1)
#pragma unroll
      for (int p = 0; p < kCluster; ++p)
        if ((p & h) == 0)
#pragma unroll
          for (int e = 0; e < 4; ++e) bfly(v[p][e], v[p + h][e]);
#pragma unroll
    for (int p = 0; p < kCluster; ++p) {
      const int64_t row = static_cast<int64_t>(p) * rc + j;
      if constexpr (M == ColMode::absmax) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mx = fmaxf(mx, fabsf(v[p][e]));
      } else if constexpr (M == ColMode::quantize) {
        *reinterpret_cast<uint32_t*>(o.codes + row * C + col0 + 4 * cq) = codes4<I8>(v[p], m, r);
      } else {
        if (row < o.rows_kept) {
          float w[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) w[e] = __fmul_rn(v[p][e], o.mult);
          const int64_t at = row * C + col0 + 4 * cq;
          if (o.out_dtype == DType::f32) {
            *reinterpret_cast<float4*>(static_cast<float*>(o.out) + at) = make_float4(w[0], w[1], w[2], w[3]);
          } else {
            const uint32_t lo = uint32_t{detail::float_to_bf16_bits(w[0])} | uint32_t{detail::float_to_bf16_bits(w[1])} << 16;
            const uint32_t hi = uint32_t{detail::float_to_bf16_bits(w[2])} | uint32_t{detail::float_to_bf16_bits(w[3])} << 16;
            *reinterpret_cast<uint2*>(static_cast<uint16_t*>(o.out) + at) = make_uint2(lo, hi);
          }
        }
      }
    }
  }
  cluster_sync_all();  // no CTA leaves while another reads its shared memory
  if constexpr (M == ColMode::absmax) {
    block_max_into(o.absmax, mx);
    if constexpr (Pair) {
      __syncthreads();  // block_max's scratch is read by warp 0 above before it is written again
      block_max_into(o.absmax_plain, mx_plain);
    }
  }
}

constinit LaunchCounter g_column_launches;  // halo_column_launches()

bool aligned_to(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <DType DT, ColMode M, bool Pair, bool I8>
void launch_columns(const HaloColumnsArgs& a, const ColOut& o, cudaStream_t stream) {
  constexpr auto kernel = &columns_kernel<DT, M, Pair, I8>;
  const size_t smem = static_cast<size_t>(a.n) * kWidth / kCluster * sizeof(float);
  opt_in_shared<kernel>(smem, static_cast<size_t>(kMaxColumnRotation) * kWidth / kCluster * sizeof(float));
  int log_n = 0;
  while ((int64_t{1} << log_n) < a.n) ++log_n;
  const auto grid = static_cast<unsigned>(a.C / kWidth * kCluster);
  kernel<<<grid, kColThreads, smem, stream>>>(a.x, a.C, log_n, o);
  g_column_launches.add();
}

template <ColMode M, bool Pair, bool I8>
void by_dtype(const HaloColumnsArgs& a, const ColOut& o, cudaStream_t stream) {
  switch (a.in_dtype) {
    case DType::f32: return launch_columns<DType::f32, M, Pair, I8>(a, o, stream);
    case DType::bf16: return launch_columns<DType::bf16, M, Pair, I8>(a, o, stream);
    case DType::f16: return launch_columns<DType::f16, M, Pair, I8>(a, o, stream);
    default: HT_UNSUPPORTED_DTYPE("halo columns", a.in_dtype);
  }
}

}  // namespace

int64_t halo_column_launches() { return g_column_launches.get(); }

bool halo_columns_apply(const HaloColumnsArgs& a) {
  if (a.n < kMinColumnRotation || a.n > kMaxColumnRotation || (a.n & (a.n - 1)) != 0) return false;
  if (a.C < kWidth || a.C % kWidth != 0) return false;
  if (a.C / kWidth * kCluster > 0x7fffffff) return false;
  switch (a.in_dtype) {
    case DType::f32: return aligned_to(a.x, 16);
    case DType::bf16:
    case DType::f16: return aligned_to(a.x, 8);
    default: return false;
  }
}

void launch_halo_quantize_columns(const HaloColumnsArgs& a, void* codes, void* codes_plain, DType code_dtype,
                                  float* absmax, float* scale, float* scale_plain, cudaStream_t stream) {
  const bool int8 = code_dtype == DType::i8;
  if (!int8 && code_dtype != DType::f8e4m3) HT_UNSUPPORTED_DTYPE("halo_quantize_columns", code_dtype);
  const bool pair = codes_plain != nullptr;
  HT_CUDA_CHECK(cudaMemsetAsync(absmax, 0, 2 * sizeof(float), stream));
  ColOut o;
  o.absmax = absmax;
  o.absmax_plain = absmax + 1;
  if (pair) by_dtype<ColMode::absmax, true, false>(a, o, stream);
  else by_dtype<ColMode::absmax, false, false>(a, o, stream);
  HT_CHECK_LAUNCH("halo_absmax_columns");
  o.codes = static_cast<uint8_t*>(codes);
  o.codes_plain = static_cast<uint8_t*>(codes_plain);
  o.m = absmax;
  o.m_plain = absmax + 1;
  o.scale = scale;
  o.scale_plain = scale_plain;
  if (pair) {
    if (int8) by_dtype<ColMode::quantize, true, true>(a, o, stream);
    else by_dtype<ColMode::quantize, true, false>(a, o, stream);
  } else {
    if (int8) by_dtype<ColMode::quantize, false, true>(a, o, stream);
    else by_dtype<ColMode::quantize, false, false>(a, o, stream);
  }
  HT_CHECK_LAUNCH("halo_quantize_columns");
}

void launch_halo_rotate_columns(const HaloColumnsArgs& a, void* out, DType out_dtype, int64_t rows_kept, float mult,
                                cudaStream_t stream) {
  if (out_dtype != DType::f32 && out_dtype != DType::bf16) HT_UNSUPPORTED_DTYPE("halo_rotate_columns", out_dtype);
  ColOut o;
  o.out = out;
  o.out_dtype = out_dtype;
  o.rows_kept = rows_kept;
  o.mult = mult;
  by_dtype<ColMode::rotate, false, false>(a, o, stream);
  HT_CHECK_LAUNCH("halo_rotate_columns");
}

}  // namespace ht::kernels
