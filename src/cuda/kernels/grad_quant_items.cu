// The item kernels of the uniform quantiser (grad_quant_launch.cuh): items of 8 consecutive elements at
// multiples of 8, exactly one Philox block of Note [SR noise layout] each. The fused item kernel serves the
// fused path of the HLQ g_x rows: the lanes of a warp read consecutive 16-byte words and the registers stay
// few (quant_items_kernel); its stochastic rounding takes the level as ceil(|v| − u) with one round-up add
// (sr_code), which equals uniform_code's floor(|v|) + (u < frac) bit for bit. Also here: passes 1 and 3 of
// the two-pass path on items, and pass 3 into transposed values (quant_apply_t_kernel).
#include "cuda/kernels/grad_quant_common.cuh"

namespace ht::kernels::gq {
namespace {

// Item path of the fused quantiser (uniform kind, group_len % 8 == 0, x 16-byte and values 8-byte aligned,
// 16-byte for dequantised values; plan() picks it before the unit path (grad_quant_units.cu), which serves LUQ,
// unaligned pointers and group lengths that are not a multiple of 8). Work is cut into items of 8
// consecutive elements at multiples of 8: exactly one Philox block of Note [SR noise layout]. Item j of a
// group goes to thread j % team, slot j / team, so the lanes of a warp load consecutive 16-byte words (bf16 /
// f16; an f32 item is two words) and store consecutive 8-byte words (16 or 32 bytes of dequantised values):
// whole 32-byte sectors. Butterfly stages h = 1, 2, 4 (h < T) run in registers; h = 8 (T = 16) pairs item j
// (elements 0..7 of the Hadamard block) with item j ^ 1 (elements 8..15), which sits in the neighbouring lane
// because team is even: each lane gets the other's values by __shfl_xor_sync and computes
// fma(±1, own, other) = other ± own with one rounding, i.e. a + b in the even lane and a − b in the odd lane,
// the same roundings as rotate_unit. Only the converted values live across the team reduction: the noise is
// drawn afterwards, item by item, to keep the registers (and so the occupancy) low.
constexpr int kItemWarps = 1024 / 32;  // warps of the largest block (one team of up to 1024 threads, or teams of 256)
constexpr uint32_t kMagicBits = 0x4B400000u;             // bits of 1.5·2^23: [2^23, 2^24) has ulp 1

template <class T>
HT_DEV void load_item(const T* x, int64_t base, float v[kItem]) {
  constexpr int W = kItem * static_cast<int>(sizeof(T)) / 16;
  uint4 raw[W];
  const uint4* p = reinterpret_cast<const uint4*>(x + base);
#pragma unroll
  for (int w = 0; w < W; ++w) raw[w] = __ldg(p + w);
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int k = 0; k < kItem; ++k) v[k] = static_cast<float>(e[k]);
}

// Stages h = 1, 2, 4 (h < t) of the butterfly in registers, then h = 8 across the lane pair when t == 16.
// Called by every lane of the warp (the shuffle), also for empty slots (zeros).
HT_DEV void rotate_item(float v[kItem], int t, float sign) {
  butterfly_stages<kItem>(v, t);
  if (t > kItem) {
#pragma unroll
    for (int k = 0; k < kItem; ++k) v[k] = __fmaf_rn(sign, v[k], __shfl_xor_sync(kFull, v[k], 1));
  }
}

// Stochastic uniform code of one element (m > 0), equal to uniform_code(x, l, qmax, true, fp8, h):
// with a = |v|, f = floor(a) and u in (0, 1), f + (u < frac) = ceil(a − u) for finite a >= 0 (frac > u:
// a − u in (f, f + 1); else in (f − 1, f]). fl(a − u) has the same ceiling: a − u is exact when a >= 1 (both
// on a's grid, |a − u| <= a), and for a < 1 rounding keeps its sign and zero (a − u in (−1, 1)). The
// round-up add of 1.5·2^23 gives the bits of 1.5·2^23 + ceil, whose low byte is the level (the ulp there is
// 1); an unsigned min with 1.5·2^23 + qmax is fminf(q, qmax), which also sends NaN and inf (m or r not
// finite) to qmax as fminf does. q >= 0 always, so uniform_code's !(q >= 0) guard has nothing to do.
// Returns the int8 level or e4m3 code in the low byte.
template <bool kFp8>
HT_DEV uint32_t sr_code(float x, const Level& l, uint32_t cap, uint32_t h) {
  const float v = __fmul_rn(fminf(fmaxf(x, -l.m), l.m), l.r);
  const float y = __fsub_rn(fabsf(v), ht::grad::sr_uniform(h));
  const uint32_t b = min(__float_as_uint(__fadd_ru(y, 12582912.0f)), cap);
  const bool neg = v < 0.0f;
  if (!kFp8) return neg ? 0u - b : b;  // the low byte of −(1.5·2^23 + q) is −q
  if (b == kMagicBits) return 0u;       // +0 for level 0
  const float q = __fsub_rn(__uint_as_float(b), 12582912.0f);  // exact: the integer level
  return ((__float_as_uint(q) >> 20) - (120u << 3)) | (neg ? 0x80u : 0u);
}

// sr_code's level as a signed exact float, for dequantised values (the same operations, written out again so
// that sr_code compiles exactly as before). For v < 0 the bits 2·kMagicBits − b are those of 1.5·2^23 − q
// (same binade, ulp 1), so the subtraction gives −q exactly, and +0 for q = 0.
HT_DEV float sr_signed(float x, const Level& l, uint32_t cap, uint32_t h) {
  const float v = __fmul_rn(fminf(fmaxf(x, -l.m), l.m), l.r);
  const float y = __fsub_rn(fabsf(v), ht::grad::sr_uniform(h));
  const uint32_t b = min(__float_as_uint(__fadd_ru(y, 12582912.0f)), cap);
  return __fsub_rn(__uint_as_float(v < 0.0f ? 2u * kMagicBits - b : b), 12582912.0f);
}

HT_DEV uint32_t pack4(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040u), __byte_perm(b2, b3, 0x0040u), 0x5410u);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// The e4m3 codes of four signed integer levels (|q| <= 15: exact in e4m3, so cvt's rounding and saturation do
// nothing; +0 for level 0, as sr_signed gives), bytes in element order: one cvt per pair instead of sr_code's
// exponent arithmetic per element (the same codes: e4m3 has one encoding per finite nonzero value).
HT_DEV uint32_t e4m3x4(float q0, float q1, float q2, float q3) {
  unsigned short lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(q1), "f"(q0));  // high byte from the first
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(q3), "f"(q2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
#endif

// Note [Signed nearest levels]
// uniform_code rounds to nearest as q = min(rint(|v|), qmax) with v's sign, v = clamp(x, −m, m)·r. The item
// kernels (quant_item_codes; the transposed kernels' int8 codes, ItemCoder) compute the same code from the signed
// value: clamp(v, −qmax, qmax), rounded (rint, or __float2int_rn for int8 codes). Rounding to nearest even is
// symmetric, and for an integer qmax clamping before or after rounding gives the same integer; a NaN v gives
// +qmax both ways (fminf returns the other operand), and level 0 is +0 (the e4m3 path adds +0, so −0 from rint
// becomes +0; the int8 path converts to the integer 0). About half uniform_code's instructions per element: no
// sign test and select, and the hardware's conversion to e4m3 in pairs (ncu on q_proj's W, pass 3: 33 → 24 µs).

// Note [Signed nearest levels]'s value before its rounding: clamp(clamp(x, −m, m)·r, −qmax, qmax).
HT_DEV float nearest_clamped(float x, const Level& l, float qmaxf) {
  return fmaxf(fminf(__fmul_rn(fminf(fmaxf(x, -l.m), l.m), l.r), qmaxf), -qmaxf);
}

// The 8 codes of one item (elements base .. base + 7, base a multiple of 8) as two little-endian words.
template <bool kSR, bool kFp8>
HT_DEV uint2 quant_item_codes(const float v[kItem], int64_t base, const Level& l, const GradQuantArgs& a) {
  uint32_t c[kItem] = {};  // set on every path that reaches the packing below
  if constexpr (kSR) {
    uint32_t w[4];
    sr_block32(a.seed, noise_stream(a), static_cast<uint64_t>(base) >> 3, w);
    const uint32_t cap = kMagicBits + static_cast<uint32_t>(a.qmax);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (kFp8) {  // the signed levels, then the hardware's conversion in pairs
      float q[kItem];
#pragma unroll
      for (int k = 0; k < kItem; ++k) q[k] = sr_signed(v[k], l, cap, ht::grad::sr_bits(w, k));
      return make_uint2(e4m3x4(q[0], q[1], q[2], q[3]), e4m3x4(q[4], q[5], q[6], q[7]));
    } else  // NOLINT(readability/braces): the loop below is the else branch
#endif
    {
#pragma unroll
      for (int k = 0; k < kItem; ++k) c[k] = sr_code<kFp8>(v[k], l, cap, ht::grad::sr_bits(w, k));
    }
  } else {  // round to nearest: the signed level (Note [Signed nearest levels]), then one conversion
    const float qmaxf = static_cast<float>(a.qmax);
    float q[kItem];
#pragma unroll
    for (int k = 0; k < kItem; ++k) q[k] = nearest_clamped(v[k], l, qmaxf);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (kFp8) {
#pragma unroll
      for (int k = 0; k < kItem; ++k) q[k] = __fadd_rn(rintf(q[k]), 0.0f);  // −0 + 0 = +0: code 0 for level 0
      return make_uint2(e4m3x4(q[0], q[1], q[2], q[3]), e4m3x4(q[4], q[5], q[6], q[7]));
    } else  // NOLINT(readability/braces): the block below is the else branch
#endif
    {
#pragma unroll
      for (int k = 0; k < kItem; ++k)
        c[k] = kFp8 ? uniform_code(v[k], l, qmaxf, false, true, 0u) : static_cast<uint32_t>(__float2int_rn(q[k]));
    }
  }
  return make_uint2(pack4(c[0], c[1], c[2], c[3]), pack4(c[4], c[5], c[6], c[7]));
}

template <bool kSR>
HT_DEV uint2 quant_item(const float v[kItem], int64_t base, const Level& l, const GradQuantArgs& a) {
  return a.fp8_values ? quant_item_codes<kSR, true>(v, base, l, a) : quant_item_codes<kSR, false>(v, base, l, a);
}

// The dequantised values of one item into out + base (16 bytes for bf16 / f16, 32 for f32; 16-byte aligned).
// With a finite scale no product is NaN, so bf16 / f16 round two at a time (cvt_pairs); otherwise
// element by element with dequant_value's NaN code.
template <bool kSR, class Out>
HT_DEV void dequant_item(const float v[kItem], int64_t base, const Level& l, const GradQuantArgs& a) {
  float d[kItem];
  if (l.m == 0.0f) {  // zero levels, scale 0
#pragma unroll
    for (int k = 0; k < kItem; ++k) d[k] = 0.0f;
  } else if (kSR) {
    uint32_t w[4];
    sr_block32(a.seed, noise_stream(a), static_cast<uint64_t>(base) >> 3, w);
    const uint32_t cap = kMagicBits + static_cast<uint32_t>(a.qmax);
#pragma unroll
    for (int k = 0; k < kItem; ++k) d[k] = __fmul_rn(sr_signed(v[k], l, cap, ht::grad::sr_bits(w, k)), l.s);
  } else {
    const float qmaxf = static_cast<float>(a.qmax);
#pragma unroll
    for (int k = 0; k < kItem; ++k) d[k] = __fmul_rn(uniform_signed(v[k], l, qmaxf, false, 0u), l.s);
  }
  Out* out = reinterpret_cast<Out*>(a.values) + base;
  if constexpr (std::is_same_v<Out, float>) {
#pragma unroll
    for (int k = 0; k < kItem; ++k) d[k] = stored_value<float>(d[k]);
    reinterpret_cast<float4*>(out)[0] = make_float4(d[0], d[1], d[2], d[3]);
    reinterpret_cast<float4*>(out)[1] = make_float4(d[4], d[5], d[6], d[7]);
  } else {
    uint32_t w[kItem / 2];
    if (isfinite(l.s)) {
      cvt_pairs<Out, kItem>(d, w);
    } else {
#pragma unroll
      for (int j = 0; j < kItem / 2; ++j)
        w[j] = static_cast<uint32_t>(stored_value<Out>(d[2 * j]).bits) |
               (static_cast<uint32_t>(stored_value<Out>(d[2 * j + 1]).bits) << 16);
    }
    *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Quantises one item and stores it: codes (two little-endian words) or dequantised values.
template <bool kSR, class Out>
HT_DEV void store_item(const float v[kItem], int64_t base, const Level& l, const GradQuantArgs& a) {
  if constexpr (kDequant<Out>) {
    dequant_item<kSR, Out>(v, base, l, a);
  } else {
    const uint2 q = l.m == 0.0f ? make_uint2(0u, 0u) : quant_item<kSR>(v, base, l, a);
    *reinterpret_cast<uint2*>(a.values + base) = q;
  }
}

// Fused item kernel: a team of g.team threads per group (a power of two <= 32, at least 2 when T == 16, or
// whole warps), g.teams groups per block (at most 1024 threads), SLOTS items per thread. Registers are capped
// at 48 for 2 slots (no spills with ptxas -v; SAWB's double sums need 64): 42 resident warps per SM, 7 blocks
// of the 192-thread row blocks of (12608, 3072) — 65% occupancy, against 116 registers and 19% for the unit
// kernel; 3 slots (codes without SAWB, Note [Item slots]) hold 8 more values and are capped at 56 (36 warps).
// __maxnreg__ rather than __launch_bounds__, which cannot ask for 48 with 1024-thread blocks.
//
// Note [Item slots]
// What a thread does once per group (the team's reduction of max |v|, the level's division, the group's
// addresses and loop control) costs about one and a half items of quantisation work, and a team rounded up to
// whole warps or a power of two leaves slots empty that still run the butterflies (they carry zeros). plan()
// takes 3 slots instead of 2 when that team's cost, team · (slots + 1.5), is lower: for ViT-B's g_y rows (768,
// 2304 and 3072 elements: 96, 288 and 384 items) 3 slots fill teams of 32, 96 and 128 threads exactly, where 2
// slots left 25 % and 10 % of the 768- and 2304-element teams' slots empty (ncu on the H200: 60, 54 and 50
// instructions per element with 2 slots). Rows above 12288 elements take 4 slots (kItemSlotsLong, 64 registers):
// their 3-slot team of more than 512 threads (608 for Llama-3-8B's 14336) is a whole block, and at 56 registers one
// such block fills an SM's register file, so its warps meet at every team reduction with no other block to run; 4
// slots keep the team at 512 threads or fewer, two blocks per SM. The slots change which thread quantises an
// element, not how: the values, the statistics (a maximum: exact in any order) and the codes are the same.
template <class T, bool kSawb, bool kSR, class Out, int SLOTS = kItemSlots>
__global__ void __maxnreg__(kSawb || SLOTS > kItemSlotsWide ? 64 : (SLOTS > kItemSlots ? 56 : 48))
    quant_items_kernel(GradQuantArgs a, Geo g) {
  __shared__ Stats smem[kItemWarps];
  __shared__ float amax_smem[kItemWarps];
  float raw = 0.0f;  // max |x| before rotation over this thread's items (input_absmax), folded once per block
  const T* x = static_cast<const T*>(a.x);
  const int team = g.team, t = static_cast<int>(threadIdx.x) % team, sub = static_cast<int>(threadIdx.x) / team;
  const float sign = (threadIdx.x & 1u) ? -1.0f : 1.0f;  // the h = 8 stage: odd lanes hold the b of (a, b)
  for (int64_t g0 = static_cast<int64_t>(blockIdx.x) * g.teams; g0 < g.groups;
       g0 += static_cast<int64_t>(gridDim.x) * g.teams) {
    const int64_t grp = g0 + sub;
    const int64_t first = grp * a.group_len;
    float v[SLOTS][kItem];
    bool has[SLOTS];
#pragma unroll
    for (int r = 0; r < SLOTS; ++r) {
      const int64_t j = t + static_cast<int64_t>(r) * team;
      has[r] = grp < g.groups && j < g.units;
      if (has[r]) {
        load_item(x, first + j * kItem, v[r]);
      } else {
#pragma unroll
        for (int k = 0; k < kItem; ++k) v[r][k] = 0.0f;
      }
    }
    if (a.input_absmax) {  // max |x| before rotation (empty slots hold zeros)
#pragma unroll
      for (int r = 0; r < SLOTS; ++r)
#pragma unroll
        for (int k = 0; k < kItem; ++k) raw = fmaxf(raw, fabsf(v[r][k]));
    }
    Stats st{0.0f, 0.0, 0.0};
#pragma unroll
    for (int r = 0; r < SLOTS; ++r) {
      rotate_item(v[r], a.hadamard, sign);
      if (has[r]) {
        add_stats<kSawb, kItem>(st, v[r], kItem);
      }
    }
    st = team_reduce<kSawb>(st, smem, team);
    if (grp >= g.groups) continue;  // after the (block-wide) reduction
    // Codes need only r = qmax / m; the scale's division runs in the thread that stores it (dequantised values
    // need the scale everywhere).
    const float m = group_m<kSawb>(st, a.group_len);
    Level l = level_of_r(a, m);
    if (kDequant<Out> || t == 0) l.s = scale_of(a, m);
    if (t == 0) a.scale[grp] = l.s;
#pragma unroll
    for (int r = 0; r < SLOTS; ++r) {
      if (!has[r]) continue;
      const int64_t base = first + (t + static_cast<int64_t>(r) * team) * kItem;
      store_item<kSR, Out>(v[r], base, l, a);
    }
  }
  // The loop above is block-uniform (g0 depends on the block only), so every thread gets here.
  if (a.input_absmax) fold_absmax_block(a.input_absmax, raw, amax_smem);
}

// Passes 1 and 3 on items (the item layout of quant_items_kernel: lane-order 16-byte loads, the h = 8 stage
// by lane-pair shuffle), when group_len % 8 == 0 and x is 16-byte aligned (pass 3 also: uniform kind, values
// 8-byte aligned (16-byte for dequantised values), natural layout). Loops run per warp (the shuffle needs all
// 32 lanes): lane l takes item j0 + l, and lanes past the end carry zeros. Item pairs (j, j ^ 1) of a
// 16-element Hadamard block share a warp and an iteration because the strides are even and the item counts
// even when T == 16. Each iteration takes two items per thread (one stride apart), both loads issued before
// either is used.
constexpr int kPassSlots = 2;

template <class T>
HT_DEV void load_item_or_zero(const T* x, int64_t base, bool has, float v[kItem]) {
  if (has) {
    load_item(x, base, v);
  } else {
#pragma unroll
    for (int k = 0; k < kItem; ++k) v[k] = 0.0f;
  }
}

template <class T, bool kSawb>
__global__ void __launch_bounds__(kThreads, kSawb ? 5 : 6) quant_partial_items_kernel(GradQuantArgs a, Geo g,
                                                                                       Workspace ws) {
  __shared__ Stats smem[32];
  const T* x = static_cast<const T*>(a.x);
  const int64_t items = a.group_len / kItem;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float sign = (lane & 1) ? -1.0f : 1.0f;
  for (int64_t b = blockIdx.x; b < g.groups * g.parts; b += gridDim.x) {
    const int64_t grp = b / g.parts, part = b % g.parts, stride = g.parts * blockDim.x;
    Stats st{0.0f, 0.0, 0.0};
    float raw = 0.0f;  // max |x| before rotation (input_absmax)
    for (int64_t j0 = part * blockDim.x + (threadIdx.x - lane); j0 < items; j0 += kPassSlots * stride) {
      float v[kPassSlots][kItem];
      bool has[kPassSlots];
#pragma unroll
      for (int r = 0; r < kPassSlots; ++r) {
        const int64_t j = j0 + r * stride + lane;
        has[r] = j < items;
        load_item_or_zero(x, grp * a.group_len + j * kItem, has[r], v[r]);
      }
#pragma unroll
      for (int r = 0; r < kPassSlots; ++r) {
        if (a.input_absmax) {
#pragma unroll
          for (int k = 0; k < kItem; ++k) raw = fmaxf(raw, fabsf(v[r][k]));
        }
        rotate_item(v[r], a.hadamard, sign);
        if (has[r]) {
          add_stats<kSawb, kItem>(st, v[r], kItem);
        }
      }
    }
    store_partial<kSawb>(a, ws, b, st, raw, smem);
  }
}

// Pass 3 on items: thread i takes items i, i + n, i + 2n, ... (n threads in all); its group index advances
// by the constant quotient and remainder of n / items (no division per item).
template <class T, bool kSR, class Out>
__global__ void __launch_bounds__(kThreads) quant_apply_items_kernel(GradQuantArgs a, Workspace ws) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t total = a.numel / kItem, items = a.group_len / kItem, n = thread_count();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float sign = (lane & 1) ? -1.0f : 1.0f;
  const int64_t i = thread_index(), dq = n / items, dr = n % items;
  int64_t grp = i / items, rem = i % items;  // of item j
  __shared__ Level known;
  const Pass3Levels lv = pass3_levels(a, ws, &known);
  for (int64_t j0 = i; j0 - lane < total; j0 += kPassSlots * n) {  // j0 - lane: the warp's first item
    float v[kPassSlots][kItem];
#pragma unroll
    for (int r = 0; r < kPassSlots; ++r) load_item_or_zero(x, (j0 + r * n) * kItem, j0 + r * n < total, v[r]);
#pragma unroll
    for (int r = 0; r < kPassSlots; ++r) {
      const int64_t j = j0 + r * n;
      rotate_item(v[r], a.hadamard, sign);
      if (j < total) {
        if constexpr (kDequant<Out>) {
          dequant_item<kSR, Out>(v[r], j * kItem, Level{lv.m[grp], lv.r[grp], lv.s[grp]}, a);
        } else {
          const float m = lv.m[grp];
          const Level l{m, lv.r[grp], 0.0f};
          const uint2 q = m == 0.0f ? make_uint2(0u, 0u) : quant_item<kSR>(v[r], j * kItem, l, a);
          *reinterpret_cast<uint2*>(a.values + j * kItem) = q;
        }
      }
      grp += dq;  // to item j + n
      rem += dr;
      if (rem >= items) {
        rem -= items;
        ++grp;
      }
    }
  }
}

// Pass 3 for transposed values (one group, T = 1, cols % 8 == 0): tiles of 64 rows × 64 columns of x seen as
// (N, C). Each item of 8 consecutive columns (a multiple of 8 in the flat index: exactly one Philox block of
// Note [SR noise layout]) is loaded, quantised and written into a shared-memory tile laid out (column, row);
// the tile is then written out as 4-byte words along the rows of the (C, N) result.
constexpr int kTileN = 64, kTileC = 64;
constexpr int kTileStride = kTileN + 4;  // bytes per tile row: 17 words, spreads the column writes over banks

// The item at element i: 16-byte loads when x is 16-byte aligned (vec), else element by element.
template <class T>
HT_DEV void load8(const T* x, int64_t i, bool vec, float v[8]) {
  if (vec) {
    load_item(x, i, v);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = static_cast<float>(x[i + k]);
  }
}

// Pass 3 of a transposed launch: the one tensor-wide level (from the workspace) and the rounding, which turn an
// item into its codes.
// (The launch's arguments stay a reference: the kernel parameters are read where they are used, as before this
// struct, which keeps the strip kernel at 48 registers without spills.)
struct ItemCoder {
  const GradQuantArgs& a;
  Level l;
  float qmaxf;
  bool noise;  // stochastic rounding (Note [SR noise layout])

  HT_DEV ItemCoder(const GradQuantArgs& args, const Pass3Levels& lv)
      : a(args), l{lv.m[0], lv.r[0], 0.0f}, qmaxf(static_cast<float>(args.qmax)), noise(wants_uniform_noise(args)) {}

  // The codes of the item of 8 elements at flat index i (a multiple of 8: one Philox block), m > 0.
  HT_DEV void operator()(int64_t i, const float v[8], uint8_t q[8]) const {
    if (noise) {  // sr_code: uniform_code's stochastic rounding in fewer instructions
      uint32_t w[4];
      sr_block32(a.seed, noise_stream(a), static_cast<uint64_t>(i) >> 3, w);
      const uint32_t cap = kMagicBits + static_cast<uint32_t>(a.qmax);
      if (a.fp8_values) {
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = static_cast<uint8_t>(sr_code<true>(v[k], l, cap, ht::grad::sr_bits(w, k)));
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = static_cast<uint8_t>(sr_code<false>(v[k], l, cap, ht::grad::sr_bits(w, k)));
      }
    } else if (a.fp8_values) {
#pragma unroll
      for (int k = 0; k < 8; ++k) q[k] = uniform_code(v[k], l, qmaxf, false, true, 0u);
    } else {  // int8 codes from the signed level (Note [Signed nearest levels])
#pragma unroll
      for (int k = 0; k < 8; ++k) q[k] = static_cast<uint8_t>(__float2int_rn(nearest_clamped(v[k], l, qmaxf)));
    }
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads) quant_apply_t_kernel(GradQuantArgs a, Workspace ws, bool vec) {
  __shared__ uint32_t tile_w[kTileC * kTileStride / 4];
  uint8_t* tile = reinterpret_cast<uint8_t*>(tile_w);
  const T* x = static_cast<const T*>(a.x);
  const int64_t C = a.cols, N = a.numel / a.cols;
  const int64_t tiles_c = (C + kTileC - 1) / kTileC, tiles = (N + kTileN - 1) / kTileN * tiles_c;
  __shared__ Level known;  // Note [Known m in pass 3]
  const ItemCoder code(a, pass3_levels(a, ws, &known));
  const bool words = N % 4 == 0 && reinterpret_cast<uintptr_t>(a.values) % 4 == 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t n0 = t / tiles_c * kTileN, c0 = t % tiles_c * kTileC;
    for (int item = threadIdx.x; item < kTileN * kTileC / 8; item += blockDim.x) {
      const int row = item / (kTileC / 8), cg = item % (kTileC / 8);
      const int64_t n = n0 + row, c = c0 + 8 * cg;
      uint8_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (n < N && c < C && code.l.m != 0.0f) {
        const int64_t i = n * C + c;  // a multiple of 8
        float v[8];
        load8(x, i, vec, v);
        code(i, v, q);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) tile[(8 * cg + k) * kTileStride + row] = q[k];
    }
    __syncthreads();
    for (int item = threadIdx.x; item < kTileC * (kTileN / 4); item += blockDim.x) {
      const int cr = item / (kTileN / 4), part = item % (kTileN / 4);
      const int64_t c = c0 + cr, n = n0 + 4 * part;
      if (c >= C || n >= N) continue;
      const uint32_t word = tile_w[cr * (kTileStride / 4) + part];
      uint8_t* dst = a.values + c * N + n;
      if (words) {  // N % 4 == 0: the word lies inside the row and is aligned
        *reinterpret_cast<uint32_t*>(dst) = word;
      } else {
        for (int k = 0; k < 4 && n + k < N; ++k) dst[k] = static_cast<uint8_t>(word >> (8 * k));
      }
    }
    __syncthreads();  // the tile is reused
  }
}

// Note [Transposed quantiser strips]
// Pass 3 for transposed values without shared memory, when N % 4 == 0, x is 16-byte aligned and the values
// 4-byte aligned (C % 8 == 0 as for every transposed launch; every HLQ operand of a ViT; the tile kernel above
// serves the rest). A warp quantises a strip of 128 rows × 8 columns of x seen as (N, C): lane l takes rows
// 4l … 4l+3, one item per row (exactly one Philox block, as in the tile kernel: the same codes), issues its four
// 16-byte loads first, turns each row into two words of codes (bytes along the columns), transposes each 4×4
// byte block in registers (__byte_perm) into words along the rows, and writes one 4-byte word of the (C, N)
// result per column: the warp's store for a column is 128 contiguous bytes. The tile kernel stages bytes through
// shared memory (eight byte stores per item) and runs at about 0.36 of the copy bandwidth on ViT-B's g_y. Strips
// of 16 columns (two items per row, 64 registers) measured 4–7 % slower than these (47 registers for 2-byte
// inputs, 5 blocks per SM).
//
// Note [Column sums in the strip kernel]
// With column sums asked for (kSums: HLQ's g̃ pass also gives the bias gradient), each lane adds its four rows
// per column in row order in f32 (((0 + x0) + x1) + x2) + x3, the warp adds its 32 lanes by an xor butterfly (every
// lane ends with the same bits: each stage adds the same two values in either order), and lane 0 stores the
// strip's 8 sums into the partials (N / 128 strips, C); column_sums_kernel then adds the strips of a column in a
// fixed order. Rows past N (the last strip) add nothing. Deterministic, not the order of the sum op.

// Byte b of the result is byte b of row b's word: rows r0..r3 of one 4-column block -> the 4 column words.
HT_DEV void transpose4x4(const uint32_t r[4], uint32_t col[4]) {
  const uint32_t t0 = __byte_perm(r[0], r[1], 0x5140), t1 = __byte_perm(r[2], r[3], 0x5140);
  const uint32_t t2 = __byte_perm(r[0], r[1], 0x7362), t3 = __byte_perm(r[2], r[3], 0x7362);
  col[0] = __byte_perm(t0, t1, 0x5410);
  col[1] = __byte_perm(t0, t1, 0x7632);
  col[2] = __byte_perm(t2, t3, 0x5410);
  col[3] = __byte_perm(t2, t3, 0x7632);
}

// The strip's column sums (Note [Column sums in the strip kernel]): csum holds the lane's sums of its rows; lane 0
// stores the warp's 8 sums at part + c0 (32-byte aligned: C % 8 == 0, c0 % 8 == 0).
HT_DEV void store_strip_sums(float csum[kItem], float* part) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
#pragma unroll
    for (int k = 0; k < kItem; ++k) csum[k] = __fadd_rn(csum[k], __shfl_xor_sync(kFull, csum[k], off));
  if (threadIdx.x % 32 == 0) {
    reinterpret_cast<float4*>(part)[0] = make_float4(csum[0], csum[1], csum[2], csum[3]);
    reinterpret_cast<float4*>(part)[1] = make_float4(csum[4], csum[5], csum[6], csum[7]);
  }
}

// kSums: also the column sums of x into sums_part (Note [Column sums in the strip kernel]); a lighter occupancy
// bound for it (the eight sums stay live across the loads).
template <class T, bool kSums>
__global__ void __launch_bounds__(kThreads, kSums ? 4 : (sizeof(T) == 2 ? 5 : 4))
    quant_apply_t_strip_kernel(GradQuantArgs a, Workspace ws, float* sums_part) {
  constexpr int W = kItem * static_cast<int>(sizeof(T)) / 16;  // 16-byte words per item
  const T* x = static_cast<const T*>(a.x);
  const int64_t C = a.cols, N = a.numel / a.cols;
  const int64_t strips_c = C / kItem, strips = (N + kStripRows - 1) / kStripRows * strips_c;
  __shared__ Level known;  // Note [Known m in pass 3]
  const ItemCoder code(a, pass3_levels(a, ws, &known));
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t st = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; st < strips; st += warps) {
    const int64_t n = st / strips_c * kStripRows + 4 * lane, c0 = st % strips_c * kItem;
    const bool inside = n < N;  // N % 4 == 0: the lane's four rows are all inside or all outside
    if (!kSums && !inside) continue;
    uint4 raw[4][W];
    if (inside) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint4* p = reinterpret_cast<const uint4*>(x + (n + r) * C + c0);
#pragma unroll
        for (int w = 0; w < W; ++w) raw[r][w] = __ldg(p + w);
      }
    }
    if constexpr (kSums) {  // st is warp-uniform: the whole warp takes part in the butterfly; rows past N add 0
      float csum[kItem];
#pragma unroll
      for (int k = 0; k < kItem; ++k) csum[k] = 0.0f;
      if (inside) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const T* e = reinterpret_cast<const T*>(raw[r]);
#pragma unroll
          for (int k = 0; k < kItem; ++k) csum[k] = __fadd_rn(csum[k], static_cast<float>(e[k]));
        }
      }
      store_strip_sums(csum, sums_part + st / strips_c * C + c0);
      if (!inside) continue;
    }
    uint32_t words[4][2] = {};  // [row][column block]: the codes of columns c0 + 4·b … + 3
    if (code.l.m != 0.0f) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const T* e = reinterpret_cast<const T*>(raw[r]);
        float v[kItem];
