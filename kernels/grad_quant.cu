// Quantisation kernels of the gradient pipelines (see grad_quant.h and Note [Bit-identical quantisation] in
// include/hadatrain/grad/quant.h). Work is cut into register units of 16 elements: in "chunk mode" (the group
// length a multiple of 16) a unit is 16 consecutive elements, 16/T whole Hadamard blocks, moved with 16-byte
// loads and stores when the pointers allow; otherwise ("block mode") a unit is one Hadamard block of T
// elements (T <= 8 then), element by element. A unit never straddles a Hadamard block or a scale group.
// Per unit: load → f32 → butterflies h = 1, 2, 4, 8 (h < T) in registers → statistics or quantisation.
// Quantisation multiplies by the group's reciprocal r = qmax / m (one __fdiv_rn per group or unit, never one
// per element) and draws 16 noise bits per element, eight elements per Philox call (Note [SR noise layout]).
// fp32 arithmetic uses __fadd_rn / __fsub_rn / __fmul_rn / __fdiv_rn (no FMA contraction); SAWB sums use
// __dadd_rn / __dmul_rn in double. Block reductions combine threads in a fixed order.
// The fused path of the uniform quantiser (the HLQ g_x rows) uses items of 8 elements instead of units, so
// that the lanes of a warp read consecutive 16-byte words and the registers stay few (quant_items_kernel);
// its stochastic rounding takes the level as ceil(|v| − u) with one round-up add (sr_code), which equals
// uniform_code's floor(|v|) + (u < frac) bit for bit.
// Every kernel that stores levels takes the stored type Out as a template parameter: uint8_t stores int8
// levels or e4m3 codes (GradQuantArgs::store codes, fp8_values), float / bf16 / f16 the dequantised values
// d = convert(float(level) · s) (Note [Bit-identical quantisation] step 4, dequant_value). The level is
// computed by the same operations either way (uniform_signed / sr_signed repeat uniform_code / sr_code);
// only the store differs.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "hadatrain/grad/sr_noise.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/scalar_types.h"
#include "kernels/convert.cuh"
#include "kernels/grad_quant.h"
#include "kernels/launch.h"
#include "kernels/layout.h"

namespace ht::kernels {
namespace {

constexpr int kU = 16;              // register slots per unit
constexpr int kFusedUnits = 2;      // units per thread in the fused kernel
constexpr int kFusedTeam = 512;     // at most this many threads per group in the fused kernel
constexpr int kFusedBlock = 256;    // target threads per block of the fused kernel (several groups per block)
constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

// How a launch cuts its work (computed on the host from the arguments).
struct Geo {
  int unit = kU;      // elements per unit: 16 (chunk mode) or T (block mode)
  bool vec = false;   // 16-byte loads and stores
  int64_t groups = 0;
  int64_t units = 0;  // units per group
  bool fused = false;
  bool items = false; // fused item path (quant_items_kernel): units are items of kItem elements
  int team = 32;      // fused: threads per group (a power of two <= 32, else a multiple of 32)
  int teams = 1;      // fused: groups per block (block = team · teams threads)
  int64_t parts = 1;  // two-pass: blocks per group in the partial reduction
};

HT_DEV int64_t thread_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
HT_DEV int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The raw bytes of one unit in flight: vector mode keeps 16 elements as 16-byte words so that the loads of
// several units (and the Philox work) can be issued before the first conversion waits for memory.
template <class T>
struct RawUnit {
  static constexpr int W = kU * static_cast<int>(sizeof(T)) / 16;
  uint4 raw[W];
};

template <class T>
HT_DEV void issue_unit(const T* x, int64_t base, RawUnit<T>& r) {
  const uint4* p = reinterpret_cast<const uint4*>(x + base);
#pragma unroll
  for (int w = 0; w < RawUnit<T>::W; ++w) r.raw[w] = __ldg(p + w);
}

template <class T>
HT_DEV void convert_unit(const RawUnit<T>& r, float v[kU]) {
  const T* e = reinterpret_cast<const T*>(r.raw);
#pragma unroll
  for (int k = 0; k < kU; ++k) v[k] = static_cast<float>(e[k]);
}

// Loads n (<= 16) elements from x + base into v[0..n) as f32 (exact for bf16 / f16); other slots 0.
template <class T>
HT_DEV void load_unit(const T* x, int64_t base, int n, bool vec, float v[kU]) {
  if (vec) {
    RawUnit<T> r;
    issue_unit(x, base, r);
    convert_unit(r, v);
  } else {
#pragma unroll
    for (int k = 0; k < kU; ++k) v[k] = k < n ? static_cast<float>(x[base + k]) : 0.0f;
  }
}

// The butterfly stages h = 1, 2, 4, ... < N with h < t on N registers, in this order (Note step 2).
template <int N>
HT_DEV void butterfly_stages(float* v, int t) {
#pragma unroll
  for (int h = 1; h < N; h *= 2) {
    if (h < t) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if ((j / h) % 2 == 0) {
          const float a = v[j], b = v[j + h];
          v[j] = __fadd_rn(a, b);
          v[j + h] = __fsub_rn(a, b);
        }
      }
    }
  }
}

// The butterfly stages h = 1, 2, 4, 8 with h < t on one 16-element unit.
HT_DEV void rotate_unit(float v[kU], int t) { butterfly_stages<kU>(v, t); }

struct Stats {
  float amax;
  double s1, s2;
};

// Folds the first n of N values into st (max |v|; with SAWB the sums of |v| and v², in index order).
template <bool kSawb, int N = kU>
HT_DEV void add_stats(Stats& st, const float* v, int n) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) {
      st.amax = fmaxf(st.amax, fabsf(v[k]));
      if (kSawb) {
        const double d = static_cast<double>(v[k]);
        st.s1 = __dadd_rn(st.s1, fabs(d));
        st.s2 = __dadd_rn(st.s2, __dmul_rn(d, d));
      }
    }
  }
}

template <bool kSawb>
HT_DEV Stats combine(Stats a, const Stats& b) {
  if (!kSawb) return {fmaxf(a.amax, b.amax), 0.0, 0.0};
  return {fmaxf(a.amax, b.amax), __dadd_rn(a.s1, b.s1), __dadd_rn(a.s2, b.s2)};
}

template <bool kSawb>
HT_DEV Stats shfl_xor(const Stats& s, int o) {
  if (!kSawb) return {__shfl_xor_sync(kFull, s.amax, o), 0.0, 0.0};
  return {__shfl_xor_sync(kFull, s.amax, o), __shfl_xor_sync(kFull, s.s1, o), __shfl_xor_sync(kFull, s.s2, o)};
}

