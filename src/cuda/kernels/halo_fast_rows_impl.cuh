// HALO's fast row kernels (Note [HALO fast rows] in halo_fast.cu), included by the translation units that
// instantiate rows::run<K> (halo_fast_k<K>.cu), one per rotation order K. Internal to src/cuda/kernels.
//
// Note [HALO folded K×K stage]
// Phase C of Note [HALO fast rows] multiplies each column of K values by the K×K Hadamard matrix in the reference's
// order: acc = 0, then acc ± u[k] for k = 0 ... K − 1, the sign from H_K; for K = 28 and 36 the pair sums and
// differences, then K/2 terms an output (Note [HALO paired K×K stage] in grad/halo_paley.h). Read from a
// runtime table (HaloSigns), each term costs a shift, a test and a select beside its addition, several times the
// addition itself. The matrices are fixed (grad/halo_paley.h computes them at compile time), so for K <=
// kMaxFoldedK the signs are template arguments and each term is one __fadd_rn or __fsub_rn: the same operations in
// the same order, hence the same bits (folded_column; paired_column for K = 28). The larger orders (36, 44, 60:
// rotation sizes no LLaMA width needs; every Llama-2/3 width is K = 1 or 28, Qwen2's 18944 pads to 20·1024) keep the
// runtime table (36 in the paired order, paired_kk_column), which holds their code size, and with it the build time,
// to that of the loop: unrolled, K = 60 would be 3,600 additions in each of two directions in each of the 15 kernel
// variants of its translation unit.
#pragma once
#include <array>
#include <type_traits>
#include <utility>

#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/halo_fast_rows.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "hadatrain/grad/halo_paley.h"

namespace ht::kernels::halo_fast::rows {

using namespace halo_detail;

// Threads per CTA: kThreads, or kSmallThreads for rows of at most kSmallRow values. A K = 1 kernel uses 64
// registers per thread, so an SM holds four CTAs of 256 threads or eight of 128: with short rows, whose shared
// memory allows eight, the smaller CTAs keep twice as many rows (and staged copies) in flight with the same warps.
// Every loop over a row strides by the block's threads (phase A by its warps), so the values do not depend on it.
constexpr int kThreads = 256;
constexpr int kSmallThreads = 128;
static_assert(kThreads % 128 == 0 && kSmallThreads % 128 == 0, "phase D steps the swizzled unit by the block");
constexpr int64_t kSmallRow = 4096;
// Shared memory of a CTA with a staged row (Note [HALO row prefetch]): at most 100 KiB, so that two CTAs fit on
// an SM (228 KiB, 1 KiB of it reserved per CTA); the largest launch asks for kMaxSmem.
constexpr size_t kMaxStagedSmem = 100 * 1024;
constexpr size_t kMaxSmem = kMaxN * sizeof(float) > kMaxStagedSmem ? kMaxN * sizeof(float) : kMaxStagedSmem;

// value index -> shared slot, and 16-byte unit -> shared unit (Note [HALO fast rows], shared-memory layout)
__device__ __forceinline__ int sw(int i) { return i ^ ((i >> 3) & 12) ^ ((i >> 4) & 16); }
__device__ __forceinline__ int sw4(int u) { return u ^ ((u >> 3) & 3) ^ ((u >> 4) & 4); }

// One pass of phase B (Note [HALO fast rows]): the stages h0 = 2^log_h0 ... 2^(log_h0 + S − 1), h0 >= 512, each
// thread taking groups of 2^S values base + h0·t. Since h0·t is a multiple of 512 and sw() changes bits 2 to 4
// from bits 5, 6 and 8 only, sw(base + h0·t) = sw(base) + h0·t: one swizzle per group. RegMax and `last`: the
// values' max |v| instead of their stores (the absmax pass of a power-of-two rotation).
template <int S, bool RegMax>
__device__ __forceinline__ void pass_b(float* buf, int n, int log_h0, bool last, float& mx) {
  constexpr int G = 1 << S;
  const int h0 = 1 << log_h0, groups = n >> S;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float* const p = buf + sw(((g >> log_h0) << (log_h0 + S)) | (g & (h0 - 1)));
    float v[G];
#pragma unroll
    for (int t = 0; t < G; ++t) v[t] = p[t * h0];
#pragma unroll
    for (int u = 1; u < G; u <<= 1)
#pragma unroll
      for (int t = 0; t < G; ++t)
        if ((t & u) == 0) butterfly(v[t], v[t + u]);
    if (RegMax && last) {
#pragma unroll
      for (int t = 0; t < G; ++t) mx = fmaxf(mx, fabsf(v[t]));
    } else {
#pragma unroll
      for (int t = 0; t < G; ++t) p[t * h0] = v[t];
    }
  }
}