#pragma unroll
        for (int k = 0; k < kItem; ++k) v[k] = static_cast<float>(e[k]);
        uint8_t q[kItem];
        code((n + r) * C + c0, v, q);
        words[r][0] = q[0] | (uint32_t{q[1]} << 8) | (uint32_t{q[2]} << 16) | (uint32_t{q[3]} << 24);
        words[r][1] = q[4] | (uint32_t{q[5]} << 8) | (uint32_t{q[6]} << 16) | (uint32_t{q[7]} << 24);
      }
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const uint32_t rows[4] = {words[0][b], words[1][b], words[2][b], words[3][b]};
      uint32_t col[4];
      transpose4x4(rows, col);
#pragma unroll
      for (int k = 0; k < 4; ++k) *reinterpret_cast<uint32_t*>(a.values + (c0 + 4 * b + k) * N + n) = col[k];
    }
  }
}

// The column sums of x from the strip partials (strips, C): thread (c, y) adds strips y, y + 8, ... of column c
// in order, then thread (c, 0) adds the eight results in y order (Note [Column sums in the strip kernel]).
__global__ void column_sums_kernel(const float* part, int64_t strips, int64_t C, float* out) {
  __shared__ float acc[8][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int64_t r = threadIdx.y; r < strips; r += 8) s = __fadd_rn(s, part[r * C + c]);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int y = 1; y < 8; ++y) s = __fadd_rn(s, acc[y][threadIdx.x]);
    out[c] = s;
  }
}

