// Quantisation kernels of the gradient pipelines (see grad_quant.h and Note [Bit-identical quantisation] in
// include/hadatrain/grad/quant.h). Work is cut into register units of 16 elements: in "chunk mode" (the group
// length a multiple of 16) a unit is 16 consecutive elements, 16/T whole Hadamard blocks, moved with 16-byte
// loads and stores when the pointers allow; otherwise ("block mode") a unit is one Hadamard block of T
// elements (T <= 8 then), element by element. A unit never straddles a Hadamard block or a scale group.
// Per unit: load → f32 → butterflies h = 1, 2, 4, 8 (h < T) in registers → statistics or quantisation.
// fp32 arithmetic uses __fadd_rn / __fsub_rn / __fdiv_rn (no FMA contraction); SAWB sums use
// __dadd_rn / __dmul_rn in double. Block reductions combine threads in a fixed order.
#include <cuda_runtime.h>

#include <cstdint>

#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/scalar_types.h"
#include "kernels/grad_quant.h"
#include "kernels/launch.h"
#include "kernels/layout.h"

namespace ht::kernels {
namespace {

constexpr int kU = 16;              // register slots per unit
constexpr int kFusedUnits = 2;      // units per thread in the fused kernel
constexpr int kFusedThreads = 512;  // at most this many threads per group in the fused kernel
constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

// How a launch cuts its work (computed on the host from the arguments).
struct Geo {
  int unit = kU;      // elements per unit: 16 (chunk mode) or T (block mode)
  bool vec = false;   // 16-byte loads and stores
  int64_t groups = 0;
  int64_t units = 0;  // units per group
  bool fused = false;
  int64_t parts = 1;  // two-pass: blocks per group in the partial reduction
};

HT_DEV int64_t thread_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
HT_DEV int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Loads n (<= 16) elements from x + base into v[0..n) as f32 (exact for bf16 / f16); other slots 0.
template <class T>
HT_DEV void load_unit(const T* x, int64_t base, int n, bool vec, float v[kU]) {
  if (vec) {
    constexpr int W = kU * static_cast<int>(sizeof(T)) / 16;
    uint4 raw[W];
    const uint4* p = reinterpret_cast<const uint4*>(x + base);
#pragma unroll
    for (int w = 0; w < W; ++w) raw[w] = p[w];
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int k = 0; k < kU; ++k) v[k] = static_cast<float>(e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kU; ++k) v[k] = k < n ? static_cast<float>(x[base + k]) : 0.0f;
  }
}

// The butterfly stages h = 1, 2, 4, 8 with h < t, in this order (Note step 2).
HT_DEV void rotate_unit(float v[kU], int t) {
#pragma unroll
  for (int h = 1; h < kU; h *= 2) {
    if (h < t) {
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        if ((j / h) % 2 == 0) {
          const float a = v[j], b = v[j + h];
          v[j] = __fadd_rn(a, b);
          v[j + h] = __fsub_rn(a, b);
        }
      }
    }
  }
}

struct Stats {
  float amax;
  double s1, s2;
};

HT_DEV void add_stats(Stats& st, const float v[kU], int n, bool sawb) {
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    if (k < n) {
      st.amax = fmaxf(st.amax, fabsf(v[k]));
      if (sawb) {
        const double d = static_cast<double>(v[k]);
        st.s1 = __dadd_rn(st.s1, fabs(d));
        st.s2 = __dadd_rn(st.s2, __dmul_rn(d, d));
      }
    }
  }
}

HT_DEV Stats combine(Stats a, const Stats& b) {
  return {fmaxf(a.amax, b.amax), __dadd_rn(a.s1, b.s1), __dadd_rn(a.s2, b.s2)};
}

HT_DEV Stats warp_reduce(Stats s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Stats t{__shfl_xor_sync(kFull, s.amax, o), __shfl_xor_sync(kFull, s.s1, o), __shfl_xor_sync(kFull, s.s2, o)};
    s = combine(s, t);
  }
  return s;
}

// Every thread of the block (blockDim a multiple of 32) gets the block's combined statistics.
HT_DEV Stats block_reduce(Stats s, Stats* smem) {
  s = warp_reduce(s);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  Stats t = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : Stats{0.0f, 0.0, 0.0};
  t = warp_reduce(t);
  __syncthreads();  // smem may be reused
  return t;
}

