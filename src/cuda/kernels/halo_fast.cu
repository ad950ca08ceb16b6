// HALO's fast row kernels (contract: cuda/kernels/halo_fast.cuh). Bit-identical to the CPU reference
// (src/grad/halo_quant.cpp) and to the general kernels of halo.cu: every butterfly is the same f32 __fadd_rn /
// __fsub_rn of the same pair, the K×K stage sums in the same k order, the quantiser is the same code_of.
//
// Note [HALO fast rows]
// One CTA of 256 threads (128 for rows of at most 4096 values) per row at a time (grid-stride over rows), the row
// as n floats in shared memory.
//  A. Each warp takes 512-value chunks of the row: lane l loads values 16·l ... 16·l + 15 (16-byte vector loads
//     when the row's start allows, zeros beyond C), runs the butterfly stages h = 1, 2, 4, 8 in registers and
//     h = 16 ... 256 through warp shuffles (the lane with bit h/16 clear holds a and keeps a + b), and stores its
//     16 values. P >= 512, so these stages never cross a run of P values. One barrier.
//  B. The stages h = 512 ... P/2, up to four per pass: a thread loads the 2^s values base + h0·t (t < 2^s) of a
//     group closed under those stages, runs them in registers and stores them back; one barrier per pass
//     (n = 4096: one pass; 32768: two).
//  C. K > 1: the K×K stage, one column p < P per thread with its K values in registers; one barrier.
//  D. The row leaves shared memory four consecutive values per thread: their max |v|, their four codes (one
//     4-byte store: a warp writes 128 contiguous bytes) or their scaled f32 / bf16 values; one barrier. The
//     absmax pass of a power-of-two rotation (K = 1) takes max |v| in registers at the last butterfly stage
//     instead (the max does not depend on where the values sit), skipping that stage's stores and phase D.
// A row therefore costs 3 to 5 barriers, against one per butterfly stage beyond 128 in the general kernel, and
// its global loads are 16 bytes wide; rows are prefetched (Note [HALO row prefetch]). Shared memory is swizzled so
// that no phase has bank conflicts: value i lives at i ^ ((i >> 3) & 12), i.e. 16-byte unit u at u ^ ((u >> 3) & 3)
// (the unit moves within its aligned group of four). Phase A's lanes store units 4l + q: without the swizzle the
// eight lanes of a quarter-warp would hit two bank groups; with it, eight. Phases B and C read 32 consecutive
// values per warp (a permutation within them) and phase D 8 consecutive units per quarter-warp (likewise).
//
// Note [HALO paired quantiser]
// HALO-2's backward quantises the rows of g_yᵀ twice: unrotated (the g_w product) and rotated along T (the g_x
// product). The paired kernels do both in the same two passes over the rows: phase A hands each lane's 16 loaded
// values, before any butterfly, to the unrotated side (the absmax pass raises a second device word with their
// max |v|; the quantise pass writes their codes, 16 bytes per lane, with the unrotated scale), so g_yᵀ is read
// twice instead of four times. Each side's values, maxima and codes are those of its own quantiser.
//
// Note [HALO row prefetch]
// A CTA reads global memory only in phase A, then works on shared memory for the rest of the row: loading each row
// when its phase A starts leaves most of the time without a load in flight (about a quarter of the memory rate
// measured on an H200 with four CTAs per SM). When the row's bytes (C elements of the input dtype) are a multiple
// of 16, start 16-byte aligned and fit beside the rotated row (kMaxStagedSmem), the next row of the CTA is copied
// into a staging area of shared memory with cp.async right after phase A of the current one, so the copy runs
// during phases B to D; phase A then reads the staged row (the same values: only where they come from changes).
// The first row is staged before the loop; the wait for a row's copies precedes the barrier that ends the
// previous row.
#include <type_traits>

