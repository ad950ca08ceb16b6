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
//  - a cluster of kCluster = 8 CTAs per strip; CTA q holds rows [q·n/8, (q+1)·n/8) of the strip as f32 in shared
//    memory (n/8 rows of 64 bytes: 64 KiB at n = 8192), so the strip's n·16 values sit in the cluster;
//  - pass 1: each thread loads 16 consecutive rows of 4 columns (8- or 16-byte loads; a row of the strip is 32
//    bytes of bf16, one sector), runs the stages h = 1 ... 8 in registers and stores the values; the paired
//    quantiser's unrotated side takes the loaded values here (its codes are written transposed, (C, n): a column's
//    16 codes are 16 consecutive bytes of its output row, so the unrotated codes need no transpose either);
//  - pass 2: the stages h = 16 ... n/16 within the CTA's rows, up to four per sweep, a thread holding one column's
//    2^s values in registers; one barrier per sweep;
//  - pass 3, after a cluster barrier: the stages h = n/8, n/4, n/2 pair rows of different CTAs. CTA q finishes the
//    slab rows j of its eighth of the slab for every CTA: for each (j, four columns) a thread reads the eight
//    CTAs' values through distributed shared memory, runs the three stages in registers and writes the eight
//    rows' results (their max |v|, four codes in one 4-byte store, or four rotated values); a second cluster
//    barrier keeps every CTA's shared memory until the others have read it.
// Shared memory holds value (r, c) in 16-byte slot (4r + c/4) ^ (4·bit 4 of r), i.e. rows r and r ^ 1 trade
// halves of their 128-byte line when bit 4 of r is set: pass 1's quarter-warps store rows r and r + 16 (the same
// banks without the swap), pass 2's warps read rows r and r + 1, pass 3's quarter-warps rows j and j + 1 (one line
// either way): no bank conflicts.
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/halo.cuh"
#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

using namespace halo_detail;

constexpr int kCluster = 8;
constexpr int kWidth = 16;
constexpr int kColThreads = 256;
constexpr int64_t kMinColumnRotation = 256;   // n/8 rows per CTA: at least two 16-row groups
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

__device__ __forceinline__ int slot(int r, int cq) { return (4 * r + cq) ^ (((r >> 4) & 1) << 2); }

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
// taking one column's 2^S values base + t·2^b0 (b0 >= 4, so consecutive threads read one row's 16 columns and
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

// Row r of a staged slab sits at row slot sr(r) (Note [HALO column kernels], staging): rows 16 apart land in
// different 32-byte (bf16, f16) or 64-byte (f32) quarters or halves of a 128-byte line, so pass 1's warps, whose
// threads read rows 16·grp + j, see at most the conflicts the access size forces.
template <int RowBytes>
__device__ __forceinline__ int staged_row(int r) {
  constexpr int kPerLine = 128 / RowBytes;
  return (r & ~(kPerLine - 1)) | ((r ^ (r >> 4)) & (kPerLine - 1));
}

// The CTA's slab of strip col0 (rows row0 ... row0 + rc − 1, kWidth columns) copied into stage with 16-byte
// cp.async copies; the caller waits for them before a barrier.
template <DType DT>
__device__ __forceinline__ void stage_slab(uint8_t* stage, const void* x, int64_t C, int row0, int64_t col0, int rc) {
  constexpr int kEsize = DT == DType::f32 ? 4 : 2, kRowBytes = kWidth * kEsize, kChunks = kRowBytes / 16;
  const auto* src = static_cast<const uint8_t*>(x);
  for (int u = threadIdx.x; u < rc * kChunks; u += blockDim.x) {
    const int r = u / kChunks, k = u % kChunks;
    copy16_async(stage + staged_row<kRowBytes>(r) * kRowBytes + 16 * k,
                 src + ((row0 + r) * C + col0) * kEsize + 16 * k);
  }
}

// Four elements of row r, columns 4·cq ... 4·cq + 3 of a staged slab, as f32.
template <DType DT>
__device__ __forceinline__ void load4_staged(const uint8_t* stage, int r, int cq, float* v) {
  constexpr int kEsize = DT == DType::f32 ? 4 : 2, kRowBytes = kWidth * kEsize;
  const uint8_t* p = stage + staged_row<kRowBytes>(r) * kRowBytes + cq * 4 * kEsize;
  if constexpr (DT == DType::f32) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    unpack2<DT>(w.x, v);
    unpack2<DT>(w.y, v + 2);
  }
}