// Note step 3: m of a group of n elements from its statistics.
HT_DEV float group_m(const Stats& st, int64_t n, bool sawb) {
  if (!sawb || n == 0) return st.amax;
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

// Note step 4 for one element (m > 0).
HT_DEV int uniform_level(float x, float m, float s, int qmax, bool stochastic, uint32_t word) {
  const float v = __fdiv_rn(fminf(fmaxf(x, -m), m), s);
  const float a = fabsf(v);
  float q;
  if (!stochastic) {
    q = rintf(a);
  } else {
    const float f = floorf(a);
    const float frac = __fsub_rn(a, f);
    q = __fadd_rn(f, uniform_from_word(word) < frac ? 1.0f : 0.0f);
  }
  q = fminf(q, static_cast<float>(qmax));
  if (!(q >= 0.0f)) q = 0.0f;
  const int iq = static_cast<int>(q);
  return v < 0.0f ? -iq : iq;
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

// Quantises one unit (n elements starting at flat index base) of rotated values with the group's m.
HT_DEV void quant_unit(const float v[kU], int64_t base, int n, float m, const GradQuantArgs& a, uint8_t q[kU]) {
  uint32_t w[kU];
  if (a.kind == QuantKind::luq || a.stochastic) {
    if (n == kU) {  // base is a multiple of 16: four whole Philox blocks
      const uint32_t key[2] = {static_cast<uint32_t>(a.seed), static_cast<uint32_t>(a.seed >> 32)};
#pragma unroll
      for (int b = 0; b < kU / 4; ++b) {
        const uint64_t blk = (static_cast<uint64_t>(base) >> 2) + static_cast<uint64_t>(b);
        const uint32_t ctr[4] = {static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32),
                                 static_cast<uint32_t>(a.stream), static_cast<uint32_t>(a.stream >> 32)};
        philox4x32_10(ctr, key, &w[4 * b]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kU; ++k)
        w[k] = k < n ? philox_word(a.seed, a.stream, static_cast<uint64_t>(base + k)) : 0u;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kU; ++k) w[k] = 0u;
  }
  const float s = scale_of(a, m);
  if (a.kind == QuantKind::luq) {
#pragma unroll
    for (int k = 0; k < kU; ++k) q[k] = s == 0.0f ? uint8_t{0} : luq_code(v[k], s, a.qmax, w[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kU; ++k)
      q[k] = m == 0.0f ? uint8_t{0}
                       : static_cast<uint8_t>(static_cast<int8_t>(uniform_level(v[k], m, s, a.qmax, a.stochastic, w[k])));
  }
}

HT_DEV void store_unit(uint8_t* out, int64_t base, int n, bool vec, const uint8_t q[kU]) {
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

// One block per group: every thread keeps up to kFusedUnits units in registers between the reduction and
// the quantisation, so x is read once.
template <class T>
__global__ void __launch_bounds__(kFusedThreads) quant_fused_kernel(GradQuantArgs a, Geo g) {
  __shared__ Stats smem[32];
  const T* x = static_cast<const T*>(a.x);
  for (int64_t grp = blockIdx.x; grp < g.groups; grp += gridDim.x) {
    float v[kFusedUnits][kU];
    Stats st{0.0f, 0.0, 0.0};
#pragma unroll
    for (int r = 0; r < kFusedUnits; ++r) {
      const int64_t u = threadIdx.x + static_cast<int64_t>(r) * blockDim.x;
      if (u < g.units) {
        load_unit(x, grp * a.group_len + u * g.unit, g.unit, g.vec, v[r]);
        rotate_unit(v[r], a.hadamard);
        add_stats(st, v[r], g.unit, a.sawb);
      }
    }
    st = block_reduce(st, smem);
    const float m = group_m(st, a.group_len, a.sawb);
    if (threadIdx.x == 0) a.scale[grp] = scale_of(a, m);
#pragma unroll
    for (int r = 0; r < kFusedUnits; ++r) {
      const int64_t u = threadIdx.x + static_cast<int64_t>(r) * blockDim.x;
      if (u < g.units) {
        const int64_t base = grp * a.group_len + u * g.unit;
        uint8_t q[kU];
        quant_unit(v[r], base, g.unit, m, a, q);
        store_unit(a.values, base, g.unit, g.vec, q);
      }
    }
  }
}

// Workspace layout of the two-pass path: per (group, part) partial statistics, then m per group.
struct Workspace {
  double* s1;
  double* s2;
  float* amax;
  float* m;
};
Workspace workspace_of(void* base, const Geo& g) {
  const int64_t np = g.groups * g.parts;
  auto* d = static_cast<double*>(base);
  auto* f = reinterpret_cast<float*>(d + 2 * np);
  return {d, d + np, f, f + np};
}

// Pass 1: block b reduces part b % parts of group b / parts (units part·blockDim + tid, stride parts·blockDim).
template <class T>
__global__ void __launch_bounds__(kThreads) quant_partial_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  __shared__ Stats smem[32];
  const T* x = static_cast<const T*>(a.x);
  for (int64_t b = blockIdx.x; b < g.groups * g.parts; b += gridDim.x) {
    const int64_t grp = b / g.parts, part = b % g.parts;
    Stats st{0.0f, 0.0, 0.0};
    for (int64_t u = part * blockDim.x + threadIdx.x; u < g.units; u += g.parts * blockDim.x) {
      float v[kU];
      load_unit(x, grp * a.group_len + u * g.unit, g.unit, g.vec, v);
      rotate_unit(v, a.hadamard);
      add_stats(st, v, g.unit, a.sawb);
    }
    st = block_reduce(st, smem);
    if (threadIdx.x == 0) {
      ws.amax[b] = st.amax;
      ws.s1[b] = st.s1;
      ws.s2[b] = st.s2;
    }
  }
}

// Pass 2: one block per group combines its parts in a fixed order, writes m and the scale.
__global__ void __launch_bounds__(kThreads) quant_finalize_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  __shared__ Stats smem[32];
  for (int64_t grp = blockIdx.x; grp < g.groups; grp += gridDim.x) {
    Stats st{0.0f, 0.0, 0.0};
    for (int64_t p = threadIdx.x; p < g.parts; p += blockDim.x) {
      const int64_t i = grp * g.parts + p;
      st = combine(st, Stats{ws.amax[i], ws.s1[i], ws.s2[i]});
    }
    st = block_reduce(st, smem);
    if (threadIdx.x == 0) {
      const float m = group_m(st, a.group_len, a.sawb);
      ws.m[grp] = m;
      a.scale[grp] = scale_of(a, m);
    }
  }
}

// Pass 3: every unit again (load, rotate), quantised with its group's m.
template <class T>
__global__ void __launch_bounds__(kThreads) quant_apply_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t total = g.groups * g.units;
  for (int64_t u = thread_index(); u < total; u += thread_count()) {
    const int64_t base = u * g.unit;
    float v[kU];
    load_unit(x, base, g.unit, g.vec, v);
    rotate_unit(v, a.hadamard);
    uint8_t q[kU];
    quant_unit(v, base, g.unit, ws.m[base / a.group_len], a, q);
    store_unit(a.values, base, g.unit, g.vec, q);
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

Geo plan(const GradQuantArgs& a) {
  Geo g;
  g.unit = a.group_len % kU == 0 ? kU : a.hadamard;
  g.vec = g.unit == kU && aligned16(a.x) && aligned16(a.values);
  g.groups = a.numel / a.group_len;
  g.units = a.group_len / g.unit;
  // Fused when a group fits the registers of one block and there are enough groups (or little work).
  g.fused = g.units <= static_cast<int64_t>(kFusedUnits) * kFusedThreads && (g.groups >= 66 || g.units <= 128);
  if (!g.fused) {
    const int64_t want = (132 * 8 + g.groups - 1) / g.groups;     // about 8 blocks per SM in total
    const int64_t most = (g.units + kThreads - 1) / kThreads;     // at least one unit per thread
    g.parts = want < 1 ? 1 : (want > most ? most : want);
    if (g.parts < 1) g.parts = 1;
  }
  return g;
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
         static_cast<std::size_t>(g.groups) * sizeof(float);
}

void launch_grad_quant(const GradQuantArgs& a, cudaStream_t stream) {
  if (a.numel == 0) return;
  const Geo g = plan(a);
  visit_quant_dtype(a.dtype, "grad_quant", [&](auto tag) {
    using T = decltype(tag);
    if (g.fused) {
      const int64_t per_thread = (g.units + kFusedUnits - 1) / kFusedUnits;
      const int threads = static_cast<int>((per_thread + 31) / 32 * 32);
      quant_fused_kernel<T><<<grid_cap(g.groups), threads, 0, stream>>>(a, g);
      HT_CHECK_LAUNCH("grad_quant_fused");
      return;
    }
    const Workspace ws = workspace_of(a.workspace, g);
    quant_partial_kernel<T><<<grid_cap(g.groups * g.parts), kThreads, 0, stream>>>(a, g, ws);
    HT_CHECK_LAUNCH("grad_quant_partial");
    quant_finalize_kernel<<<grid_cap(g.groups), kThreads, 0, stream>>>(a, g, ws);
    HT_CHECK_LAUNCH("grad_quant_finalize");
    quant_apply_kernel<T><<<cuda::grid_for(g.groups * g.units, kThreads), kThreads, 0, stream>>>(a, g, ws);
    HT_CHECK_LAUNCH("grad_quant_apply");
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