// Note [Quantiser of a transposed input]
// quantize() of x = Wᵀ, the transposed view of a dense (R, C) matrix W, with T = 16 along x's rows and one scale
// per tensor: HLQ's W operand of g_x ((I, O) = Wᵀ of the (O, I) weight). The general path has the glue copy Wᵀ
// into a dense (C, R) buffer and the two-pass kernels read that copy twice; here passes 1 and 3 read W itself, in
// tiles of 16 rows × kWtCols = 4 columns (sixteen 8-byte loads along W's rows). Column c of a tile at (o0, i0) is
// one Hadamard block of x, the elements (i0 + c, o0 ... o0 + 15), rotated by the same butterfly
// (butterfly_stages<16>: h = 1, 2, 4, 8 in order); pass 1 adds its statistics in index order, pass 3 quantises it
// with the noise of its flat index (i0 + c)·R + o0 (two Philox blocks) and writes its 16 codes as one 16-byte
// store there. So the levels, codes and scale are the general path's bit for bit, except that SAWB's double sums
// are added in another order (Note [Bit-identical quantisation] step 3: the f32 rounding of α hides that).
//
// The tile's width sets the registers: tiles of 8 columns (sixteen 16-byte loads, 64 registers of raw values) ran
// both passes at two blocks an SM (111 registers in pass 3; ncu on q_proj's W at the H200, at ncu's fixed clocks:
// 22 % occupancy, pass 1 18 µs at 1.9 TB/s, pass 3 36 µs at 1.0 TB/s); tiles of 4 run four blocks an SM (64
// registers): pass 3 33 µs, and 24 µs with the codes of Note [Signed nearest levels], which shows pass 3 bound by
// its instructions per element. Pass 1 stays at 17–18 µs: it adds SAWB's sums in f64 (a conversion and three f64
// operations per element, Note [Bit-identical quantisation] step 3). In pass 3, G adjacent lanes (G = 4 or 2, the
// largest dividing R / 16; else 1) take the same columns of G consecutive row tiles, so a column's G 16-byte code
// stores are 16·G contiguous bytes of x, whole 32-byte sectors (on 8-column tiles this alone did not move pass 3:
// 36 µs either way), and the tiles run in reverse order: pass 1 read the last tiles last, so the first blocks of
// pass 3 find them in L2 (q_proj's W is 32 MiB, the H200's L2 50 MiB; ncu: 37 % L2 hits in pass 3, 2 % in pass 1).
// Which lane quantises a tile, and when, changes nothing in its codes.