// ---- phase C: the K×K stage (Note [HALO folded K×K stage]) ----
inline constexpr int kMaxFoldedK = 28;

template <int K>
inline constexpr std::array<uint64_t, K> kPaley = grad::halo_paley_signs<K>();

// Whether term k of output i is subtracted: H_K[k][i] = −1 (v·H), or H_K[i][k] = −1 (v·Hᵀ, inverse).
template <int K, bool Inv, int I, int J>
inline constexpr bool kNeg = Inv ? ((kPaley<K>[I] >> J) & 1U) != 0 : ((kPaley<K>[J] >> I) & 1U) != 0;

template <bool Neg>
__device__ __forceinline__ float signed_add(float acc, float u) {
  if constexpr (Neg) return __fsub_rn(acc, u);
  else return __fadd_rn(acc, u);
}

template <int K, bool Inv, int I, int... J>
__device__ __forceinline__ float folded_output(const float* u, std::integer_sequence<int, J...>) {
  float acc = 0.0f;
  ((acc = signed_add<kNeg<K, Inv, I, J>>(acc, u[J])), ...);
  return acc;
}

template <int K, bool Inv, int... I>
__device__ __forceinline__ void folded_column(float* col, int P, const float* u, std::integer_sequence<int, I...>) {
  ((col[I * P] = folded_output<K, Inv, I>(u, std::make_integer_sequence<int, K>{})), ...);
}

// Note [HALO paired K×K stage] (grad/halo_paley.h) with the signs folded: term I of output C = 2J + Odd as
// grad::paley::pair_term gives it for H_K's row 2I, at compile time.
template <int K, int J, bool Odd, int I>
struct PairTerm {
  static constexpr grad::paley::PairTerm kTerm = grad::paley::pair_term(I, 2 * J + (Odd ? 1 : 0), kPaley<K>[2 * I]);
  static constexpr bool kMinus = kTerm.minus;
  __device__ __forceinline__ static float value(const float* ps, const float* ms) {
    if constexpr (kTerm.sum) return ps[I];
    else return ms[I];
  }
};

template <int K, int J, bool Odd, int I0, int... I>
__device__ __forceinline__ float pair_output(const float* ps, const float* ms, std::integer_sequence<int, I0, I...>) {
  using T0 = PairTerm<K, J, Odd, I0>;
  float acc = T0::kMinus ? -T0::value(ps, ms) : T0::value(ps, ms);  // t_0 itself (a negation is exact)
  ((acc = signed_add<PairTerm<K, J, Odd, I>::kMinus>(acc, PairTerm<K, J, Odd, I>::value(ps, ms))), ...);
  return acc;
}

template <int K, int... J>
__device__ __forceinline__ void paired_column(float* col, int P, const float* u, std::integer_sequence<int, J...>) {
  constexpr int kHalf = K / 2;
  float ps[kHalf], ms[kHalf];
  pair_sums<K>(u, ps, ms);
  ((col[(2 * J) * P] = pair_output<K, J, false>(ps, ms, std::make_integer_sequence<int, kHalf>{}),
    col[(2 * J + 1) * P] = pair_output<K, J, true>(ps, ms, std::make_integer_sequence<int, kHalf>{})),
   ...);
}

