// Device helpers shared by the quantisation kernels (grad_quant.cuh, grad_quant_launch.cuh; Note [Bit-identical
// quantisation] in include/hadatrain/grad/quant.h). Work is cut into register units of 16 elements: in "chunk
// mode" (the group length a multiple of 16) a unit is 16 consecutive elements, 16/T whole Hadamard blocks,
// moved with 16-byte loads and stores when the pointers allow; otherwise ("block mode") a unit is one Hadamard
// block of T elements (T <= 8 then), element by element. A unit never straddles a Hadamard block or a scale
// group. Per unit: load → f32 → butterflies h = 1, 2, 4, 8 (h < T) in registers → statistics or quantisation.
// Quantisation multiplies by the group's reciprocal r = qmax / m (one __fdiv_rn per group or unit, never one
// per element) and draws 16 noise bits per element, eight elements per Philox call (Note [SR noise layout]).
// fp32 arithmetic uses __fadd_rn / __fsub_rn / __fmul_rn / __fdiv_rn (no FMA contraction); SAWB sums use
// __dadd_rn / __dmul_rn in double. Block reductions combine threads in a fixed order.
// Every kernel that stores levels takes the stored type Out as a template parameter: uint8_t stores int8
// levels or e4m3 codes (GradQuantArgs::store codes, fp8_values), float / bf16 / f16 the dequantised values
// d = convert(float(level) · s) (Note [Bit-identical quantisation] step 4, dequant_value). The level is
// computed by the same operations either way (uniform_signed / sr_signed repeat uniform_code / sr_code);
// only the store differs.
// The helpers are HT_DEV (__forceinline__): each kernel compiles as when they shared its file.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "hadatrain/grad/sr_noise.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/scalar_types.h"
#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/grad_quant.cuh"
#include "cuda/kernels/grad_quant_launch.cuh"
#include "cuda/kernels/kernel_layout.h"