#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/halo_fast.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels::halo_fast {
namespace {

using namespace halo_detail;

// Threads per CTA: kThreads, or kSmallThreads for rows of at most kSmallRow values. A K = 1 kernel uses 64
// registers per thread, so an SM holds four CTAs of 256 threads or eight of 128: with short rows, whose shared
// memory allows eight, the smaller CTAs keep twice as many rows (and staged copies) in flight with the same warps.
// Every loop over a row strides by the block's threads (phase A by its warps), so the values do not depend on it.
constexpr int kThreads = 256;
constexpr int kSmallThreads = 128;
constexpr int64_t kSmallRow = 4096;
constexpr int kChunk = 512;               // values per warp in phase A: 32 lanes × 16
constexpr int kMaxN = 32768;              // grad::kHaloMaxRotation
// Shared memory of a CTA with a staged row (Note [HALO row prefetch]): at most 100 KiB, so that two CTAs fit on
// an SM (228 KiB, 1 KiB of it reserved per CTA); the largest launch asks for kMaxSmem.
constexpr size_t kMaxStagedSmem = 100 * 1024;
constexpr size_t kMaxSmem = kMaxN * sizeof(float) > kMaxStagedSmem ? kMaxN * sizeof(float) : kMaxStagedSmem;

enum class Mode { rotate, absmax, quantize };

struct Out {
  // rotate: out (R, cols) of out_dtype, each value multiplied by mult
  void* out = nullptr;
  DType out_dtype = DType::f32;
  int cols = 0;
  float mult = 1.0f;
  float* absmax = nullptr;  // absmax: the device word to raise
  // quantize: codes (R, n), absmax m given, scale written by CTA 0
  uint8_t* codes = nullptr;
  bool int8 = true;
  const float* m = nullptr;
  float* scale = nullptr;
  // Note [HALO paired quantiser]: the unrotated values' absmax word (absmax mode), or their codes (R, C) for the
  // absmax m_plain and their scale (quantize mode); unused unless the kernel's Pair is true
  float* absmax_plain = nullptr;
  uint8_t* codes_plain = nullptr;
  const float* m_plain = nullptr;
  float* scale_plain = nullptr;
  // Note [HALO row prefetch]: rows are staged in shared memory after the rotated row (set by launch())
  bool staged = false;
};

__device__ __forceinline__ int sw(int i) { return i ^ ((i >> 3) & 12); }   // value index -> shared slot
__device__ __forceinline__ int sw4(int u) { return u ^ ((u >> 3) & 3); }   // 16-byte unit -> shared unit

__device__ __forceinline__ void butterfly(float& a, float& b) {
  const float u = a, v = b;
  a = __fadd_rn(u, v);
  b = __fsub_rn(u, v);
}

// What the paired quantiser (Note [HALO paired quantiser]) does with a lane's 16 unrotated values v, the row's
// columns start ... start + 15 (zeros from C on): absmax mode raises *mx_plain; quantize mode writes their codes.
template <Mode M>
struct PlainSide {
  float* mx_plain;         // absmax mode
  uint8_t* codes_plain;    // quantize mode: codes (R, C), the unrotated absmax, its reciprocal step, the carrier
  float m, r;
  bool int8;
  __device__ __forceinline__ void operator()(const float* v, int64_t row, int start, int C) const {
    if constexpr (M == Mode::absmax) {
#pragma unroll
      for (int e = 0; e < 16; ++e) *mx_plain = fmaxf(*mx_plain, fabsf(v[e]));
    } else if constexpr (M == Mode::quantize) {
      uint8_t* dst = codes_plain + row * C + start;
      if (start + 16 <= C && C % 16 == 0 && reinterpret_cast<uintptr_t>(codes_plain) % 16 == 0) {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int e = 0; e < 16; ++e) w[e / 4] |= uint32_t{code_of(v[e], m, r, int8)} << (8 * (e % 4));
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int e = 0; e < 16; ++e)
          if (start + e < C) dst[e] = code_of(v[e], m, r, int8);
      }
    }
  }
};

// Nothing: the kernels without a paired output.
struct NoSide {
  __device__ __forceinline__ void operator()(const float*, int64_t, int, int) const {}
};

// Row `row` of x copied into shared memory at stage with 16-byte cp.async copies (Note [HALO row prefetch]; the
// row's C·kBytes bytes are a multiple of 16 and x is 16-byte aligned). The caller waits before reading it.
template <DType DT>
__device__ __forceinline__ void stage_row(void* stage, const HaloRowsArgs& a, int64_t row) {
  const int units = static_cast<int>(a.C) * Vec16<DT>::kBytes / 16;
  const char* src = static_cast<const char*>(a.x) + row * a.C * Vec16<DT>::kBytes;
  for (int u = threadIdx.x; u < units; u += blockDim.x)
    copy16_async(static_cast<char*>(stage) + 16 * u, src + 16 * int64_t{u});
}