// Columns p < P of buf (one per thread, strided by the block), each replaced by its K outputs. P is a multiple of
// 512, so sw(k·P + p) = sw(p) + k·P (as in pass_b).
template <int K, bool Inv>
__device__ __forceinline__ void kk_stage(float* buf, int P, const HaloSigns& s) {
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    float* const col = buf + sw(p);
    float u[K];
#pragma unroll
    for (int k = 0; k < K; ++k) u[k] = col[k * P];
    if constexpr (grad::paley::pair_form(K) && K <= kMaxFoldedK) {
      paired_column<K>(col, P, u, std::make_integer_sequence<int, K / 2>{});
    } else if constexpr (grad::paley::pair_form(K)) {
      paired_kk_column<K>(col, P, u, s);
    } else if constexpr (K <= kMaxFoldedK) {
      folded_column<K, Inv>(col, P, u, std::make_integer_sequence<int, K>{});
    } else {
#pragma unroll 1
      for (int i = 0; i < K; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const bool neg = Inv ? (s.row[i] >> k) & 1U : (s.row[k] >> i) & 1U;
          acc = neg ? __fsub_rn(acc, u[k]) : __fadd_rn(acc, u[k]);
        }
        col[i * P] = acc;
      }
    }
  }
}

// What the paired quantiser (Note [HALO paired quantiser]) does with a lane's 16 unrotated values v, the row's
// columns start ... start + 15 (zeros from C on): absmax mode raises *mx_plain; quantize mode writes their codes in
// the carrier I8 (int8, else e4m3; Note [HALO codes by four]).
template <Mode M, bool I8>
struct PlainSide {
  float* mx_plain;         // absmax mode
  uint8_t* codes_plain;    // quantize mode: codes (R, C), the unrotated absmax and its reciprocal step
  float m, r;
  __device__ __forceinline__ void operator()(const float* v, int64_t row, int start, int C) const {
    if constexpr (M == Mode::absmax) {
#pragma unroll
      for (int e = 0; e < 16; ++e) *mx_plain = fmaxf(*mx_plain, fabsf(v[e]));
    } else if constexpr (M == Mode::quantize) {
      uint8_t* dst = codes_plain + row * C + start;
      if (start + 16 <= C && C % 16 == 0 && reinterpret_cast<uintptr_t>(codes_plain) % 16 == 0) {
        *reinterpret_cast<uint4*>(dst) =
            make_uint4(codes4<I8>(v, m, r), codes4<I8>(v + 4, m, r), codes4<I8>(v + 8, m, r), codes4<I8>(v + 12, m, r));
      } else {
#pragma unroll
        for (int e = 0; e < 16; ++e)
          if (start + e < C) dst[e] = code_of(v[e], m, r, I8);
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
  for (int c = threadIdx.x >> 5; c < n / kChunk; c += warps) {  // warp-uniform: every lane shuffles (A2)
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
    for (int q = 0; q < 4; ++q)
      smem[sw4(start / 4 + q)] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    __syncwarp();
    // A2 (Note [HALO fast rows]): lane l takes the values p0 + 16·t of its warp's chunk (t < 16), p0 = the chunk's
    // start + 256·(l / 16) + l % 16, for the stages h = 16 ... 128; sw(p0 + 16·t) = (sw(p0) ^ X(t & 7)) + Y(t)
    // with X on bits 2 to 4 and Y on bits 5 to 7 (sw(p0) has none there), so eight bases serve the 16 slots.
    const int p0 = c * kChunk + (lane >> 4) * 256 + (lane & 15);
    float* base[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) base[j] = buf + (sw(p0) ^ (((j >> 1) & 3) << 2) ^ ((j & 1) << 4));
#pragma unroll
    for (int t = 0; t < 16; ++t) v[t] = base[t & 7][(t >> 1) << 5];
#pragma unroll
    for (int h = 1; h < 16; h <<= 1)
#pragma unroll
      for (int e = 0; e < 16; ++e)
        if ((e & h) == 0) butterfly(v[e], v[e + h]);
    // h = 256: the partner is lane l ^ 16 (Note [HALO shuffle stage] in halo_common.cuh)
    const float sign = (lane & 16) != 0 ? -1.0f : 1.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = shuffle_butterfly(v[e], 16, sign);
    if (RegMax && P == kChunk) {  // no phase B: these are the rotated values
#pragma unroll
      for (int e = 0; e < 16; ++e) mx = fmaxf(mx, fabsf(v[e]));
      continue;
    }
#pragma unroll
    for (int t = 0; t < 16; ++t) base[t & 7][(t >> 1) << 5] = v[t];
  }
  __syncthreads();
  after_a();
  // B
  const int log_p = 31 - __clz(P);
  for (int log_h0 = 9; log_h0 < log_p;) {
    const int s = log_p - log_h0 < 4 ? log_p - log_h0 : 4;
    const bool last = log_h0 + s == log_p;
    switch (s) {
      case 1: pass_b<1, RegMax>(buf, n, log_h0, last, mx); break;
      case 2: pass_b<2, RegMax>(buf, n, log_h0, last, mx); break;
      case 3: pass_b<3, RegMax>(buf, n, log_h0, last, mx); break;
      default: pass_b<4, RegMax>(buf, n, log_h0, last, mx); break;
    }
    __syncthreads();
    log_h0 += s;
  }
  // C
  if constexpr (K > 1) {
    if (a.inverse) kk_stage<K, true>(buf, P, s);
    else kk_stage<K, false>(buf, P, s);
    __syncthreads();
  }
}

// I8: the carrier of quantize mode's codes (o.int8; Note [HALO codes by four]), false in the other modes.
template <DType DT, int K, Mode M, bool Pair, bool I8>
__global__ void __launch_bounds__(kThreads) rows_kernel(HaloRowsArgs a, HaloSigns s, Out o) {
  extern __shared__ float4 smem[];
  const int n4 = static_cast<int>(a.n) / 4;
  const bool vec = a.C % Vec16<DT>::V == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  float mx = 0.0f, mx_plain = 0.0f;
  QuantStep q{0.0f, 0.0f}, qp{0.0f, 0.0f};
  if constexpr (M == Mode::quantize) quant_steps<Pair>(o, I8, q, qp);
  const float m = q.m, r = q.r;
  const PlainSide<M, I8> plain{&mx_plain, o.codes_plain, qp.m, qp.r};
  const bool out_vec = M == Mode::rotate && o.cols % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(o.out) % (o.out_dtype == DType::f32 ? 16 : 8) == 0;
  // Note [HALO row order] (halo_fast.cu): the absmax pass takes the rows from the last to the first
  constexpr bool kReverse = M == Mode::absmax;
  const auto row_at = [&](int64_t i) { return kReverse ? a.R - 1 - i : i; };
  // Note [HALO row prefetch]: the CTA's first row staged before the loop, each next one after phase A
  void* stage = o.staged ? static_cast<void*>(reinterpret_cast<float*>(smem) + a.n) : nullptr;
  if (stage != nullptr) {
    if (blockIdx.x < a.R) stage_row<DT>(stage, a, row_at(blockIdx.x));
    copy_async_wait_all();
    __syncthreads();
  }
  for (int64_t i = blockIdx.x; i < a.R; i += gridDim.x) {
    const int64_t row = row_at(i), next = i + gridDim.x;
    const auto after_a = [&] {
      if (stage != nullptr && next < a.R) stage_row<DT>(stage, a, row_at(next));
    };
    constexpr bool kRegMax = M == Mode::absmax && K == 1;
    if constexpr (Pair) rotate_row<DT, K, kRegMax>(smem, a, s, row, vec, plain, stage, after_a, mx);
    else rotate_row<DT, K, kRegMax>(smem, a, s, row, vec, NoSide{}, stage, after_a, mx);
    // D: unit u = threadIdx.x + i·blockDim.x sits at sw4(threadIdx.x) + i·blockDim.x (blockDim.x a multiple of
    // 128 units; sw4 changes bits 0 to 2 from bits 3, 4 and 6 only)
    const int su = sw4(threadIdx.x);
    if constexpr (M == Mode::absmax) {
      if constexpr (!kRegMax) {
        for (int u = threadIdx.x, j = su; u < n4; u += blockDim.x, j += blockDim.x) {
          const float4 f = smem[j];
          mx = fmaxf(fmaxf(mx, fabsf(f.x)), fmaxf(fmaxf(fabsf(f.y), fabsf(f.z)), fabsf(f.w)));
        }
      }
    } else if constexpr (M == Mode::quantize) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(o.codes + row * a.n);
      for (int u = threadIdx.x, j = su; u < n4; u += blockDim.x, j += blockDim.x) {
        const float4 f = smem[j];
        const float v[4] = {f.x, f.y, f.z, f.w};
        dst[u] = codes4<I8>(v, m, r);
      }
    } else {
      for (int u = threadIdx.x, j = su; 4 * u < o.cols; u += blockDim.x, j += blockDim.x) {
        const float4 f = smem[j];
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
          // Note [HALO bf16 pairs] (halo_common.cuh)
          const uint32_t lo = bf16_pair(w[0], w[1]), hi = bf16_pair(w[2], w[3]);
          uint16_t* dst = static_cast<uint16_t*>(o.out) + at;
          if (out_vec) {
            *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
          } else {
            const uint16_t b[4] = {static_cast<uint16_t>(lo & 0xffffU), static_cast<uint16_t>(lo >> 16),
                                   static_cast<uint16_t>(hi & 0xffffU), static_cast<uint16_t>(hi >> 16)};
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

template <DType DT, int K, Mode M, bool Pair, bool I8>
void launch(const HaloRowsArgs& a, const HaloSigns& s, Out o, cudaStream_t stream) {
  constexpr auto kernel = &rows_kernel<DT, K, M, Pair, I8>;
  const size_t rotated = static_cast<size_t>(a.n) * sizeof(float);
  const size_t row_bytes = static_cast<size_t>(a.C) * Vec16<DT>::kBytes;
  // the kernel's `vec` (C a multiple of V, x 16-byte aligned) and room for the staged row
  o.staged = a.C % Vec16<DT>::V == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
             rotated + row_bytes <= kMaxStagedSmem;
  const size_t smem = rotated + (o.staged ? row_bytes : 0);
  opt_in_shared<kernel>(smem, kMaxSmem);
  kernel<<<row_grid(a.R), a.n <= kSmallRow ? kSmallThreads : kThreads, smem, stream>>>(a, s, o);
}

template <int K>
void run(Mode mode, bool pair, const HaloRowsArgs& a, const HaloSigns& s, const Out& o, cudaStream_t stream) {
  const auto by_carrier = [&](auto m, auto p, auto i8) {
    constexpr Mode M = decltype(m)::value;
    constexpr bool Pair = decltype(p)::value, I8 = decltype(i8)::value;
    switch (a.in_dtype) {
      case DType::f32: return launch<DType::f32, K, M, Pair, I8>(a, s, o, stream);
      case DType::bf16: return launch<DType::bf16, K, M, Pair, I8>(a, s, o, stream);
      case DType::f16: return launch<DType::f16, K, M, Pair, I8>(a, s, o, stream);
      default: HT_UNSUPPORTED_DTYPE("halo fast rows", a.in_dtype);
    }
  };
  // the carrier is a template argument of quantize mode only (Note [HALO codes by four])
  const auto by_dtype = [&](auto m, auto p) {
    if constexpr (decltype(m)::value == Mode::quantize) {
      if (o.int8) return by_carrier(m, p, std::true_type{});
    }
    return by_carrier(m, p, std::false_type{});
  };
  using std::integral_constant;
  switch (mode) {
    case Mode::rotate: return by_dtype(integral_constant<Mode, Mode::rotate>{}, std::false_type{});
    case Mode::absmax:
      if (pair) return by_dtype(integral_constant<Mode, Mode::absmax>{}, std::true_type{});
      return by_dtype(integral_constant<Mode, Mode::absmax>{}, std::false_type{});
    case Mode::quantize:
      if (pair) return by_dtype(integral_constant<Mode, Mode::quantize>{}, std::true_type{});
      return by_dtype(integral_constant<Mode, Mode::quantize>{}, std::false_type{});
  }
}

}  // namespace ht::kernels::halo_fast::rows