template <class T>
HT_DEV void load_wt_tile(const T* w, int64_t C, int64_t o0, int64_t i0, uint2 (&raw)[16]) {
  static_assert(sizeof(T) == 2, "an 8-byte load holds the 4 columns of a tile row for 2-byte elements only");
#pragma unroll
  for (int r = 0; r < 16; ++r) raw[r] = __ldg(reinterpret_cast<const uint2*>(w + (o0 + r) * C + i0));
}

// Column c of the tile as floats: x's Hadamard block (i0 + c, o0 ... o0 + 15).
template <class T>
HT_DEV void wt_column(const uint2 (&raw)[16], int c, float v[16]) {
#pragma unroll
  for (int r = 0; r < 16; ++r) v[r] = static_cast<float>(reinterpret_cast<const T*>(&raw[r])[c]);
}

template <class T, bool kSawb>
__global__ void __launch_bounds__(kThreads, 4) quant_partial_wt_kernel(GradQuantArgs a, Workspace ws, int64_t R,
                                                                    int64_t C) {
  __shared__ Stats smem[kThreads / 32];
  const T* w = static_cast<const T*>(a.x);
  const int64_t per_row = C / kWtCols, tiles = R / 16 * per_row;
  Stats st{0.0f, 0.0, 0.0};
  for (int64_t t = thread_index(); t < tiles; t += thread_count()) {
    const int64_t og = t / per_row;
    uint2 raw[16];
    load_wt_tile(w, C, og * 16, (t - og * per_row) * kWtCols, raw);
#pragma unroll
    for (int c = 0; c < kWtCols; ++c) {
      float v[16];
      wt_column<T>(raw, c, v);
      butterfly_stages<16>(v, 16);
      add_stats<kSawb, 16>(st, v, 16);
    }
  }
  store_partial<kSawb>(a, ws, blockIdx.x, st, 0.0f, smem);
}

