// HALO's square row kernels (contract: cuda/kernels/halo_square.cuh). Bit-identical to the CPU reference
// (src/grad/halo_quant.cpp) and to the fast row kernels of halo_fast.cu: the stages h = 1, 2, ..., n/2 run in that
// order, each the same f32 addition or subtraction of the same pair (a shuffle stage's as a multiply-add by ±1, Note
// [HALO shuffle stage]), and the codes are code_of's.
//
// Note [HALO square rows]
// A row of n = 64·S values (S = 32, 64, 128 or 256: n = 2048 ... 16384) is rotated in two register phases with one
// round trip through shared memory between them. A CTA of S threads takes a row at a time (grid-stride over the
// rows, as many CTAs as fit on the device):
//  1. Thread u holds the 64 consecutive values 64u + e (e < 64), read from the row staged in shared memory, and runs
//     the stages h = 1 ... 32 in registers; for S > 64 the stages h = 64 ... S/2 pair it with lane u ^ (h/64)
//     through warp shuffles (one at n = 8192, two at 16384). It stores its values as 16 float4 units, unit q of row
//     u at u·16 + (q ^ (u & 7)) (the swizzle spreads a quarter-warp's eight 16-byte stores over all 32 banks). One
//     barrier.
//  2. Thread j holds the 64 values S·w + j (w < 64) (a warp's 32 lanes read 32 distinct banks: the swizzle only
//     permutes whole units within a row), and runs the stages h = max(64, S) ... n/2 in its registers (w's bits;
//     at S = 32 bit 0 of w is bit 5 of the index, whose stage phase 1 ran). Its value w is then the rotated value
//     S·w + j. The quantise and rotation passes write each result (a code, or the value times mult as f32 or bf16,
//     the bf16 ones rounded in pairs: Note [HALO bf16 pairs] in halo_common.cuh) into an output row in shared
//     memory, and after a barrier the CTA copies that row out with 16-byte stores, a warp's 32 lanes 512
//     consecutive bytes. The absmax pass stops before the last stage and takes fl(|a| + |b|) of each of its pairs
//     (a, b), which is max(|fl(a + b)|, |fl(a − b)|) exactly: with a and b of the same sign |a + b| = |a| + |b| and
//     |a − b| <= |a| + |b|, otherwise the other way round, and rounding to nearest is symmetric and monotonic; a
//     NaN or an Inf gives the same max (fmaxf skips NaN; Inf − Inf is NaN where Inf + Inf is Inf). One addition and
//     one max for two values instead of two of each.
// The paired passes (Note [HALO paired quantiser] in halo_fast.cu) take the unrotated side in phase 1, from the
// 64 values a thread loaded: their max |v|, or their 64 codes written to the unrotated codes' row directly.
// The next row of the CTA is copied into the staging area with cp.async once phase 1 has read the current one
// (Note [HALO row prefetch]: loads stay in flight while the row is rotated), each thread copying 16-byte units of
// the row in order (a warp 512 consecutive bytes) to where phase 1's threads read them. Against the fast row kernels
// (Note [HALO fast rows]: 16 values a lane, two round trips through shared memory and a warp-shuffle stage), a value
// costs one shared-memory round trip instead of two and no shuffle, and each thread's 64 values give every stage 32
// independent butterflies.
// Every value leaving phase 2 is the result of an f32 addition (and of the multiplication by the quantiser's
// reciprocal), and CUDA's arithmetic returns NaN with the sign clear, which the e4m3 conversion instruction and
// e4m3_code both encode as 0x7F; so the codes are converted in pairs with no NaN test (tested on rows holding NaNs).
#include "cuda/kernels/halo_square.cuh"

#include <type_traits>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {

