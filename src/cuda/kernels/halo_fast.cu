// HALO's fast row kernels (contract: cuda/kernels/halo_fast.cuh): the entry points; the kernels are in
// halo_fast_rows_impl.cuh, compiled once per rotation order K (halo_fast_k<K>.cu). Bit-identical to the CPU reference
// (src/grad/halo_quant.cpp) and to the general kernels of halo.cu: every butterfly is the same f32 __fadd_rn /
// __fsub_rn of the same pair (the shuffle stage's as a multiply-add by ±1, the same rounding: Note [HALO shuffle
// stage] in halo_common.cuh), the K×K stage sums in the same order (for 28 and 36 Note [HALO paired K×K stage] in
// grad/halo_paley.h), the quantiser is the same code_of.
//
// Note [HALO fast rows]
// One CTA of 256 threads (128 for rows of at most 4096 values) per row at a time (grid-stride over rows), the row
// as n floats in shared memory.
//  A. Each warp takes 512-value chunks of the row: lane l loads values 16·l ... 16·l + 15 (16-byte vector loads
//     when the row's start allows, zeros beyond C), runs the butterfly stages h = 1, 2, 4, 8 in registers and
//     stores them (four 16-byte stores). After a __syncwarp, lane l reads back the 16 values p0 + 16·t of the
//     chunk (p0 = 256·(l / 16) + l % 16) and runs h = 16 ... 128 in registers, then h = 256 with one warp
//     shuffle (the partner is lane l ^ 16; the lane holding a keeps a + b), and stores them. A warp shuffle moves
//     as many values per clock as a 4-byte shared-memory access, so this one round trip through shared memory
//     replaces four of the five shuffle stages a 16-value lane would otherwise need for h = 16 ... 256. P >= 512,
//     so these stages never cross a run of P values. One barrier.
//  B. The stages h = 512 ... P/2, up to four per pass: a thread loads the 2^s values base + h0·t (t < 2^s) of a
//     group closed under those stages, runs them in registers and stores them back; one barrier per pass
//     (n = 4096: one pass; 32768: two).
//  C. K > 1: the K×K stage, one column p < P per thread with its K values in registers (the signs folded into
//     the instructions: Note [HALO folded K×K stage] in halo_fast_rows_impl.cuh); one barrier.
//  D. The row leaves shared memory four consecutive values per thread: their max |v|, their four codes (one
//     4-byte store: a warp writes 128 contiguous bytes) or their scaled f32 / bf16 values; one barrier. The
//     absmax pass of a power-of-two rotation (K = 1) takes max |v| in registers at the last butterfly stage
//     instead (the max does not depend on where the values sit), skipping that stage's stores and phase D.
// A row therefore costs 3 to 5 barriers, against one per butterfly stage beyond 128 in the general kernel, and
// its global loads are 16 bytes wide; rows are prefetched (Note [HALO row prefetch]). Shared memory is swizzled so
// that no phase has bank conflicts: value i lives at sw(i) = i ^ ((i >> 3) & 12) ^ ((i >> 4) & 16) (bits 5, 6
// onto 2, 3 and bit 8 onto 4), i.e. 16-byte unit u at u ^ ((u >> 3) & 3) ^ ((u >> 4) & 4): each value moves
// within its aligned group of 32. Phase A's lanes store units 4l + q: without the swizzle the eight lanes of a
// quarter-warp would hit two bank groups; with it, eight. Its read-back takes, for each t, the values p0 + 16·t
// of 32 lanes: 16 consecutive values twice, 256 apart, which bit 8's term sends to the other 16 banks. Phases B
// and C read 32 consecutive values per warp and phase D 8 consecutive units per quarter-warp (a permutation
// within them).
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
//
// Note [HALO row order]
// Consecutive passes over the same tensor share the part of it still in L2 (50 MiB on an H100 or H200) when the
// next pass starts, if that pass starts where the previous one ended. The CTAs of a pass move through the rows
// together (CTA b takes rows b, b + G, ...), as the CTAs of a transpose move through its row bands, and most
// producers write their rows in order. So the absmax pass of a rotating quantiser takes the rows from the last to
// the first (its input was just written, the last rows last), its quantise pass from the first to the last (where
// the absmax pass ended), and the wide transposes (halo_transpose.cu) take their input's row bands from the last to
// the first (a quantise or rotation pass before them ended on the last rows). Each row's values do not depend on
// when it is processed: the order changes no bit.
#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/halo_fast.cuh"
#include "cuda/kernels/halo_fast_rows.cuh"
#include "cuda/kernels/halo_square.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels::halo_fast {
namespace {

using rows::kChunk;
using rows::kMaxN;
using rows::Mode;
using rows::Out;

// The square row kernels when they take the rows (Note [HALO square rows] in halo_square.cu), else the fast ones.
void dispatch(Mode mode, bool pair, const HaloRowsArgs& a, const HaloSigns& s, const Out& o, cudaStream_t stream) {
  if (halo_square::run(mode, pair, a, o, stream)) return;
  halo_detail::with_k(a.k, [&](auto k) { rows::run<decltype(k)::value>(mode, pair, a, s, o, stream); });
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
  dispatch(Mode::rotate, false, a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_rotate_fast");
}

void absmax(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, cudaStream_t stream) {
  Out o;
  o.absmax = absmax;
  dispatch(Mode::absmax, false, a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_absmax_fast");
}

void quantize(const HaloRowsArgs& a, const HaloSigns& signs, uint8_t* codes, bool int8, const float* absmax,
              float* scale, cudaStream_t stream) {
  Out o;
  o.codes = codes;
  o.int8 = int8;
  o.m = absmax;
  o.scale = scale;
  dispatch(Mode::quantize, false, a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_quantize_fast");
}

void absmax_pair(const HaloRowsArgs& a, const HaloSigns& signs, float* absmax, float* absmax_plain,
                 cudaStream_t stream) {
  Out o;
  o.absmax = absmax;
  o.absmax_plain = absmax_plain;
  dispatch(Mode::absmax, true, a, signs, o, stream);
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
  dispatch(Mode::quantize, true, a, signs, o, stream);
  HT_CHECK_LAUNCH("halo_quantize_pair_fast");
}

}  // namespace ht::kernels::halo_fast