// G lanes a column group (Note [Quantiser of a transposed input]): R / 16 is a multiple of G.
template <class T, bool kSR>
__global__ void __launch_bounds__(kThreads, 4) quant_apply_wt_kernel(GradQuantArgs a, Workspace ws, int64_t R,
                                                                  int64_t C, int G) {
  __shared__ Level known;
  const Pass3Levels lv = pass3_levels(a, ws, &known);
  const Level l{lv.m[0], lv.r[0], 0.0f};
  const T* w = static_cast<const T*>(a.x);
  const int64_t per_row = C / kWtCols, tiles = R / 16 * per_row;
  for (int64_t t = thread_index(); t < tiles; t += thread_count()) {
    const int64_t u = tiles - 1 - t;  // the tile, last first; tiles % G == 0, so u's group is G adjacent lanes'
    const int64_t p = u / G, band = p / per_row;  // band: G row tiles, og = band·G + u % G
    const int64_t o0 = (band * G + (u - p * G)) * 16, i0 = (p - band * per_row) * kWtCols;
    uint2 raw[16];
    load_wt_tile(w, C, o0, i0, raw);
#pragma unroll
    for (int c = 0; c < kWtCols; ++c) {
      float v[16];
      wt_column<T>(raw, c, v);
      butterfly_stages<16>(v, 16);
      const int64_t base = (i0 + c) * R + o0;
      uint2 lo = make_uint2(0u, 0u), hi = lo;
      if (l.m != 0.0f) {
        lo = quant_item<kSR>(v, base, l, a);
        hi = quant_item<kSR>(v + 8, base + 8, l, a);
      }
      *reinterpret_cast<uint4*>(a.values + base) = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
  }
}

}  // namespace