template <bool kSawb>
HT_DEV Stats warp_reduce(Stats s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = combine<kSawb>(s, shfl_xor<kSawb>(s, o));
  return s;
}

// Every thread of the block (blockDim a multiple of 32) gets the block's combined statistics.
template <bool kSawb>
HT_DEV Stats block_reduce(Stats s, Stats* smem) {
  s = warp_reduce<kSawb>(s);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  Stats t = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : Stats{0.0f, 0.0, 0.0};
  t = warp_reduce<kSawb>(t);
  __syncthreads();  // smem may be reused
  return t;
}

// Every thread of a team (`team` consecutive threads: a power of two <= 32 inside one warp, or whole warps)
// gets its team's combined statistics. Called by every thread of the block (it may synchronise the block).
template <bool kSawb>
HT_DEV Stats team_reduce(Stats s, Stats* smem, int team) {
  const int width = team < 32 ? team : 32;
  for (int o = width / 2; o > 0; o >>= 1) s = combine<kSawb>(s, shfl_xor<kSawb>(s, o));
  if (team <= 32) return s;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  const int per = team / 32, first = warp / per * per;
  Stats t = smem[first];
  for (int k = 1; k < per; ++k) t = combine<kSawb>(t, smem[first + k]);  // fixed order
  __syncthreads();  // smem may be reused
  return t;
}

// Note step 3: m of a group of n elements from its statistics.
template <bool kSawb>
HT_DEV float group_m(const Stats& st, int64_t n) {
  if (!kSawb || n == 0) return st.amax;
  const double dn = static_cast<double>(n);
  const double alpha =
      __dsub_rn(__dmul_rn(12.1, sqrt(__ddiv_rn(st.s2, dn))), __dmul_rn(12.2, __ddiv_rn(st.s1, dn)));
  const float m = __double2float_rn(alpha);
  return (isfinite(m) && m > 0.0f) ? m : st.amax;
}

HT_DEV float pow2f(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }

// The stored scale of a group with value m: s = m / qmax (0 when m == 0), or LUQ's α = m / 2^top.
HT_DEV float scale_of(const GradQuantArgs& a, float m) {
  if (a.kind == QuantKind::luq) return __fdiv_rn(m, pow2f(a.qmax));
  return m == 0.0f ? 0.0f : __fdiv_rn(m, static_cast<float>(a.qmax));
}

// What quantising with a group's m needs: m, the reciprocal r = qmax / m (uniform) and the scale.
struct Level {
  float m, r, s;
};
HT_DEV Level level_of(const GradQuantArgs& a, float m) {
  const float s = scale_of(a, m);
  const float r = (a.kind == QuantKind::uniform && m != 0.0f) ? __fdiv_rn(static_cast<float>(a.qmax), m) : 0.0f;
  return {m, r, s};
}

// Note step 4 for one element (m > 0): the level's magnitude q (an exact integer in f32, at most qmax) and, in
// v, the scaled input whose sign the level takes. h: the 16 noise bits.
HT_DEV float level_magnitude(float x, const Level& l, float qmaxf, bool stochastic, uint32_t h, float& v) {
  v = __fmul_rn(fminf(fmaxf(x, -l.m), l.m), l.r);
  const float a = fabsf(v);
  float q;
  if (!stochastic) {
    q = rintf(a);
  } else {
    const float f = floorf(a);
    const float frac = __fsub_rn(a, f);
    q = __fadd_rn(f, ht::grad::sr_uniform(h) < frac ? 1.0f : 0.0f);
  }
  q = fminf(q, qmaxf);
  if (!(q >= 0.0f)) q = 0.0f;
  return q;
}

// The int8 level or its e4m3 code.
HT_DEV uint8_t uniform_code(float x, const Level& l, float qmaxf, bool stochastic, bool fp8, uint32_t h) {
  float v;
  const float q = level_magnitude(x, l, qmaxf, stochastic, h, v);
  const bool neg = v < 0.0f;
  if (fp8) {  // e4m3 of the integer q <= 15: f32 exponent rebiased (127 -> 7), top 3 mantissa bits; +0 for 0
    if (q == 0.0f) return 0;
    return static_cast<uint8_t>(((__float_as_uint(q) >> 20) - (120u << 3)) | (neg ? 0x80u : 0u));
  }
  const uint32_t iq = __float_as_uint(__fadd_rn(q, 8388608.0f)) & 0xFFu;  // q + 2^23 is exact: low bits = q
  return static_cast<uint8_t>(neg ? 0u - iq : iq);
}

// uniform_code's level as a signed exact float (+0 for level 0: 0 − 0 is +0), for dequantised values.
HT_DEV float uniform_signed(float x, const Level& l, float qmaxf, bool stochastic, uint32_t h) {
  float v;
  const float q = level_magnitude(x, l, qmaxf, stochastic, h, v);
  return v < 0.0f ? __fsub_rn(0.0f, q) : q;
}

// Out = uint8_t: codes; float / bf16 / f16: dequantised values.
template <class Out>
inline constexpr bool kDequant = !std::is_same_v<Out, uint8_t>;

// A dequantised value d as stored: rounded to nearest even to Out; NaN (a NaN scale, or an infinite one
// times level 0) as the quiet NaN 0x7FC00000 (bf16 0x7FC0, f16 0x7E00), as on the CPU (the hardware's and
// the CPU's NaN bits would differ otherwise).
template <class Out>
HT_DEV Out stored_value(float d) {
  if (d != d) d = __uint_as_float(0x7FC00000u);
  if constexpr (std::is_same_v<Out, float>) return d;
  else return narrow_from_float<Out>(d);
}

// The product of a level and its group's scale as stored (Note step 4): one f32 product, then stored_value.
template <class Out>
HT_DEV Out dequant_value(float level, float s) {
  return stored_value<Out>(__fmul_rn(level, s));
}