namespace ht::kernels::gq {

constexpr unsigned kFull = 0xFFFFFFFFu;

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
  const int per = team / 32, first = team == static_cast<int>(blockDim.x) ? 0 : warp / per * per;  // one team: 0
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
// m and r only (the scale left 0), for codes, which do not need it.
HT_DEV Level level_of_r(const GradQuantArgs& a, float m) {
  const float r = (a.kind == QuantKind::uniform && m != 0.0f) ? __fdiv_rn(static_cast<float>(a.qmax), m) : 0.0f;
  return {m, r, 0.0f};
}
HT_DEV Level level_of(const GradQuantArgs& a, float m) {
  Level l = level_of_r(a, m);
  l.s = scale_of(a, m);
  return l;
}

// Note [Known m in pass 3]
// With a known m (GradQuantArgs::known_m: one group, tensor-wide), no pass-2 kernel runs: thread 0 of every pass-3
// block computes the group's level from *known_m with level_of (the operations pass 2 would run) into shared
// memory, and the block reads it from there as it would read pass 2's workspace; block 0 also stores the scale.
// One launch less per quantisation whose maximum another kernel found (HLQ's 8-bit g̃ of every layer with the
// identity HLA plan or a projection). Through shared memory rather than a level per thread: the division's
// registers then stay outside the loops (the item kernels keep their register counts).
//
// Note [Pass 2 in pass 3]
// For one group (Workspace::fold_parts > 0: the tensor-wide scale of HLQ's W and of x̃), every pass-3 block folds
// the parts' statistics itself with group_level, the code of pass 2 (quant_finalize_kernel), in blocks of the same
// kThreads threads: the same combination order, so the same m, r and scale bit for bit (SAWB's double sums
// included); block 0 stores the scale (no later pass reads the workspace's m and r then). Each block reads the parts
// once (at most 132 · 8 of them, from L2), which costs less than a one-block launch between the passes (3.4 µs for
// W's 1056 parts on the H200, ncu).
struct Pass3Levels {
  const float* m;  // per group: m, r = qmax / m, and the scale
  const float* r;
  const float* s;
};

// The level of group grp from its `parts` partial statistics, combined in a fixed order; every thread of the
// block (kThreads threads, so that all callers combine alike) gets it.
template <bool kSawb>
HT_DEV Level group_level(const GradQuantArgs& a, const Workspace& ws, int64_t grp, int64_t parts, Stats* smem) {
  Stats st{0.0f, 0.0, 0.0};
  for (int64_t p = threadIdx.x; p < parts; p += blockDim.x) {
    const int64_t i = grp * parts + p;
    st = combine<kSawb>(st, Stats{ws.amax[i], ws.s1[i], ws.s2[i]});
  }
  st = block_reduce<kSawb>(st, smem);
  return level_of(a, group_m<kSawb>(st, a.group_len));
}

HT_DEV Pass3Levels pass3_levels(const GradQuantArgs& a, const Workspace& ws, Level* smem) {
  if (a.known_m == nullptr && ws.fold_parts == 0) return {ws.m, ws.r, a.scale};
  if (a.known_m == nullptr) {  // Note [Pass 2 in pass 3]
    __shared__ Stats red[32];
    const Level l = a.sawb && a.kind == QuantKind::uniform ? group_level<true>(a, ws, 0, ws.fold_parts, red)
                                                           : group_level<false>(a, ws, 0, ws.fold_parts, red);
    if (threadIdx.x == 0) {
      *smem = l;
      if (blockIdx.x == 0) a.scale[0] = l.s;
    }
  } else if (threadIdx.x == 0) {
    *smem = level_of(a, *a.known_m);
    if (blockIdx.x == 0) a.scale[0] = smem->s;
  }
  __syncthreads();  // the level is the same for the whole block
  return {&smem->m, &smem->r, &smem->s};
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

// The noise stream of a launch: a.stream plus, when a.stream_add is set (a recorded step graph, Note [Step
// graphs]), the step field read from device memory at run time.
HT_DEV uint64_t noise_stream(const GradQuantArgs& a) {
  return a.stream_add == nullptr ? a.stream : a.stream + static_cast<uint64_t>(__ldg(a.stream_add));
}

// ht::grad::sr_block (Philox4x32-10 of philox.h, counter (blk, stream), key seed) in 32-bit operations:
// __umulhi and the low product instead of philox_round's 64-bit products and masks, which nvcc's front end
// leaves as 64-bit multiplies and xors. Same words (integer arithmetic; checked against philox4x32_10 on
// the host).
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

HT_DEV bool wants_uniform_noise(const GradQuantArgs& a) { return a.kind == QuantKind::uniform && a.stochastic; }

// atomicMax of m (> 0) into *out on the f32 bits (non-negative floats order like their bit patterns), skipped when
// *out, read from the L2, already holds at least m: *out only grows, so a stale read can only cost an atomic that
// changes nothing, never lose a larger m. Most folds of a tensor then read instead of queueing at one address.
HT_DEV void fold_max_bits(float* out, float m) {
  if (m > 0.0f && m > __ldcg(out)) atomicMax(reinterpret_cast<unsigned int*>(out), __float_as_uint(m));
}

// Folds each thread's m into *out: a warp maximum, then fold_max_bits per warp. Called by every lane of the warp.
HT_DEV void fold_absmax(float* out, float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (threadIdx.x % 32 == 0) fold_max_bits(out, m);
}

// Folds each thread's m into *out at most once per block: warp maxima by shuffle, then the block's maximum in
// thread 0 through smem (one float per warp), then fold_max_bits. Called by every thread of the block (it
// synchronises). Atomics on one address are serialised in the L2, so a kernel with many short-lived blocks folds
// once per block rather than once per warp and group (the same maximum: max is exact in any order, NaN never wins).
HT_DEV void fold_absmax_block(float* out, float m, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) m = fmaxf(m, smem[w]);
    fold_max_bits(out, m);
  }
}

// The end of pass 1 for block b (every thread of the block): folds max |x| before rotation into
// a.input_absmax when asked, reduces the block's statistics and stores them as part b of the workspace.
template <bool kSawb>
HT_DEV void store_partial(const GradQuantArgs& a, const Workspace& ws, int64_t b, Stats st, float raw, Stats* smem) {
  if (a.input_absmax) fold_absmax(a.input_absmax, raw);
  st = block_reduce<kSawb>(st, smem);
  if (threadIdx.x == 0) {
    ws.amax[b] = st.amax;
    ws.s1[b] = st.s1;
    ws.s2[b] = st.s2;
  }
}

}  // namespace ht::kernels::gq