namespace halo_square {
namespace {

using namespace halo_detail;

constexpr int kV = 64;  // values a thread holds in each phase

constinit LaunchCounter g_launches;  // halo_square_launches()

using halo_fast::rows::Mode;
using halo_fast::rows::Out;

// 16-byte units of a thread's 64 input values
template <DType DT>
constexpr int kUnits = kV * Vec16<DT>::kBytes / 16;

// Shared memory: the row as f32, the staged input row, the output row of the quantise or rotation pass.
template <int N, DType DT, Mode M, DType OT>
constexpr size_t smem_bytes() {
  const size_t out = M == Mode::quantize ? N : M == Mode::rotate ? size_t{N} * (OT == DType::f32 ? 4 : 2) : 0;
  return size_t{N} * 4 + size_t{N} * Vec16<DT>::kBytes + out;
}

// The stages H0, 2·H0, ..., below HEnd of 64 registers: v[e] and v[e + h] for e without bit h.
template <int H0, int HEnd = kV>
__device__ __forceinline__ void stages(float (&v)[kV]) {
#pragma unroll
  for (int h = H0; h < HEnd; h <<= 1)
#pragma unroll
    for (int e = 0; e < kV; ++e)
      if ((e & h) == 0) butterfly(v[e], v[e + h]);
}

// Row `row` of x into the staging area with cp.async: 16-byte unit c of the row (c = thread + S·k) belongs to
// phase 1's thread u = c / U as its unit q = c % U, kept at u·16U + 16·(q ^ (u & 7)) bytes (Note [HALO square rows]).
template <int N, DType DT>
__device__ __forceinline__ void stage_row(char* stage, const void* x, int64_t row) {
  constexpr int U = kUnits<DT>, S = N / kV;
  const char* src = static_cast<const char*>(x) + row * (int64_t{N} * Vec16<DT>::kBytes);
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const int c = static_cast<int>(threadIdx.x) + S * k, u = c / U, q = c % U;
    copy16_async(stage + u * 16 * U + 16 * (q ^ (u & 7)), src + 16 * int64_t{c});
  }
}

// N: the row's values (2048, 4096, 8192 or 16384). Pair: the unrotated side too (absmax and quantise passes). OT: the rotation
// pass's output dtype (f32 or bf16; unused by the other passes). I8: the quantise pass's carrier.
template <int N, DType DT, Mode M, bool Pair, bool I8, DType OT>
__global__ void __launch_bounds__(N / kV) square_kernel(HaloRowsArgs a, Out o) {
  constexpr int S = N / kV;  // threads, and the stride of phase 2's values
  static_assert(S == 32 || S == 64 || S == 128 || S == 256, "rows of 2048, 4096, 8192 or 16384 values");
  extern __shared__ float4 square_smem[];
  float* const buf = reinterpret_cast<float*>(square_smem);
  char* const stage = reinterpret_cast<char*>(buf + N);
  char* const outa = stage + N * Vec16<DT>::kBytes;
  constexpr int U = kUnits<DT>, VL = Vec16<DT>::V;
  const int t = static_cast<int>(threadIdx.x), sx = t & 7;
  float mx = 0.0f, mx_plain = 0.0f;
  QuantStep q{0.0f, 0.0f}, qp{0.0f, 0.0f};
  if constexpr (M == Mode::quantize) quant_steps<Pair>(o, I8, q, qp);
  const float m = q.m, r = q.r, m_plain = qp.m, r_plain = qp.r;
  // Note [HALO row order] (halo_fast.cu): the absmax pass takes the rows from the last to the first
  constexpr bool kReverse = M == Mode::absmax;
  const auto row_at = [&](int64_t i) { return kReverse ? a.R - 1 - i : i; };
  const char* const my_stage = stage + t * 16 * U;
  // phase 2: value S·w + t is value e = (S·w + t) & 63 of the buffer's row u = (S·w + t) >> 6, at word
  // 4·((e >> 2) ^ (u & 7)) + (e & 3) of that row. S >= 64: u = (S/64)·w + (t >> 6), e = t & 63, and off[c] is that
  // word for (S/64)·w & 7 = c. S = 32: u = w >> 1, e = 32·(w & 1) + t (bit 5 of e is above the swizzle's bits), so
  // the value sits at 32·w + off[u & 7].
  const float* const col = buf + (S >= kV ? kV * (t >> 6) : 0);
  int off[8];
#pragma unroll
  for (int c = 0; c < 8; ++c)
    off[c] = 4 * (((t & 63) >> 2) ^ ((c + (S >= kV ? t >> 6 : 0)) & 7)) + (t & 3);
  if (blockIdx.x < a.R) stage_row<N, DT>(stage, a.x, row_at(blockIdx.x));
  for (int64_t i = blockIdx.x; i < a.R; i += gridDim.x) {
    const int64_t row = row_at(i);
    copy_async_wait_all();
    __syncthreads();  // the staged row is complete; the previous row's phase 2 is done with buf
    float v[kV];
    // 1: values 64t ... 64t + 63, the stages h = 1 ... 32 (and h = 64 ... S/2 for S > 64)
#pragma unroll
    for (int q = 0; q < U; ++q)
      Vec16<DT>::unpack(*reinterpret_cast<const uint4*>(my_stage + 16 * (q ^ sx)), v + VL * q);
    if constexpr (Pair && M == Mode::absmax) {
#pragma unroll
      for (int e = 0; e < kV; ++e) mx_plain = fmaxf(mx_plain, fabsf(v[e]));
    } else if constexpr (Pair && M == Mode::quantize) {
      uint4* const dst = reinterpret_cast<uint4*>(o.codes_plain + row * int64_t{N} + kV * t);
#pragma unroll
      for (int q = 0; q < kV / 16; ++q)
        dst[q] = make_uint4(codes4<I8>(v + 16 * q, m_plain, r_plain), codes4<I8>(v + 16 * q + 4, m_plain, r_plain),
                            codes4<I8>(v + 16 * q + 8, m_plain, r_plain),
                            codes4<I8>(v + 16 * q + 12, m_plain, r_plain));
    }
    stages<1>(v);
    // S > 64: the stages h = 64 ... S/2 pair thread t with lane t ^ (h/64), one instruction a value (Note [HALO shuffle
    // stage] in halo_common.cuh)
#pragma unroll
    for (int l = 1; l < S / kV; l <<= 1) {
      const float sign = (t & l) != 0 ? -1.0f : 1.0f;
#pragma unroll
      for (int e = 0; e < kV; ++e) v[e] = shuffle_butterfly(v[e], l, sign);
    }
#pragma unroll
    for (int q = 0; q < kV / 4; ++q)
      reinterpret_cast<float4*>(buf)[t * (kV / 4) + (q ^ sx)] =
          make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    __syncthreads();  // buf holds the row; every thread has read its staged values
    if (i + gridDim.x < a.R) stage_row<N, DT>(stage, a.x, row_at(i + gridDim.x));
    // 2: values S·w + t, the stages h = 64 ... N/2 not yet run (at S = 32, h = 32 was phase 1's last)
#pragma unroll
    for (int w = 0; w < kV; ++w) {
      if constexpr (S >= kV) {
        constexpr int kRowsPerW = S / kV;  // buffer rows between w and w + 1
        v[w] = col[kV * kRowsPerW * w + off[(kRowsPerW * w) & 7]];
      } else {
        v[w] = col[S * w + off[(w >> 1) & 7]];
      }
    }
    constexpr int kH0 = S >= kV ? 1 : kV / S;
    if constexpr (M == Mode::absmax) {
      // Note [HALO square rows], absmax: the last stage's pair (a, b) as fl(|a| + |b|)
      stages<kH0, kV / 2>(v);
#pragma unroll
      for (int w = 0; w < kV / 2; ++w) mx = fmaxf(mx, __fadd_rn(fabsf(v[w]), fabsf(v[w + kV / 2])));
    } else {
      stages<kH0>(v);
      if constexpr (M == Mode::quantize) {
        uint8_t* const oc = reinterpret_cast<uint8_t*>(outa) + t;
        if (m == 0.0f) {
#pragma unroll
          for (int w = 0; w < kV; ++w) oc[S * w] = 0;
        } else if constexpr (I8) {
#pragma unroll
          for (int w = 0; w < kV; ++w) oc[S * w] = int8_code(__fmul_rn(v[w], r));
        } else {
#pragma unroll
          for (int w = 0; w < kV; w += 2) {
            const unsigned short pair = e4m3_pair(__fmul_rn(v[w], r), __fmul_rn(v[w + 1], r));
            oc[S * w] = static_cast<uint8_t>(pair & 0xffU);
            oc[S * (w + 1)] = static_cast<uint8_t>(pair >> 8);
          }
        }
      } else if constexpr (OT == DType::f32) {
        float* const of = reinterpret_cast<float*>(outa) + t;
#pragma unroll
        for (int w = 0; w < kV; ++w) of[S * w] = __fmul_rn(v[w], o.mult);
      } else {
        // Note [HALO bf16 pairs] (halo_common.cuh): rounded in pairs, the row's NaN test kept in one predicate
        uint16_t* const ob = reinterpret_cast<uint16_t*>(outa) + t;
        bool nan = false;
#pragma unroll
        for (int w = 0; w < kV; w += 2) {
          const float y0 = __fmul_rn(v[w], o.mult), y1 = __fmul_rn(v[w + 1], o.mult);
          nan = nan | (y0 != y0) | (y1 != y1);  // setp.nan, folded into one predicate
          const uint32_t b = bf16_pair_hw(y0, y1);
          ob[S * w] = static_cast<uint16_t>(b & 0xffffU);
          ob[S * (w + 1)] = static_cast<uint16_t>(b >> 16);
        }
        if (nan) {  // unrolled: v stays in registers
#pragma unroll
          for (int w = 0; w < kV; ++w) ob[S * w] = detail::float_to_bf16_bits(__fmul_rn(v[w], o.mult));
        }
      }
      __syncthreads();  // the output row is complete
      constexpr int kOutBytes = M == Mode::quantize ? 1 : (OT == DType::f32 ? 4 : 2);
      constexpr int kOutUnits = N * kOutBytes / 16;
      uint4* const dst = reinterpret_cast<uint4*>(
          (M == Mode::quantize ? static_cast<char*>(static_cast<void*>(o.codes)) : static_cast<char*>(o.out)) +
          row * (int64_t{N} * kOutBytes));
#pragma unroll
      for (int k = 0; k < kOutUnits / S; ++k) dst[t + S * k] = reinterpret_cast<const uint4*>(outa)[t + S * k];
    }
  }
  if constexpr (M == Mode::absmax) {
    block_max_into(o.absmax, mx);
    if constexpr (Pair) {
      __syncthreads();  // block_max's scratch is read by warp 0 above before it is written again
      block_max_into(o.absmax_plain, mx_plain);
    }
  }
}

template <int N, DType DT, Mode M, bool Pair, bool I8, DType OT>
void launch(const HaloRowsArgs& a, const Out& o, cudaStream_t stream) {
  constexpr auto kernel = &square_kernel<N, DT, M, Pair, I8, OT>;
  constexpr size_t smem = smem_bytes<N, DT, M, OT>();
  constexpr int kThreads = N / kV;
  opt_in_shared<kernel>(smem, smem);
  // persistent: as many CTAs as fit on the device (each holds a staged row in flight)
  static const int64_t resident = cuda::resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, smem);
  const int64_t cap = resident > 0 ? resident : kMaxRowBlocks;
  const auto grid = static_cast<unsigned>(a.R < 1 ? 1 : (a.R < cap ? a.R : cap));
  kernel<<<grid, kThreads, smem, stream>>>(a, o);
  g_launches.add();
}