// LUQ (quant.h): the e4m3 code of sign(x)·q, q = 0 or 2^k (k <= top); +0 for zero levels. alpha > 0.
HT_DEV uint8_t luq_code(float x, float alpha, int top, uint32_t word) {
  const float a = __fdiv_rn(fabsf(x), alpha);
  const float u = uniform_from_word(word);
  int k;  // level 2^k, -1 for 0
  if (a < 1.0f) {
    k = u < a ? 0 : -1;
  } else {
    const uint32_t bits = __float_as_uint(a);
    const int e = static_cast<int>((bits >> 23) & 0xFFu) - 127;
    if (e >= top) {
      k = top;
    } else {
      const float p = __fsub_rn(__uint_as_float((bits & 0x7FFFFFu) | 0x3F800000u), 1.0f);
      k = u < p ? e + 1 : e;
    }
  }
  if (k < 0) return 0;
  return static_cast<uint8_t>((x < 0.0f ? 0x80u : 0u) | (static_cast<unsigned>(k + 7) << 3));
}

// ht::grad::sr_block (Philox4x32-10 of philox.h, counter (blk, stream), key seed) in 32-bit operations:
// __umulhi and the low product instead of philox_round's 64-bit products and masks, which nvcc's front end
// leaves as 64-bit multiplies and xors. Same words (integer arithmetic; checked against philox4x32_10 on
// the host).
// The noise stream of a launch: a.stream plus, when a.stream_add is set (a recorded step graph, Note [Step
// graphs]), the step field read from device memory at run time.
HT_DEV uint64_t noise_stream(const GradQuantArgs& a) {
  return a.stream_add == nullptr ? a.stream : a.stream + static_cast<uint64_t>(__ldg(a.stream_add));
}

