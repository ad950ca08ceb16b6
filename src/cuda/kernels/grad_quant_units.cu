// The unit kernels of the quantiser (units of 16 elements or one Hadamard block, grad_quant_common.cuh): the
// fused team kernel, which serves LUQ and the uniform cases the item kernels (grad_quant_items.cu) cannot take
// (unaligned pointers, group lengths that are not a multiple of 8), and passes 1 and 3 of the two-pass path on
// units. LUQ draws 32 noise bits per element (philox_word), the uniform quantiser 16 (Note [SR noise layout]).
#include "cuda/kernels/grad_quant_common.cuh"

namespace ht::kernels::gq {
namespace {

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

// max |v[k]| over the unit's n elements (fmaxf: NaN never wins).
HT_DEV float unit_absmax(const float v[kU], int n) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < kU; ++k)
    if (k < n) m = fmaxf(m, fabsf(v[k]));
  return m;
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
    store_partial<kSawb>(a, ws, b, st, raw, smem);
  }
}

// Pass 3: every unit again (load, rotate), quantised with its group's m and r (and the scale that pass 2
// wrote, for LUQ and dequantised values), or with the level of a known m (Note [Known m in pass 3]).
template <class T, bool kLuq, class Out>
__global__ void __launch_bounds__(kThreads) quant_apply_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t total = g.groups * g.units;
  const bool noise = wants_uniform_noise(a);
  __shared__ Level known;
  const Pass3Levels lv = pass3_levels(a, ws, &known);
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
    const float m = lv.m[grp];
    const Level l{m, lv.r[grp], kLuq ? scale_of(a, m) : (kDequant<Out> ? lv.s[grp] : 0.0f)};
    Out q[kU];
    quant_unit_to<kLuq>(v, base, g.unit, l, a, nz, q);
    store_unit(a.values, base, g.unit, g.vec, q);
  }
}

}  // namespace

void launch_fused_units(const GradQuantArgs& a, const Geo& g, cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = fused_grid(g);
    const int threads = g.team * g.teams;
    if (a.kind == QuantKind::luq) {
      quant_fused_kernel<T, false, true, uint8_t><<<grid, threads, 0, stream>>>(a, g);
    } else {
      visit_store(a.store, [&](auto out) {
        using Out = decltype(out);
        if (a.sawb) quant_fused_kernel<T, true, false, Out><<<grid, threads, 0, stream>>>(a, g);
        else quant_fused_kernel<T, false, false, Out><<<grid, threads, 0, stream>>>(a, g);
      });
    }
    HT_CHECK_LAUNCH("grad_quant_fused");
  });
}

void launch_partial_units(const GradQuantArgs& a, const Geo& g, const Workspace& ws, cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = grid_cap(g.groups * g.parts);
    if (uses_sawb(a)) quant_partial_kernel<T, true><<<grid, kThreads, 0, stream>>>(a, g, ws);
    else quant_partial_kernel<T, false><<<grid, kThreads, 0, stream>>>(a, g, ws);
    HT_CHECK_LAUNCH("grad_quant_partial");
  });
}

void launch_apply_units(const GradQuantArgs& a, const Geo& g, const Workspace& ws, cudaStream_t stream) {
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = cuda::grid_for(g.groups * g.units, kThreads);
    if (a.kind == QuantKind::luq) {
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

}  // namespace ht::kernels::gq