// Phases A to C of Note [HALO fast rows] for row `row`: buf holds the rotated row (swizzled) and the block is
// synchronised when it returns. side(v, row, start, C) sees each lane's 16 loaded values before the butterflies.
// stage: the row staged in shared memory (Note [HALO row prefetch]; vec is then true), or null: read x.
// after_a() runs once phase A's barrier has passed (the staging area is free again).
// RegMax (the absmax pass of a power-of-two rotation, K = 1): the last butterfly pass raises mx with its values
// from registers instead of storing them, so buf does not hold the row afterwards and phase D has nothing to read.
template <DType DT, int K, bool RegMax, class Side, class AfterA>
__device__ __forceinline__ void rotate_row(float4* smem, const HaloRowsArgs& a, const HaloSigns& s, int64_t row,
                                           bool vec, const Side& side, const void* stage, const AfterA& after_a,
                                           float& mx) {
  static_assert(!RegMax || K == 1, "the K×K stage reads the butterflies' results from shared memory");
  float* buf = reinterpret_cast<float*>(smem);
  const int n = static_cast<int>(a.n), C = static_cast<int>(a.C), P = n / K;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  constexpr int V = Vec16<DT>::V;
  const int64_t off = row * a.C;
  // A
  for (int c = threadIdx.x >> 5; c < n / kChunk; c += warps) {  // warp-uniform: every lane shuffles
    const int start = c * kChunk + lane * 16;
    float v[16];
    if (vec && start + 16 <= C) {
      if (stage != nullptr) {
#pragma unroll
        for (int q = 0; q < 16; q += V) Vec16<DT>::load_shared(stage, start + q, v + q);
      } else {
#pragma unroll
        for (int q = 0; q < 16; q += V) Vec16<DT>::load(a.x, off + start + q, v + q);
      }
    } else if (stage != nullptr) {
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = start + e < C ? shared_elem<DT>(stage, start + e) : 0.0f;
    } else {
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = start + e < C ? load_elem<DT>(a.x, off + start + e) : 0.0f;
    }
    side(v, row, start, C);
#pragma unroll
    for (int h = 1; h < 16; h <<= 1)
#pragma unroll
      for (int e = 0; e < 16; ++e)
        if ((e & h) == 0) butterfly(v[e], v[e + h]);
#pragma unroll
    for (int bit = 1; bit < 32; bit <<= 1)
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const float o = __shfl_xor_sync(0xffffffffU, v[e], bit);
        v[e] = lane & bit ? __fsub_rn(o, v[e]) : __fadd_rn(v[e], o);
      }
    if (RegMax && P == kChunk) {  // no phase B: these are the rotated values
#pragma unroll
      for (int e = 0; e < 16; ++e) mx = fmaxf(mx, fabsf(v[e]));
      continue;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
      smem[sw4(start / 4 + q)] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  }
  __syncthreads();
  after_a();
  // B
  const int log_p = 31 - __clz(P);
  for (int log_h0 = 9; log_h0 < log_p;) {
    const int s = log_p - log_h0 < 4 ? log_p - log_h0 : 4, h0 = 1 << log_h0, groups = n >> s;
    const bool last = log_h0 + s == log_p;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
      const int base = ((g >> log_h0) << (log_h0 + s)) | (g & (h0 - 1));
      float v[16];
#pragma unroll
      for (int t = 0; t < 16; ++t)
        if (t < (1 << s)) v[t] = buf[sw(base + h0 * t)];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (u < s)
#pragma unroll
          for (int t = 0; t < 16; ++t)
            if (t < (1 << s) && (t & (1 << u)) == 0) butterfly(v[t], v[t + (1 << u)]);
      if (RegMax && last) {
#pragma unroll
        for (int t = 0; t < 16; ++t)
          if (t < (1 << s)) mx = fmaxf(mx, fabsf(v[t]));
      } else {
#pragma unroll
        for (int t = 0; t < 16; ++t)
          if (t < (1 << s)) buf[sw(base + h0 * t)] = v[t];
      }
    }
    __syncthreads();
    log_h0 += s;
  }
  // C
  if constexpr (K > 1) {
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
      float u[K];
#pragma unroll
      for (int k = 0; k < K; ++k) u[k] = buf[sw(k * P + p)];
#pragma unroll 1
      for (int i = 0; i < K; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const bool neg = a.inverse ? (s.row[i] >> k) & 1U : (s.row[k] >> i) & 1U;
          acc = neg ? __fsub_rn(acc, u[k]) : __fadd_rn(acc, u[k]);
        }
        buf[sw(i * P + p)] = acc;
      }
    }
    __syncthreads();
  }
}