HT_DEV void sr_block32(uint64_t seed, uint64_t stream, uint64_t blk, uint32_t w[4]) {
  uint32_t c0 = static_cast<uint32_t>(blk), c1 = static_cast<uint32_t>(blk >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

// The noise words of one unit of n elements starting at flat index base (uniform: Note [SR noise layout],
// 16 bits per element, two Philox calls per 16-element unit; a block-mode unit of T <= 8 elements at a
// multiple of T lies inside one aligned run of 8, so one call). w8[0..3] serve elements base/8*8 ...
struct UnitNoise {
  uint32_t w[8];
};
HT_DEV void uniform_noise(const GradQuantArgs& a, int64_t base, int n, UnitNoise& nz) {
  const uint64_t blk = static_cast<uint64_t>(base) >> 3;
  sr_block32(a.seed, noise_stream(a), blk, nz.w);
  if (n > 8) sr_block32(a.seed, noise_stream(a), blk + 1, nz.w + 4);
}
// The 16 bits of element k (a compile-time index after unrolling) of the unit starting at base. Chunk mode
// (n == 16, base % 16 == 0): a constant index into the two blocks. Block mode (n <= 8): element base + k is
// element (base % 8) + k < 8 of the first block; the word is picked with selects so that the register array
// is never indexed dynamically (which would put it in local memory).
HT_DEV uint32_t unit_bits(const UnitNoise& nz, int64_t base, int n, int k) {
  if (n == kU) return ht::grad::sr_bits(nz.w + 4 * (k >> 3), k & 7);
  const int off = static_cast<int>(base & 7) + k;
  const uint32_t word = off < 4 ? (off < 2 ? nz.w[0] : nz.w[1]) : (off < 6 ? nz.w[2] : nz.w[3]);
  return (word >> (16 * (off & 1))) & 0xFFFFu;
}

// Quantises one unit (n elements starting at flat index base) of rotated values with the group's level
// parameters. nz: the unit's noise (uniform stochastic only). kLuq == (a.kind == luq): a template parameter
// so that each kernel holds only one quantiser's registers.
template <bool kLuq>
HT_DEV void quant_unit(const float v[kU], int64_t base, int n, const Level& l, const GradQuantArgs& a,
                       const UnitNoise& nz, uint8_t q[kU]) {
  if (kLuq) {
    uint32_t w[kU];
    if (n == kU) {  // base is a multiple of 16: four whole Philox blocks of philox_word
      const uint32_t key[2] = {static_cast<uint32_t>(a.seed), static_cast<uint32_t>(a.seed >> 32)};
      const uint64_t stream = noise_stream(a);
#pragma unroll
      for (int b = 0; b < kU / 4; ++b) {
        const uint64_t blk = (static_cast<uint64_t>(base) >> 2) + static_cast<uint64_t>(b);
        const uint32_t ctr[4] = {static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32),
                                 static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
        philox4x32_10(ctr, key, &w[4 * b]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kU; ++k)
        w[k] = k < n ? philox_word(a.seed, noise_stream(a), static_cast<uint64_t>(base + k)) : 0u;
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) q[k] = l.s == 0.0f ? uint8_t{0} : luq_code(v[k], l.s, a.qmax, w[k]);
    return;
  }
  const float qmaxf = static_cast<float>(a.qmax);
#pragma unroll
  for (int k = 0; k < kU; ++k)
    q[k] = l.m == 0.0f ? uint8_t{0}
                       : uniform_code(v[k], l, qmaxf, a.stochastic, a.fp8_values,
                                      a.stochastic && k < n ? unit_bits(nz, base, n, k) : 0u);
}

// Dequantised values of one uniform unit (quant_unit's levels times l.s, dequant_value).
template <class Out>
HT_DEV void dequant_unit(const float v[kU], int64_t base, int n, const Level& l, const GradQuantArgs& a,
                         const UnitNoise& nz, Out q[kU]) {
  const float qmaxf = static_cast<float>(a.qmax);
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const float level = l.m == 0.0f ? 0.0f
                                    : uniform_signed(v[k], l, qmaxf, a.stochastic,
                                                     a.stochastic && k < n ? unit_bits(nz, base, n, k) : 0u);
    q[k] = dequant_value<Out>(level, l.s);
  }
}

// Quantises one unit into q: codes (quant_unit) or dequantised values (dequant_unit).
template <bool kLuq, class Out>
HT_DEV void quant_unit_to(const float v[kU], int64_t base, int n, const Level& l, const GradQuantArgs& a,
                          const UnitNoise& nz, Out q[kU]) {
  if constexpr (kDequant<Out>) dequant_unit<Out>(v, base, n, l, a, nz, q);
  else quant_unit<kLuq>(v, base, n, l, a, nz, q);
}

// Stores one unit of n elements at element offset base: vec (n == 16, 16-byte aligned) as 16-byte words.
template <class Out>
HT_DEV void store_unit(uint8_t* values, int64_t base, int n, bool vec, const Out q[kU]) {
  if constexpr (kDequant<Out>) {
    Out* out = reinterpret_cast<Out*>(values);
    constexpr int V = 16 / static_cast<int>(sizeof(Out));
    if (vec) {
#pragma unroll
      for (int i = 0; i < kU / V; ++i) {
        Pack<Out, V> p;
#pragma unroll
        for (int j = 0; j < V; ++j) p.v[j] = q[V * i + j];
        *reinterpret_cast<Pack<Out, V>*>(out + base + V * i) = p;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kU; ++k)
        if (k < n) out[base + k] = q[k];
    }
    return;
  }
  uint8_t* out = values;
  if (vec) {
    uint32_t word[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      word[i] = static_cast<uint32_t>(q[4 * i]) | (static_cast<uint32_t>(q[4 * i + 1]) << 8) |
                (static_cast<uint32_t>(q[4 * i + 2]) << 16) | (static_cast<uint32_t>(q[4 * i + 3]) << 24);
    *reinterpret_cast<uint4*>(out + base) = make_uint4(word[0], word[1], word[2], word[3]);
  } else {
#pragma unroll
    for (int k = 0; k < kU; ++k)
      if (k < n) out[base + k] = q[k];
  }
}

HT_DEV bool wants_uniform_noise(const GradQuantArgs& a) { return a.kind == QuantKind::uniform && a.stochastic; }

// max |v[k]| over the unit's n elements (fmaxf: NaN never wins).
HT_DEV float unit_absmax(const float v[kU], int n) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < kU; ++k)
    if (k < n) m = fmaxf(m, fabsf(v[k]));
  return m;
}

// Folds each thread's m into *out: a warp maximum, then one atomicMax on the f32 bits per warp (non-negative
// floats order like their bit patterns). Called by every lane of the warp.
HT_DEV void fold_absmax(float* out, float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (threadIdx.x % 32 == 0 && m > 0.0f) atomicMax(reinterpret_cast<unsigned int*>(out), __float_as_uint(m));
}

// Kernel variants: kLuq selects the quantiser at compile time (LUQ never uses SAWB).

// Fused path: a team of g.team threads per group, g.teams groups per block. Each thread keeps up to
// kFusedUnits units (unit u of its group goes to thread u % team, slot u / team) in registers between the
// team's reduction and the quantisation, so x is read once. The loads of both units and their Philox noise
// are issued before the first conversion waits for memory. Out: what is stored (codes or dequantised values).
template <class T, bool kSawb, bool kLuq, class Out>
__global__ void __launch_bounds__(kFusedTeam) quant_fused_kernel(GradQuantArgs a, Geo g) {
  __shared__ Stats smem[kFusedTeam / 32];
  const T* x = static_cast<const T*>(a.x);
  const int team = g.team, t = static_cast<int>(threadIdx.x) % team, sub = static_cast<int>(threadIdx.x) / team;
  const bool noise = wants_uniform_noise(a);
  for (int64_t g0 = static_cast<int64_t>(blockIdx.x) * g.teams; g0 < g.groups;
       g0 += static_cast<int64_t>(gridDim.x) * g.teams) {
    const int64_t grp = g0 + sub;
    bool has[kFusedUnits];
    int64_t base[kFusedUnits];
#pragma unroll
    for (int r = 0; r < kFusedUnits; ++r) {
      const int64_t u = t + static_cast<int64_t>(r) * team;
      has[r] = grp < g.groups && u < g.units;
      base[r] = grp * a.group_len + u * g.unit;
    }
    float v[kFusedUnits][kU];
    UnitNoise nz[kFusedUnits];
    if (g.vec) {
      RawUnit<T> raw[kFusedUnits];
#pragma unroll
      for (int r = 0; r < kFusedUnits; ++r)
        if (has[r]) issue_unit(x, base[r], raw[r]);
#pragma unroll
      for (int r = 0; r < kFusedUnits; ++r)
        if (has[r] && noise) uniform_noise(a, base[r], g.unit, nz[r]);
#pragma unroll
      for (int r = 0; r < kFusedUnits; ++r)
        if (has[r]) convert_unit(raw[r], v[r]);
    } else {
#pragma unroll
      for (int r = 0; r < kFusedUnits; ++r)
        if (has[r]) {
          load_unit(x, base[r], g.unit, false, v[r]);
          if (noise) uniform_noise(a, base[r], g.unit, nz[r]);
        }
    }
    if (a.input_absmax) {  // max |x| before rotation (block-uniform branch)
      float raw = 0.0f;
#pragma unroll
      for (int r = 0; r < kFusedUnits; ++r)
        if (has[r]) raw = fmaxf(raw, unit_absmax(v[r], g.unit));
      fold_absmax(a.input_absmax, raw);
    }
    Stats st{0.0f, 0.0, 0.0};
#pragma unroll
    for (int r = 0; r < kFusedUnits; ++r)
      if (has[r]) {
        rotate_unit(v[r], a.hadamard);
        add_stats<kSawb>(st, v[r], g.unit);
      }
    st = team_reduce<kSawb>(st, smem, team);
    if (grp >= g.groups) continue;  // after the (block-wide) reduction
    const Level l = level_of(a, group_m<kSawb>(st, a.group_len));
    if (t == 0) a.scale[grp] = l.s;
#pragma unroll
    for (int r = 0; r < kFusedUnits; ++r)
      if (has[r]) {
        Out q[kU];
        quant_unit_to<kLuq>(v[r], base[r], g.unit, l, a, nz[r], q);
        store_unit(a.values, base[r], g.unit, g.vec, q);
      }
  }
}

// Item path of the fused quantiser (uniform kind, group_len % 8 == 0, x 16-byte and values 8-byte aligned,
// 16-byte for dequantised values; plan() picks it before the unit path above, which then serves LUQ,
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
constexpr int kItem = 8;                                 // elements per item
constexpr int kItemSlots = 2;                            // items per thread
constexpr int kItemTeam = 16384 / (kItem * kItemSlots);  // threads for the longest fused group
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

// The 8 codes of one item (elements base .. base + 7, base a multiple of 8) as two little-endian words.
template <bool kSR, bool kFp8>
HT_DEV uint2 quant_item_codes(const float v[kItem], int64_t base, const Level& l, const GradQuantArgs& a) {
  uint32_t c[kItem];
  if (kSR) {
    uint32_t w[4];
    sr_block32(a.seed, noise_stream(a), static_cast<uint64_t>(base) >> 3, w);
    const uint32_t cap = kMagicBits + static_cast<uint32_t>(a.qmax);
#pragma unroll
    for (int k = 0; k < kItem; ++k) c[k] = sr_code<kFp8>(v[k], l, cap, ht::grad::sr_bits(w, k));
  } else {
    const float qmaxf = static_cast<float>(a.qmax);
#pragma unroll
    for (int k = 0; k < kItem; ++k) c[k] = uniform_code(v[k], l, qmaxf, false, kFp8, 0u);
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
// whole warps), g.teams groups per block (up to kItemTeam threads), kItemSlots items per thread. Registers
// are capped at 48 (no spills with ptxas -v; SAWB's double sums need 64): 42 resident warps per SM, 7 blocks
// of the 192-thread row blocks of (12608, 3072) — 65% occupancy, against 116 registers and 19% for the
// unit kernel. __maxnreg__ rather than __launch_bounds__, which cannot ask for 48 with 1024-thread blocks.
template <class T, bool kSawb, bool kSR, class Out>
__global__ void __maxnreg__(kSawb ? 64 : 48) quant_items_kernel(GradQuantArgs a, Geo g) {
  __shared__ Stats smem[kItemTeam / 32];
  const T* x = static_cast<const T*>(a.x);
  const int team = g.team, t = static_cast<int>(threadIdx.x) % team, sub = static_cast<int>(threadIdx.x) / team;
  const float sign = (threadIdx.x & 1u) ? -1.0f : 1.0f;  // the h = 8 stage: odd lanes hold the b of (a, b)
  for (int64_t g0 = static_cast<int64_t>(blockIdx.x) * g.teams; g0 < g.groups;
       g0 += static_cast<int64_t>(gridDim.x) * g.teams) {
    const int64_t grp = g0 + sub;
    const int64_t first = grp * a.group_len;
    float v[kItemSlots][kItem];
    bool has[kItemSlots];
#pragma unroll
    for (int r = 0; r < kItemSlots; ++r) {
      const int64_t j = t + static_cast<int64_t>(r) * team;
      has[r] = grp < g.groups && j < g.units;
      if (has[r]) {
        load_item(x, first + j * kItem, v[r]);
      } else {
#pragma unroll
        for (int k = 0; k < kItem; ++k) v[r][k] = 0.0f;
      }
    }
    if (a.input_absmax) {  // max |x| before rotation (block-uniform branch)
      float raw = 0.0f;
#pragma unroll
      for (int r = 0; r < kItemSlots; ++r)
#pragma unroll
        for (int k = 0; k < kItem; ++k) raw = fmaxf(raw, fabsf(v[r][k]));
      fold_absmax(a.input_absmax, raw);
    }
    Stats st{0.0f, 0.0, 0.0};
#pragma unroll
    for (int r = 0; r < kItemSlots; ++r) {
      rotate_item(v[r], a.hadamard, sign);
      if (has[r]) {
        add_stats<kSawb, kItem>(st, v[r], kItem);
      }
    }
    st = team_reduce<kSawb>(st, smem, team);
    if (grp >= g.groups) continue;  // after the (block-wide) reduction
    const Level l = level_of(a, group_m<kSawb>(st, a.group_len));
    if (t == 0) a.scale[grp] = l.s;
#pragma unroll
    for (int r = 0; r < kItemSlots; ++r) {
      if (!has[r]) continue;
      const int64_t base = first + (t + static_cast<int64_t>(r) * team) * kItem;
      store_item<kSR, Out>(v[r], base, l, a);
    }
  }
}

// Workspace layout of the two-pass path: per (group, part) partial statistics, then m and r = qmax / m
// per group.
struct Workspace {
  double* s1;
  double* s2;
  float* amax;
  float* m;
  float* r;
};
Workspace workspace_of(void* base, const Geo& g) {
  const int64_t np = g.groups * g.parts;
  auto* d = static_cast<double*>(base);
  auto* f = reinterpret_cast<float*>(d + 2 * np);
  return {d, d + np, f, f + np, f + np + g.groups};
}

// Pass 1: block b reduces part b % parts of group b / parts (units part·blockDim + tid, stride parts·blockDim).
template <class T, bool kSawb>
__global__ void __launch_bounds__(kThreads) quant_partial_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  __shared__ Stats smem[32];
  const T* x = static_cast<const T*>(a.x);
  for (int64_t b = blockIdx.x; b < g.groups * g.parts; b += gridDim.x) {
    const int64_t grp = b / g.parts, part = b % g.parts;
    Stats st{0.0f, 0.0, 0.0};
    float raw = 0.0f;  // max |x| before rotation (input_absmax)
    for (int64_t u = part * blockDim.x + threadIdx.x; u < g.units; u += g.parts * blockDim.x) {
      float v[kU];
      load_unit(x, grp * a.group_len + u * g.unit, g.unit, g.vec, v);
      if (a.input_absmax) raw = fmaxf(raw, unit_absmax(v, g.unit));
      rotate_unit(v, a.hadamard);
      add_stats<kSawb>(st, v, g.unit);
    }
    if (a.input_absmax) fold_absmax(a.input_absmax, raw);
    st = block_reduce<kSawb>(st, smem);
    if (threadIdx.x == 0) {
      ws.amax[b] = st.amax;
      ws.s1[b] = st.s1;
      ws.s2[b] = st.s2;
    }
  }
}

// Pass 2: one block per group combines its parts in a fixed order, writes m, r and the scale.
template <bool kSawb>
__global__ void __launch_bounds__(kThreads) quant_finalize_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  __shared__ Stats smem[32];
  for (int64_t grp = blockIdx.x; grp < g.groups; grp += gridDim.x) {
    Stats st{0.0f, 0.0, 0.0};
    for (int64_t p = threadIdx.x; p < g.parts; p += blockDim.x) {
      const int64_t i = grp * g.parts + p;
      st = combine<kSawb>(st, Stats{ws.amax[i], ws.s1[i], ws.s2[i]});
    }
    st = block_reduce<kSawb>(st, smem);
    if (threadIdx.x == 0) {
      const Level l = level_of(a, group_m<kSawb>(st, a.group_len));
      ws.m[grp] = l.m;
      ws.r[grp] = l.r;
      a.scale[grp] = l.s;
    }
  }
}

// Pass 2 when m is given (known_m, one group): m, r and the scale from device memory, one thread.
__global__ void quant_known_kernel(GradQuantArgs a, Workspace ws) {
  const Level l = level_of(a, *a.known_m);
  ws.m[0] = l.m;
  ws.r[0] = l.r;
  a.scale[0] = l.s;
}

template <class T>
__global__ void __launch_bounds__(kThreads) absmax_kernel(float* out, const T* x, int64_t numel) {
  float m = 0.0f;
  for (int64_t i = thread_index(); i < numel; i += thread_count()) m = fmaxf(m, fabsf(static_cast<float>(x[i])));
  fold_absmax(out, m);
}

// Pass 3: every unit again (load, rotate), quantised with its group's m and r (and the scale that pass 2
// wrote, for LUQ and dequantised values).
template <class T, bool kLuq, class Out>
__global__ void __launch_bounds__(kThreads) quant_apply_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t total = g.groups * g.units;
  const bool noise = wants_uniform_noise(a);
  for (int64_t u = thread_index(); u < total; u += thread_count()) {
    const int64_t base = u * g.unit, grp = base / a.group_len;
    float v[kU];
    UnitNoise nz;
    if (g.vec) {
      RawUnit<T> raw;
      issue_unit(x, base, raw);
      if (noise) uniform_noise(a, base, g.unit, nz);
      convert_unit(raw, v);
    } else {
      load_unit(x, base, g.unit, false, v);
      if (noise) uniform_noise(a, base, g.unit, nz);
    }
    rotate_unit(v, a.hadamard);
    const float m = ws.m[grp];
    const Level l{m, ws.r[grp], kLuq ? scale_of(a, m) : (kDequant<Out> ? a.scale[grp] : 0.0f)};
    Out q[kU];
    quant_unit_to<kLuq>(v, base, g.unit, l, a, nz, q);
    store_unit(a.values, base, g.unit, g.vec, q);
  }
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
    if (a.input_absmax) fold_absmax(a.input_absmax, raw);
    st = block_reduce<kSawb>(st, smem);
    if (threadIdx.x == 0) {
      ws.amax[b] = st.amax;
      ws.s1[b] = st.s1;
      ws.s2[b] = st.s2;
    }
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
          dequant_item<kSR, Out>(v[r], j * kItem, Level{ws.m[grp], ws.r[grp], a.scale[grp]}, a);
        } else {
          const float m = ws.m[grp];
          const Level l{m, ws.r[grp], 0.0f};
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

template <class T>
HT_DEV void load8(const T* x, int64_t i, bool vec, float v[8]) {
  if (vec) {
    constexpr int W = 8 * static_cast<int>(sizeof(T)) / 16;
    uint4 raw[W];
    const uint4* p = reinterpret_cast<const uint4*>(x + i);
#pragma unroll
    for (int w = 0; w < W; ++w) raw[w] = __ldg(p + w);
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = static_cast<float>(e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = static_cast<float>(x[i + k]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) quant_apply_t_kernel(GradQuantArgs a, Workspace ws, bool vec) {
  __shared__ uint32_t tile_w[kTileC * kTileStride / 4];
  uint8_t* tile = reinterpret_cast<uint8_t*>(tile_w);
  const T* x = static_cast<const T*>(a.x);
  const int64_t C = a.cols, N = a.numel / a.cols;
  const int64_t tiles_c = (C + kTileC - 1) / kTileC, tiles = (N + kTileN - 1) / kTileN * tiles_c;
  const Level l{ws.m[0], ws.r[0], 0.0f};
  const float qmaxf = static_cast<float>(a.qmax);
  const bool noise = wants_uniform_noise(a);
  const bool words = N % 4 == 0 && reinterpret_cast<uintptr_t>(a.values) % 4 == 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t n0 = t / tiles_c * kTileN, c0 = t % tiles_c * kTileC;
    for (int item = threadIdx.x; item < kTileN * kTileC / 8; item += blockDim.x) {
      const int row = item / (kTileC / 8), cg = item % (kTileC / 8);
      const int64_t n = n0 + row, c = c0 + 8 * cg;
      uint8_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (n < N && c < C && l.m != 0.0f) {
        const int64_t i = n * C + c;  // a multiple of 8
        float v[8];
        load8(x, i, vec, v);
        if (noise) {  // sr_code: uniform_code's stochastic rounding in fewer instructions
          uint32_t w[4];
          sr_block32(a.seed, noise_stream(a), static_cast<uint64_t>(i) >> 3, w);
          const uint32_t cap = kMagicBits + static_cast<uint32_t>(a.qmax);
          if (a.fp8_values) {
#pragma unroll
            for (int k = 0; k < 8; ++k)
              q[k] = static_cast<uint8_t>(sr_code<true>(v[k], l, cap, ht::grad::sr_bits(w, k)));
          } else {
#pragma unroll
            for (int k = 0; k < 8; ++k)
              q[k] = static_cast<uint8_t>(sr_code<false>(v[k], l, cap, ht::grad::sr_bits(w, k)));
          }
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) q[k] = uniform_code(v[k], l, qmaxf, false, a.fp8_values, 0u);
        }
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

template <class T>
__global__ void __launch_bounds__(kThreads) hadamard_unit_kernel(float* out, const T* x, int64_t units, int unit,
                                                                 bool vec, int t) {
  for (int64_t u = thread_index(); u < units; u += thread_count()) {
    const int64_t base = u * unit;
    float v[kU];
    load_unit(x, base, unit, vec, v);
    rotate_unit(v, t);
    if (vec) {
      float4* o = reinterpret_cast<float4*>(out + base);
#pragma unroll
      for (int i = 0; i < kU / 4; ++i) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    } else {
#pragma unroll
      for (int k = 0; k < kU; ++k)
        if (k < unit) out[base + k] = v[k];
    }
  }
}

// One butterfly stage h (>= 16) in place over blocks aligned to multiples of 2h or more.
__global__ void __launch_bounds__(kThreads) hadamard_stage_kernel(float* out, int64_t numel, int64_t h) {
  for (int64_t p = thread_index(); p < numel / 2; p += thread_count()) {
    const int64_t j = (p / h) * 2 * h + p % h;
    const float a = out[j], b = out[j + h];
    out[j] = __fadd_rn(a, b);
    out[j + h] = __fsub_rn(a, b);
  }
}

__global__ void __launch_bounds__(kThreads) pack_int4_kernel(uint8_t* out, const int8_t* in, int64_t bytes) {
  for (int64_t k = thread_index(); k < bytes; k += thread_count())
    out[k] = static_cast<uint8_t>((static_cast<unsigned>(in[2 * k]) & 0xFu) |
                                  ((static_cast<unsigned>(in[2 * k + 1]) & 0xFu) << 4));
}

__global__ void __launch_bounds__(kThreads) unpack_int4_kernel(int8_t* out, const uint8_t* in, int64_t bytes) {
  for (int64_t k = thread_index(); k < bytes; k += thread_count()) {
    const uint8_t b = in[k];
    out[2 * k] = static_cast<int8_t>(static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4);
    out[2 * k + 1] = static_cast<int8_t>(static_cast<int8_t>(b) >> 4);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the item kernels can store to a.values: one item is 8 code bytes (one 8-byte word) or 16 / 32 bytes
// of dequantised values (16-byte words).
bool item_values_aligned(const GradQuantArgs& a) {
  return reinterpret_cast<uintptr_t>(a.values) % (a.store == QuantStore::codes ? 8 : 16) == 0;
}

static_assert(sizeof(GradQuantArgs) == 128, "GradQuantArgs grew: the kernels' parameter block changes (see store)");

Geo plan(const GradQuantArgs& a) {
  Geo g;
  // The item path (fused, see quant_items_kernel) when its alignment holds, for the groups that the unit
  // path below would fuse (at most 16384 elements, and enough groups or short ones).
  g.items = a.kind == QuantKind::uniform && a.group_len % kItem == 0 && a.group_len <= 16384 &&
            (a.numel / a.group_len >= 66 || a.group_len <= 2048) && aligned16(a.x) && item_values_aligned(a) &&
            !a.transposed && a.known_m == nullptr;
  if (g.items) {
    g.fused = true;
    g.unit = kItem;
    g.vec = true;
    g.groups = a.numel / a.group_len;
    g.units = a.group_len / kItem;
    const int64_t need = (g.units + kItemSlots - 1) / kItemSlots;  // threads for kItemSlots items each
    int team = a.hadamard > kItem ? 2 : 1;                          // T = 16 pairs neighbouring lanes
    while (team < need && team < 32) team *= 2;                     // a power of two inside one warp
    if (need > 32) team = static_cast<int>((need + 31) / 32 * 32);  // or whole warps
    g.team = team;
    g.teams = team >= kFusedBlock ? 1 : kFusedBlock / team;
    if (g.teams > g.groups) g.teams = static_cast<int>(g.groups < 1 ? 1 : g.groups);
    while (g.team * g.teams % 32 != 0) ++g.teams;  // whole warps per block (team < 32 divides 32)
    return g;
  }
  g.unit = a.group_len % kU == 0 ? kU : a.hadamard;
  g.vec = g.unit == kU && aligned16(a.x) && aligned16(a.values);
  g.groups = a.numel / a.group_len;
  g.units = a.group_len / g.unit;
  // Fused when a group fits the registers of one team and there are enough groups (or little work).
  g.fused = g.units <= static_cast<int64_t>(kFusedUnits) * kFusedTeam && (g.groups >= 66 || g.units <= 128) &&
            !a.transposed && a.known_m == nullptr;
  if (g.fused) {
    const int64_t need = (g.units + kFusedUnits - 1) / kFusedUnits;  // threads for kFusedUnits units each
    int team = 1;
    while (team < need && team < 32) team *= 2;                      // a power of two inside one warp
    if (need > 32) team = static_cast<int>((need + 31) / 32 * 32);   // or whole warps
    g.team = team;
    g.teams = team >= kFusedBlock ? 1 : kFusedBlock / team;
    if (g.teams > g.groups) g.teams = static_cast<int>(g.groups < 1 ? 1 : g.groups);
    while (g.team * g.teams % 32 != 0) ++g.teams;  // whole warps per block (team < 32 divides 32)
  } else {
    // Blocks per group of the partial kernel: the count whose groups · parts blocks fill whole waves of
    // resident blocks best (132 SMs × 6 blocks of 256 threads at <= 40 registers, 5 for SAWB), at most
    // 4 waves, at least one unit per thread. A last wave of a few blocks would leave the GPU mostly idle.
    const int64_t wave = 132 * (a.sawb ? 5 : 6);
    const int64_t most = (g.units + kThreads - 1) / kThreads;
    g.parts = 1;
    double best = 0.0;
    for (int64_t p = 1; p <= most && (p == 1 || p * g.groups <= 4 * wave); ++p) {
      const int64_t blocks = p * g.groups;
      const double fill = static_cast<double>(blocks) / static_cast<double>((blocks + wave - 1) / wave * wave);
      if (fill > best + 1e-9) {
        best = fill;
        g.parts = p;
      }
    }
  }
  return g;
}

// Calls f(Out{}) with the stored type of the uniform quantiser's values (Out of the kernels).
template <class F>
void visit_store(QuantStore store, F&& f) {
  switch (store) {
    case QuantStore::codes: return f(uint8_t{});
    case QuantStore::f32: return f(float{});
    case QuantStore::bf16: return f(bf16{});
    case QuantStore::f16: return f(f16{});
  }
}

template <class F>
void visit_quant_dtype(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(f16{});
    default: HT_UNSUPPORTED_DTYPE(kernel, dt);
  }
}

unsigned grid_cap(int64_t blocks) {
  constexpr int64_t kMax = 132 * 32;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMax ? kMax : blocks));
}

}  // namespace

std::size_t grad_quant_workspace_bytes(const GradQuantArgs& args) {
  if (args.numel == 0) return 0;
  const Geo g = plan(args);
  if (g.fused) return 0;
  const int64_t np = g.groups * g.parts;
  return static_cast<std::size_t>(np) * (2 * sizeof(double) + sizeof(float)) +
         static_cast<std::size_t>(g.groups) * 2 * sizeof(float);
}

void launch_grad_quant(const GradQuantArgs& a, cudaStream_t stream) {
  if (a.numel == 0) return;
  const bool luq = a.kind == QuantKind::luq;
  if (a.store != QuantStore::codes && (luq || a.transposed))  // quantize() rejects these: a hadatrain bug
    HT_UNSUPPORTED_DTYPE("grad_quant (dequantised values need the uniform kind and the natural layout)", a.dtype);
  const Geo g = plan(a);
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    if (g.items) {
      const int64_t blocks = (g.groups + g.teams - 1) / g.teams;
      const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : (int64_t{1} << 30));
      const int threads = g.team * g.teams;
      visit_store(a.store, [&](auto out) {
        using Out = decltype(out);
        if (a.sawb) {
          if (a.stochastic) quant_items_kernel<T, true, true, Out><<<grid, threads, 0, stream>>>(a, g);
          else quant_items_kernel<T, true, false, Out><<<grid, threads, 0, stream>>>(a, g);
        } else {
          if (a.stochastic) quant_items_kernel<T, false, true, Out><<<grid, threads, 0, stream>>>(a, g);
          else quant_items_kernel<T, false, false, Out><<<grid, threads, 0, stream>>>(a, g);
        }
      });
      HT_CHECK_LAUNCH("grad_quant_items");
      return;
    }
    if (g.fused) {
      const int64_t blocks = (g.groups + g.teams - 1) / g.teams;
      const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : (int64_t{1} << 30));
      const int threads = g.team * g.teams;
      if (luq) {
        quant_fused_kernel<T, false, true, uint8_t><<<grid, threads, 0, stream>>>(a, g);
      } else {
        visit_store(a.store, [&](auto out) {
          using Out = decltype(out);
          if (a.sawb) quant_fused_kernel<T, true, false, Out><<<grid, threads, 0, stream>>>(a, g);
          else quant_fused_kernel<T, false, false, Out><<<grid, threads, 0, stream>>>(a, g);
        });
      }
      HT_CHECK_LAUNCH("grad_quant_fused");
      return;
    }
    const Workspace ws = workspace_of(a.workspace, g);
    const bool item_x = a.group_len % kItem == 0 && aligned16(a.x);  // passes 1 and 3 on items
    if (a.known_m != nullptr) {  // one group with a given m: no statistics pass
      quant_known_kernel<<<1, 1, 0, stream>>>(a, ws);
      HT_CHECK_LAUNCH("grad_quant_known");
      if (a.input_absmax) {  // no pass reads x before the quantisation: a separate maximum
        absmax_kernel<T><<<cuda::grid_for(a.numel, kThreads), kThreads, 0, stream>>>(
            a.input_absmax, static_cast<const T*>(a.x), a.numel);
        HT_CHECK_LAUNCH("grad_quant_absmax");
      }
    } else if (a.sawb && !luq) {
      if (item_x) quant_partial_items_kernel<T, true><<<grid_cap(g.groups * g.parts), kThreads, 0, stream>>>(a, g, ws);
      else quant_partial_kernel<T, true><<<grid_cap(g.groups * g.parts), kThreads, 0, stream>>>(a, g, ws);
      HT_CHECK_LAUNCH("grad_quant_partial");
      quant_finalize_kernel<true><<<grid_cap(g.groups), kThreads, 0, stream>>>(a, g, ws);
    } else {
      if (item_x) quant_partial_items_kernel<T, false><<<grid_cap(g.groups * g.parts), kThreads, 0, stream>>>(a, g, ws);
      else quant_partial_kernel<T, false><<<grid_cap(g.groups * g.parts), kThreads, 0, stream>>>(a, g, ws);
      HT_CHECK_LAUNCH("grad_quant_partial");
      quant_finalize_kernel<false><<<grid_cap(g.groups), kThreads, 0, stream>>>(a, g, ws);
    }
    HT_CHECK_LAUNCH("grad_quant_finalize");
    if (a.transposed) {
      const int64_t tiles = (a.numel / a.cols + kTileN - 1) / kTileN * ((a.cols + kTileC - 1) / kTileC);
      quant_apply_t_kernel<T><<<grid_cap(tiles), kThreads, 0, stream>>>(a, ws, aligned16(a.x));
      HT_CHECK_LAUNCH("grad_quant_apply_transposed");
      return;
    }
    if (item_x && !luq && item_values_aligned(a)) {
      const unsigned grid = cuda::grid_for(a.numel / kItem, kThreads);
      visit_store(a.store, [&](auto out) {
        using Out = decltype(out);
        if (a.stochastic) quant_apply_items_kernel<T, true, Out><<<grid, kThreads, 0, stream>>>(a, ws);
        else quant_apply_items_kernel<T, false, Out><<<grid, kThreads, 0, stream>>>(a, ws);
      });
      HT_CHECK_LAUNCH("grad_quant_apply");
      return;
    }
    const unsigned grid = cuda::grid_for(g.groups * g.units, kThreads);
    if (luq) {
      quant_apply_kernel<T, true, uint8_t><<<grid, kThreads, 0, stream>>>(a, g, ws);
    } else {
      visit_store(a.store, [&](auto out) {
        using Out = decltype(out);
        quant_apply_kernel<T, false, Out><<<grid, kThreads, 0, stream>>>(a, g, ws);
      });
    }
    HT_CHECK_LAUNCH("grad_quant_apply");
  });
}