// Whether the strip kernel serves a transposed launch (Note [Transposed quantiser strips]); the tile kernel
// serves the rest.
bool strips_apply(const GradQuantArgs& a) {
  const int64_t N = a.cols == 0 ? 0 : a.numel / a.cols;
  return a.cols > 0 && a.cols % kItem == 0 && N % 4 == 0 && aligned16(a.x) &&
         reinterpret_cast<uintptr_t>(a.values) % 4 == 0;
}

void launch_fused_items(const GradQuantArgs& a, const Geo& g, cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = fused_grid(g);
    const int threads = g.team * g.teams;
    visit_store(a.store, [&](auto out) {
      using Out = decltype(out);
      if (g.slots == kItemSlotsWide) {  // plan() takes it for codes without SAWB only
        if constexpr (std::is_same_v<Out, uint8_t>) {
          if (a.stochastic) quant_items_kernel<T, false, true, Out, kItemSlotsWide><<<grid, threads, 0, stream>>>(a, g);
          else quant_items_kernel<T, false, false, Out, kItemSlotsWide><<<grid, threads, 0, stream>>>(a, g);
        } else {
          HT_UNSUPPORTED_DTYPE("grad_quant_items (3 slots a thread store codes only)", a.dtype);
        }
      } else if (g.slots == kItemSlotsLong) {  // likewise
        if constexpr (std::is_same_v<Out, uint8_t>) {
          if (a.stochastic) quant_items_kernel<T, false, true, Out, kItemSlotsLong><<<grid, threads, 0, stream>>>(a, g);
          else quant_items_kernel<T, false, false, Out, kItemSlotsLong><<<grid, threads, 0, stream>>>(a, g);
        } else {
          HT_UNSUPPORTED_DTYPE("grad_quant_items (4 slots a thread store codes only)", a.dtype);
        }
      } else if (a.sawb) {
        if (a.stochastic) quant_items_kernel<T, true, true, Out><<<grid, threads, 0, stream>>>(a, g);
        else quant_items_kernel<T, true, false, Out><<<grid, threads, 0, stream>>>(a, g);
      } else {
        if (a.stochastic) quant_items_kernel<T, false, true, Out><<<grid, threads, 0, stream>>>(a, g);
        else quant_items_kernel<T, false, false, Out><<<grid, threads, 0, stream>>>(a, g);
      }
    });
    HT_CHECK_LAUNCH("grad_quant_items");
  });
}