template <DType DT, int K, Mode M, bool Pair>
__global__ void __launch_bounds__(kThreads) rows_kernel(HaloRowsArgs a, HaloSigns s, Out o) {
  extern __shared__ float4 smem[];
  const int n4 = static_cast<int>(a.n) / 4;
  const bool vec = a.C % Vec16<DT>::V == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  float m = 0.0f, r = 0.0f, mx = 0.0f, mx_plain = 0.0f;
  PlainSide<M> plain{&mx_plain, o.codes_plain, 0.0f, 0.0f, o.int8};
  if constexpr (M == Mode::quantize) {
    m = *o.m;
    r = reciprocal_step(m, o.int8);
    if (blockIdx.x == 0 && threadIdx.x == 0) *o.scale = scale_of(m, o.int8);
    if constexpr (Pair) {
      plain.m = *o.m_plain;
      plain.r = reciprocal_step(plain.m, o.int8);
      if (blockIdx.x == 0 && threadIdx.x == 0) *o.scale_plain = scale_of(plain.m, o.int8);
    }
  }
  const bool out_vec = M == Mode::rotate && o.cols % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(o.out) % (o.out_dtype == DType::f32 ? 16 : 8) == 0;
  // Note [HALO row prefetch]: the CTA's first row staged before the loop, each next one after phase A
  void* stage = o.staged ? static_cast<void*>(reinterpret_cast<float*>(smem) + a.n) : nullptr;
  if (stage != nullptr) {
    if (blockIdx.x < a.R) stage_row<DT>(stage, a, blockIdx.x);
    copy_async_wait_all();
    __syncthreads();
  }
  for (int64_t row = blockIdx.x; row < a.R; row += gridDim.x) {
    const int64_t next = row + gridDim.x;
    const auto after_a = [&] {
      if (stage != nullptr && next < a.R) stage_row<DT>(stage, a, next);
    };
    constexpr bool kRegMax = M == Mode::absmax && K == 1;
    if constexpr (Pair) rotate_row<DT, K, kRegMax>(smem, a, s, row, vec, plain, stage, after_a, mx);
    else rotate_row<DT, K, kRegMax>(smem, a, s, row, vec, NoSide{}, stage, after_a, mx);
    // D
    if constexpr (M == Mode::absmax) {
      if constexpr (!kRegMax) {
        for (int u = threadIdx.x; u < n4; u += blockDim.x) {
          const float4 f = smem[sw4(u)];
          mx = fmaxf(fmaxf(mx, fabsf(f.x)), fmaxf(fmaxf(fabsf(f.y), fabsf(f.z)), fabsf(f.w)));
        }
      }
    } else if constexpr (M == Mode::quantize) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(o.codes + row * a.n);
      for (int u = threadIdx.x; u < n4; u += blockDim.x) {
        const float4 f = smem[sw4(u)];
        dst[u] = uint32_t{code_of(f.x, m, r, o.int8)} | uint32_t{code_of(f.y, m, r, o.int8)} << 8 |
                 uint32_t{code_of(f.z, m, r, o.int8)} << 16 | uint32_t{code_of(f.w, m, r, o.int8)} << 24;
      }
    } else {
      for (int u = threadIdx.x; 4 * u < o.cols; u += blockDim.x) {
        const float4 f = smem[sw4(u)];
        const float w[4] = {__fmul_rn(f.x, o.mult), __fmul_rn(f.y, o.mult), __fmul_rn(f.z, o.mult),
                            __fmul_rn(f.w, o.mult)};
        const int64_t at = row * o.cols + 4 * u;
        if (o.out_dtype == DType::f32) {
          float* dst = static_cast<float*>(o.out) + at;
          if (out_vec) {
            *reinterpret_cast<float4*>(dst) = make_float4(w[0], w[1], w[2], w[3]);
          } else {
            for (int j = 0; j < 4 && 4 * u + j < o.cols; ++j) dst[j] = w[j];
          }
        } else {
          uint16_t b[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) b[j] = detail::float_to_bf16_bits(w[j]);
          uint16_t* dst = static_cast<uint16_t*>(o.out) + at;
          if (out_vec) {
            *reinterpret_cast<uint2*>(dst) = make_uint2(uint32_t{b[0]} | uint32_t{b[1]} << 16,
                                                        uint32_t{b[2]} | uint32_t{b[3]} << 16);
          } else {
            for (int j = 0; j < 4 && 4 * u + j < o.cols; ++j) dst[j] = b[j];
          }
        }
      }
    }
    if (stage != nullptr) copy_async_wait_all();  // the next row's copies, before the barrier that publishes them
    __syncthreads();  // before the next row overwrites the buffer
  }
  if constexpr (M == Mode::absmax) {
    block_max_into(o.absmax, mx);
    if constexpr (Pair) {
      __syncthreads();  // block_max's scratch is read by warp 0 above before it is written again
      block_max_into(o.absmax_plain, mx_plain);
    }
  }
}