template <Mode M, bool Pair, bool I8, DType OT>
void by_size(const HaloRowsArgs& a, const Out& o, cudaStream_t stream) {
  const auto by_n = [&](auto dt) {
    constexpr DType DT = decltype(dt)::value;
    switch (a.n) {
      case 2048: return launch<2048, DT, M, Pair, I8, OT>(a, o, stream);
      case 4096: return launch<4096, DT, M, Pair, I8, OT>(a, o, stream);
      case 8192: return launch<8192, DT, M, Pair, I8, OT>(a, o, stream);
      default: return launch<16384, DT, M, Pair, I8, OT>(a, o, stream);
    }
  };
  switch (a.in_dtype) {
    case DType::f32: return by_n(std::integral_constant<DType, DType::f32>{});
    case DType::bf16: return by_n(std::integral_constant<DType, DType::bf16>{});
    default: return by_n(std::integral_constant<DType, DType::f16>{});
  }
}

bool takes(Mode mode, const HaloRowsArgs& a, const Out& o) {
  const bool rows = a.square && (a.n == 2048 || a.n == 4096 || a.n == 8192 || a.n == 16384) && a.C == a.n &&
                    a.k == 1 && aligned_to(a.x, 16) &&
                    (a.in_dtype == DType::f32 || a.in_dtype == DType::bf16 || a.in_dtype == DType::f16);
  if (!rows) return false;
  switch (mode) {
    case Mode::absmax: return true;
    case Mode::quantize: return aligned_to(o.codes, 16) && (o.codes_plain == nullptr || aligned_to(o.codes_plain, 16));
    case Mode::rotate:
      return o.cols == a.n && aligned_to(o.out, 16) && (o.out_dtype == DType::f32 || o.out_dtype == DType::bf16);
  }
  return false;
}

}  // namespace

bool run(Mode mode, bool pair, const HaloRowsArgs& a, const Out& o, cudaStream_t stream) {
  if (!takes(mode, a, o)) return false;
  switch (mode) {
    case Mode::absmax:
      if (pair) by_size<Mode::absmax, true, false, DType::f32>(a, o, stream);
      else by_size<Mode::absmax, false, false, DType::f32>(a, o, stream);
      break;
    case Mode::quantize:
      if (pair && o.int8) by_size<Mode::quantize, true, true, DType::f32>(a, o, stream);
      else if (pair) by_size<Mode::quantize, true, false, DType::f32>(a, o, stream);
      else if (o.int8) by_size<Mode::quantize, false, true, DType::f32>(a, o, stream);
      else by_size<Mode::quantize, false, false, DType::f32>(a, o, stream);
      break;
    case Mode::rotate:
      if (o.out_dtype == DType::f32) by_size<Mode::rotate, false, false, DType::f32>(a, o, stream);
      else by_size<Mode::rotate, false, false, DType::bf16>(a, o, stream);
      break;
  }
  return true;
}

}  // namespace halo_square

int64_t halo_square_launches() { return halo_square::g_launches.get(); }

}  // namespace ht::kernels