void launch_partial_items(const GradQuantArgs& a, const Geo& g, const Workspace& ws, cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = grid_cap(g.groups * g.parts);
    if (uses_sawb(a)) quant_partial_items_kernel<T, true><<<grid, kThreads, 0, stream>>>(a, g, ws);
    else quant_partial_items_kernel<T, false><<<grid, kThreads, 0, stream>>>(a, g, ws);
    HT_CHECK_LAUNCH("grad_quant_partial");
  });
}

void launch_apply_items(const GradQuantArgs& a, const Workspace& ws, cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = cuda::grid_for(a.numel / kItem, kThreads);
    visit_store(a.store, [&](auto out) {
      using Out = decltype(out);
      if (a.stochastic) quant_apply_items_kernel<T, true, Out><<<grid, kThreads, 0, stream>>>(a, ws);
      else quant_apply_items_kernel<T, false, Out><<<grid, kThreads, 0, stream>>>(a, ws);
    });
    HT_CHECK_LAUNCH("grad_quant_apply");
  });
}

void launch_apply_transposed(const GradQuantArgs& a, const Workspace& ws, float* sums_part, float* column_sums,
                             cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    if (strips_apply(a)) {
      const int64_t strips_n = (a.numel / a.cols + kStripRows - 1) / kStripRows;
      const int64_t strips = strips_n * (a.cols / kItem);
      const unsigned grid = grid_cap((strips + kThreads / 32 - 1) / (kThreads / 32));
      if (column_sums != nullptr) {
        quant_apply_t_strip_kernel<T, true><<<grid, kThreads, 0, stream>>>(a, ws, sums_part);
        HT_CHECK_LAUNCH("grad_quant_apply_transposed");
        const dim3 block(32, 8);
        column_sums_kernel<<<static_cast<unsigned>((a.cols + 31) / 32), block, 0, stream>>>(sums_part, strips_n,
                                                                                             a.cols, column_sums);
        HT_CHECK_LAUNCH("grad_quant_column_sums");
        return;
      }
      quant_apply_t_strip_kernel<T, false><<<grid, kThreads, 0, stream>>>(a, ws, nullptr);
    } else {
      const int64_t tiles = (a.numel / a.cols + kTileN - 1) / kTileN * ((a.cols + kTileC - 1) / kTileC);
      quant_apply_t_kernel<T><<<grid_cap(tiles), kThreads, 0, stream>>>(a, ws, aligned16(a.x));
    }
    HT_CHECK_LAUNCH("grad_quant_apply_transposed");
  });
}