template <DType DT, int K, Mode M, bool Pair>
void launch(const HaloRowsArgs& a, const HaloSigns& s, Out o, cudaStream_t stream) {
  constexpr auto kernel = &rows_kernel<DT, K, M, Pair>;
  const size_t rotated = static_cast<size_t>(a.n) * sizeof(float);
  const size_t row_bytes = static_cast<size_t>(a.C) * Vec16<DT>::kBytes;
  // the kernel's `vec` (C a multiple of V, x 16-byte aligned) and room for the staged row
  o.staged = a.C % Vec16<DT>::V == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
             rotated + row_bytes <= kMaxStagedSmem;
  const size_t smem = rotated + (o.staged ? row_bytes : 0);
  opt_in_shared<kernel>(smem, kMaxSmem);
  kernel<<<row_grid(a.R), a.n <= kSmallRow ? kSmallThreads : kThreads, smem, stream>>>(a, s, o);
}

template <Mode M, bool Pair = false>
void dispatch(const HaloRowsArgs& a, const HaloSigns& s, const Out& o, cudaStream_t stream) {
  with_k(a.k, [&](auto k) {
    constexpr int K = decltype(k)::value;
    switch (a.in_dtype) {
      case DType::f32: return launch<DType::f32, K, M, Pair>(a, s, o, stream);
      case DType::bf16: return launch<DType::bf16, K, M, Pair>(a, s, o, stream);
      case DType::f16: return launch<DType::f16, K, M, Pair>(a, s, o, stream);
      default: HT_UNSUPPORTED_DTYPE("halo fast rows", a.in_dtype);
    }
  });
}

}  // namespace

bool applies(const HaloRowsArgs& a) {
  if (a.n <= 0 || a.n > kMaxN || a.k < 1 || a.n % a.k != 0 || a.C > a.n) return false;
  const int64_t p = a.n / a.k;
  if (p < kChunk || (p & (p - 1)) != 0) return false;
  return a.in_dtype == DType::f32 || a.in_dtype == DType::bf16 || a.in_dtype == DType::f16;
}

void rotate(const HaloRowsArgs& a, const HaloSigns& signs, void* out, DType out_dtype, int64_t cols, float mult,
            cudaStream_t stream) {
  if (out_dtype != DType::f32 && out_dtype != DType::bf16) HT_UNSUPPORTED_DTYPE("halo_rotate", out_dtype);
  Out o;
  o.out = out;
  o.out_dtype = out_dtype;
  o.cols = static_cast<int>(cols);
  o.mult = mult;
  dispatch<Mode::rotate>(a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_rotate_fast");
}

void absmax(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, cudaStream_t stream) {
  Out o;
  o.absmax = absmax;
  dispatch<Mode::absmax>(a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_absmax_fast");
}

void quantize(const HaloRowsArgs& a, const HaloSigns& signs, uint8_t* codes, bool int8, const float* absmax,
              float* scale, cudaStream_t stream) {
  Out o;
  o.codes = codes;
  o.int8 = int8;
  o.m = absmax;
  o.scale = scale;
  dispatch<Mode::quantize>(a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_quantize_fast");
}

void absmax_pair(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, float* absmax_plain,
                 cudaStream_t stream) {
  Out o;
  o.absmax = absmax;
  o.absmax_plain = absmax_plain;
  dispatch<Mode::absmax, true>(a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_absmax_pair_fast");
}

void quantize_pair(const HaloRowsArgs& a, const HaloSigns& signs, uint8_t* codes, uint8_t* codes_plain, bool int8,
                   const float* absmax, const float* absmax_plain, float* scale, float* scale_plain,
                   cudaStream_t stream) {
  Out o;
  o.codes = codes;
  o.int8 = int8;
  o.m = absmax;
  o.scale = scale;
  o.codes_plain = codes_plain;
  o.m_plain = absmax_plain;
  o.scale_plain = scale_plain;
  dispatch<Mode::quantize, true>(a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_quantize_pair_fast");
}

}  // namespace ht::kernels::halo_fast