void launch_absmax(DType dtype, float* out, const void* x, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  visit_quant_dtype(dtype, "absmax", [&](auto tag) {
    using T = decltype(tag);
    absmax_kernel<T><<<cuda::grid_for(numel, kThreads), kThreads, 0, stream>>>(out, static_cast<const T*>(x), numel);
    HT_CHECK_LAUNCH("absmax");
  });
}

void launch_hadamard_blocks(DType dtype, float* out, const void* x, int64_t numel, int64_t block,
                            cudaStream_t stream) {
  if (numel == 0) return;
  const int unit = numel % kU == 0 ? kU : static_cast<int>(block);  // block <= 8 when numel % 16 != 0
  const bool vec = unit == kU && aligned16(x) && aligned16(out);
  const int t = static_cast<int>(block < kU ? block : kU);
  const int64_t units = numel / unit;
  visit_quant_dtype(dtype, "hadamard_blocks", [&](auto tag) {
    using T = decltype(tag);
    hadamard_unit_kernel<T><<<cuda::grid_for(units, kThreads), kThreads, 0, stream>>>(
        out, static_cast<const T*>(x), units, unit, vec, t);
    HT_CHECK_LAUNCH("hadamard_blocks");
  });
  for (int64_t h = kU; h < block; h *= 2) {
    hadamard_stage_kernel<<<cuda::grid_for(numel / 2, kThreads), kThreads, 0, stream>>>(out, numel, h);
    HT_CHECK_LAUNCH("hadamard_stage");
  }
}

void launch_pack_int4(uint8_t* out, const int8_t* in, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  pack_int4_kernel<<<cuda::grid_for(numel / 2, kThreads), kThreads, 0, stream>>>(out, in, numel / 2);
  HT_CHECK_LAUNCH("pack_int4");
}

void launch_unpack_int4(int8_t* out, const uint8_t* in, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  unpack_int4_kernel<<<cuda::grid_for(numel / 2, kThreads), kThreads, 0, stream>>>(out, in, numel / 2);
  HT_CHECK_LAUNCH("unpack_int4");
}

}  // namespace ht::kernels