// Calls f(T{}) for the 2-byte input dtypes of the transposed-input kernels (grad_quant_of_transpose_applies).
template <class F>
void visit_half_dtype(DType dt, F&& f) {
  if (dt == DType::bf16) return f(bf16{});
  if (dt == DType::f16) return f(f16{});
  HT_UNSUPPORTED_DTYPE("grad_quant (transposed input)", dt);
}

void launch_partial_wt(const GradQuantArgs& a, const Geo& g, const Workspace& ws, int64_t R, int64_t C,
                       cudaStream_t stream) {
  visit_half_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = static_cast<unsigned>(g.parts);
    if (uses_sawb(a)) quant_partial_wt_kernel<T, true><<<grid, kThreads, 0, stream>>>(a, ws, R, C);
    else quant_partial_wt_kernel<T, false><<<grid, kThreads, 0, stream>>>(a, ws, R, C);
    HT_CHECK_LAUNCH("grad_quant_partial (transposed input)");
  });
}

void launch_apply_wt(const GradQuantArgs& a, const Workspace& ws, int64_t R, int64_t C, cudaStream_t stream) {
  visit_half_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = cuda::grid_for(R / 16 * (C / kWtCols), kThreads);
    const int G = R % 64 == 0 ? 4 : R % 32 == 0 ? 2 : 1;  // lanes a column group: R / 16 divisible by G
    if (a.stochastic) quant_apply_wt_kernel<T, true><<<grid, kThreads, 0, stream>>>(a, ws, R, C, G);
    else quant_apply_wt_kernel<T, false><<<grid, kThreads, 0, stream>>>(a, ws, R, C, G);
    HT_CHECK_LAUNCH("grad_quant_apply (transposed input)");
  });
}

}  // namespace ht::kernels::gq