// I8: the carrier of quantize mode's codes (false in the other modes). Pair: the unrotated side (absmax and
// quantize modes). A cluster takes the strips cluster_id, cluster_id + clusters, ...; staged: each CTA's next slab
// is copied into shared memory (after the f32 slab) while the current strip is rotated.
template <DType DT, ColMode M, bool Pair, bool I8>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kColThreads)
    columns_kernel(const void* x, int64_t C, int log_n, ColOut o, bool staged) {
  extern __shared__ float4 cols_smem[];
  float* buf = reinterpret_cast<float*>(cols_smem);
  const int n = 1 << log_n, log_rc = log_n - 3, rc = 1 << log_rc;
  const int rank = static_cast<int>(cluster_rank());
  const int64_t strips = C / kWidth, clusters = gridDim.x / kCluster;
  const int row0 = rank * rc;
  uint8_t* stage = staged ? reinterpret_cast<uint8_t*>(buf + rc * kWidth) : nullptr;
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
  int64_t strip = blockIdx.x / kCluster;
  if (stage != nullptr) {
    if (strip < strips) stage_slab<DT>(stage, x, C, row0, strip * kWidth, rc);
    copy_async_wait_all();
    __syncthreads();
  }
  for (; strip < strips; strip += clusters) {
    const int64_t col0 = strip * kWidth;
    // pass 1: rows row0 + 16·grp + j (j < 16) of columns 4·cq ... 4·cq + 3
    for (int q = threadIdx.x; q < rc / 4; q += blockDim.x) {
      const int cq = q & 3, grp = q >> 2;
      float v[16][4];
      if (stage != nullptr) {
#pragma unroll
        for (int j = 0; j < 16; ++j) load4_staged<DT>(stage, 16 * grp + j, cq, v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) load4<DT>(x, (row0 + 16 * grp + j) * C + col0 + 4 * cq, v[j]);
      }
      if constexpr (Pair && M == ColMode::absmax) {
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) mx_plain = fmaxf(mx_plain, fabsf(v[j][e]));
      } else if constexpr (Pair && M == ColMode::quantize) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // column col0 + 4·cq + e: its 16 codes, consecutive in its (C, n) row
          uint32_t w[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float t[4] = {v[4 * k][e], v[4 * k + 1][e], v[4 * k + 2][e], v[4 * k + 3][e]};
            w[k] = codes4<I8>(t, m_plain, r_plain);
          }
          *reinterpret_cast<uint4*>(o.codes_plain + (col0 + 4 * cq + e) * n + row0 + 16 * grp) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
#pragma unroll
      for (int h = 1; h < 16; h <<= 1)
#pragma unroll
        for (int j = 0; j < 16; ++j)
          if ((j & h) == 0)
#pragma unroll
            for (int e = 0; e < 4; ++e) bfly(v[j][e], v[j + h][e]);
#pragma unroll
      for (int j = 0; j < 16; ++j) cols_smem[slot(16 * grp + j, cq)] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
    }
    __syncthreads();
    // the staging area is free: the next strip's slab comes in during passes 2 and 3
    if (stage != nullptr && strip + clusters < strips) stage_slab<DT>(stage, x, C, row0, (strip + clusters) * kWidth, rc);
    // pass 2
    for (int b0 = 4; b0 < log_rc;) {
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
    const float4* peer[kCluster];
#pragma unroll
    for (int p = 0; p < kCluster; ++p) peer[p] = cluster_peer(static_cast<const float4*>(cols_smem), p);
    for (int q = threadIdx.x; q < share * 4; q += blockDim.x) {
      const int cq = q & 3, j = rank * share + (q >> 2), sl = slot(j, cq);
      float v[kCluster][4];
#pragma unroll
      for (int p = 0; p < kCluster; ++p) {
        const float4 f = peer[p][sl];
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
              const uint32_t lo =
                  uint32_t{detail::float_to_bf16_bits(w[0])} | uint32_t{detail::float_to_bf16_bits(w[1])} << 16;
              const uint32_t hi =
                  uint32_t{detail::float_to_bf16_bits(w[2])} | uint32_t{detail::float_to_bf16_bits(w[3])} << 16;
              *reinterpret_cast<uint2*>(static_cast<uint16_t*>(o.out) + at) = make_uint2(lo, hi);
            }
          }
        }
      }
    }
    if (stage != nullptr) copy_async_wait_all();  // the next slab, before the barriers that publish it
    cluster_sync_all();  // no CTA overwrites its slab (or leaves) while another reads it
    __syncthreads();
  }
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

// Shared memory of a CTA: its f32 slab (n/8 rows of kWidth values) and, staged, the next slab in the input dtype;
// staging is left out where both would not fit kMaxColSmem (f32 input at n = 16384).
constexpr size_t kMaxColSmem = 192 * 1024;

template <DType DT, ColMode M, bool Pair, bool I8>
void launch_columns(const HaloColumnsArgs& a, const ColOut& o, cudaStream_t stream) {
  constexpr auto kernel = &columns_kernel<DT, M, Pair, I8>;
  constexpr size_t kEsize = DT == DType::f32 ? 4 : 2;
  const size_t rc = static_cast<size_t>(a.n) / kCluster;
  const size_t work = rc * kWidth * sizeof(float), staging = rc * kWidth * kEsize;
  const bool staged = aligned_to(a.x, 16) && work + staging <= kMaxColSmem;
  const size_t smem = work + (staged ? staging : 0);
  opt_in_shared<kernel>(smem, kMaxColSmem);
  int log_n = 0;
  while ((int64_t{1} << log_n) < a.n) ++log_n;
  // as many clusters as are resident at once (each takes strips in turn: the staging overlaps them), asked once
  // per kernel and size
  static std::atomic<int> resident[16];
  const int key = log_n + (staged ? 8 : 0) - 8;  // log_n 8 ... 14
  int clusters = resident[key].load();
  if (clusters == 0) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kCluster, 1, 1);
    cfg.blockDim = dim3(kColThreads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 1) {
      (void)cudaGetLastError();
      clusters = 1 << 20;  // unknown: one cluster per strip
    }
    resident[key] = clusters;
  }
  const int64_t strips = a.C / kWidth;
  const int64_t grid_clusters = strips < clusters ? strips : clusters;
  kernel<<<static_cast<unsigned>(grid_clusters * kCluster), kColThreads, smem, stream>>>(a.x, a.C, log_n, o, staged);
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
