// HALO's square row kernels (contract: cuda/kernels/halo_square.cuh). Bit-identical to the CPU reference
// (src/grad/halo_quant.cpp) and to the fast row kernels of halo_fast.cu: the stages h = 1, 2, ..., 2048 run in that
// order, each the same f32 __fadd_rn / __fsub_rn of the same pair, and the codes are code_of's.
//
// Note [HALO square rows]
// A row of 4096 = 64·64 values is rotated in two register phases with one round trip through shared memory between
// them. A CTA of 64 threads takes a row at a time (grid-stride over the rows, as many CTAs as fit on the device):
//  1. Thread u holds the 64 consecutive values 64u + j (j < 64), read from the row staged in shared memory, and runs
//     the stages h = 1 ... 32 in registers; it stores them as 16 float4 units, unit q of row u at u·16 + (q ^ (u & 7))
//     (the swizzle spreads a quarter-warp's eight 16-byte stores over all 32 banks). One barrier.
//  2. Thread j holds the 64 values 64u + j (u < 64), one per 64-value row of the buffer (32 lanes read 32 distinct
//     banks: the swizzle only permutes whole units within a row), and runs h = 64 ... 2048 as the stages 1 ... 32 of
//     its registers. Its value u is then the rotated value 64u + j: the absmax pass takes max |v| there; the quantise
//     and rotation passes write each result (a code, or the value times mult as f32 or bf16) into an output row in
//     shared memory, and after a barrier the CTA copies that row out with 16-byte stores, a warp's 32 lanes 512
//     consecutive bytes.
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

#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {

namespace halo_square {
namespace {

using namespace halo_detail;

constexpr int kN = 4096;  // values a row
constexpr int kV = 64;    // values a thread holds in each phase, and threads a CTA

constinit LaunchCounter g_launches;  // halo_square_launches()

enum class Mode { absmax, quantize, rotate };

struct Params {
  const void* x = nullptr;  // (R, 4096)
  int64_t R = 0;
  float* absmax = nullptr;  // absmax: the device word to raise
  uint8_t* codes = nullptr;  // quantize: codes (R, 4096), the absmax m given, the scale written by CTA 0
  const float* m = nullptr;
  float* scale = nullptr;
  void* out = nullptr;  // rotate: out (R, 4096), each value times mult
  float mult = 1.0f;
};

template <DType DT>
constexpr int kInBytes = DT == DType::f32 ? 4 : 2;
// 16-byte units of a thread's 64 input values
template <DType DT>
constexpr int kUnits = kV * kInBytes<DT> / 16;

// Shared memory: the row as f32 (16 KiB), the staged input row, the output row of the quantise or rotation pass.
template <DType DT, Mode M, DType OT>
constexpr size_t smem_bytes() {
  const size_t out = M == Mode::quantize ? kN : M == Mode::rotate ? size_t{kN} * (OT == DType::f32 ? 4 : 2) : 0;
  return size_t{kN} * 4 + size_t{kN} * kInBytes<DT> + out;
}

__device__ __forceinline__ void butterfly(float& a, float& b) {
  const float u = a, v = b;
  a = __fadd_rn(u, v);
  b = __fsub_rn(u, v);
}

// The stages 1, 2, ..., 32 of 64 registers: v[e] and v[e + h] for e without bit h.
__device__ __forceinline__ void stages(float (&v)[kV]) {
#pragma unroll
  for (int h = 1; h < kV; h <<= 1)
#pragma unroll
    for (int e = 0; e < kV; ++e)
      if ((e & h) == 0) butterfly(v[e], v[e + h]);
}

// Row `row` of x into the staging area with cp.async: 16-byte unit c of the row (c = thread + 64·k) belongs to
// phase 1's thread u = c / U as its unit q = c % U, kept at u·16U + 16·(q ^ (u & 7)) bytes (Note [HALO square rows]).
template <DType DT>
__device__ __forceinline__ void stage_row(char* stage, const void* x, int64_t row) {
  constexpr int U = kUnits<DT>;
  const char* src = static_cast<const char*>(x) + row * (int64_t{kN} * kInBytes<DT>);
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const int c = static_cast<int>(threadIdx.x) + kV * k, u = c / U, q = c % U;
    copy16_async(stage + u * 16 * U + 16 * (q ^ (u & 7)), src + 16 * int64_t{c});
  }
}

// OT: the rotation pass's output dtype (f32 or bf16; unused by the other passes). I8: the quantise pass's carrier.
template <DType DT, Mode M, bool I8, DType OT>
__global__ void __launch_bounds__(kV) square_kernel(Params p) {
  extern __shared__ float4 square_smem[];
  float* const buf = reinterpret_cast<float*>(square_smem);
  char* const stage = reinterpret_cast<char*>(buf + kN);
  char* const outa = stage + kN * kInBytes<DT>;
  constexpr int U = kUnits<DT>, VL = Vec16<DT>::V;
  const int t = static_cast<int>(threadIdx.x), sx = t & 7;
  float m = 0.0f, r = 0.0f, mx = 0.0f;
  if constexpr (M == Mode::quantize) {
    m = *p.m;
    r = reciprocal_step(m, I8);
    if (blockIdx.x == 0 && t == 0) *p.scale = scale_of(m, I8);
  }
  // Note [HALO row order] (halo_fast.cu): the absmax pass takes the rows from the last to the first
  constexpr bool kReverse = M == Mode::absmax;
  const auto row_at = [&](int64_t i) { return kReverse ? p.R - 1 - i : i; };
  const char* const my_stage = stage + t * 16 * U;
  int off[8];  // phase 2: word of value 64u + t within row u of the buffer, for u & 7 = c
#pragma unroll
  for (int c = 0; c < 8; ++c) off[c] = 4 * ((t >> 2) ^ c) + (t & 3);
  if (blockIdx.x < p.R) stage_row<DT>(stage, p.x, row_at(blockIdx.x));
  for (int64_t i = blockIdx.x; i < p.R; i += gridDim.x) {
    const int64_t row = row_at(i);
    copy_async_wait_all();
    __syncthreads();  // the staged row is complete; the previous row's phase 2 is done with buf
    float v[kV];
    // 1: values 64t ... 64t + 63, the stages h = 1 ... 32
#pragma unroll
    for (int q = 0; q < U; ++q)
      Vec16<DT>::unpack(*reinterpret_cast<const uint4*>(my_stage + 16 * (q ^ sx)), v + VL * q);
    stages(v);
#pragma unroll
    for (int q = 0; q < kV / 4; ++q)
      reinterpret_cast<float4*>(buf)[t * (kV / 4) + (q ^ sx)] =
          make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    __syncthreads();  // buf holds the row; every thread has read its staged values
    if (i + gridDim.x < p.R) stage_row<DT>(stage, p.x, row_at(i + gridDim.x));
    // 2: values 64u + t, the stages h = 64 ... 2048
#pragma unroll
    for (int u = 0; u < kV; ++u) v[u] = buf[kV * u + off[u & 7]];
    stages(v);
    if constexpr (M == Mode::absmax) {
#pragma unroll
      for (int u = 0; u < kV; ++u) mx = fmaxf(mx, fabsf(v[u]));
    } else {
      if constexpr (M == Mode::quantize) {
        uint8_t* const oc = reinterpret_cast<uint8_t*>(outa) + t;
        if (m == 0.0f) {
#pragma unroll
          for (int u = 0; u < kV; ++u) oc[kV * u] = 0;
        } else if constexpr (I8) {
#pragma unroll
          for (int u = 0; u < kV; ++u) {
            const float c = fminf(fmaxf(__fmul_rn(v[u], r), -127.0f), 127.0f);
            oc[kV * u] = static_cast<uint8_t>(static_cast<int8_t>(rintf(c)));
          }
        } else {
#pragma unroll
          for (int u = 0; u < kV; u += 2) {
            const float t0 = __fmul_rn(v[u], r), t1 = __fmul_rn(v[u + 1], r);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
            unsigned short pair;  // t0's code in the low byte
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(t1), "f"(t0));
            oc[kV * u] = static_cast<uint8_t>(pair & 0xffU);
            oc[kV * (u + 1)] = static_cast<uint8_t>(pair >> 8);
#else
            oc[kV * u] = e4m3_code(t0);
            oc[kV * (u + 1)] = e4m3_code(t1);
#endif
          }
        }
      } else if constexpr (OT == DType::f32) {
        float* const of = reinterpret_cast<float*>(outa) + t;
#pragma unroll
        for (int u = 0; u < kV; ++u) of[kV * u] = __fmul_rn(v[u], p.mult);
      } else {
        uint16_t* const ob = reinterpret_cast<uint16_t*>(outa) + t;
#pragma unroll
        for (int u = 0; u < kV; ++u) ob[kV * u] = detail::float_to_bf16_bits(__fmul_rn(v[u], p.mult));
      }
      __syncthreads();  // the output row is complete
      constexpr int kOutBytes = M == Mode::quantize ? 1 : (OT == DType::f32 ? 4 : 2);
      constexpr int kOutUnits = kN * kOutBytes / 16;
      uint4* const dst = reinterpret_cast<uint4*>(
          (M == Mode::quantize ? static_cast<char*>(static_cast<void*>(p.codes)) : static_cast<char*>(p.out)) +
          row * (int64_t{kN} * kOutBytes));
#pragma unroll
      for (int k = 0; k < kOutUnits / kV; ++k) dst[t + kV * k] = reinterpret_cast<const uint4*>(outa)[t + kV * k];
    }
  }
  if constexpr (M == Mode::absmax) block_max_into(p.absmax, mx);
}

template <DType DT, Mode M, bool I8, DType OT>
void launch(const Params& p, cudaStream_t stream) {
  constexpr auto kernel = &square_kernel<DT, M, I8, OT>;
  constexpr size_t smem = smem_bytes<DT, M, OT>();
  opt_in_shared<kernel>(smem, smem);
  // persistent: as many CTAs as fit on the device (each holds a staged row in flight)
  static const int64_t resident = cuda::resident_blocks(reinterpret_cast<const void*>(kernel), kV, smem);
  const int64_t cap = resident > 0 ? resident : kMaxRowBlocks;
  const auto grid = static_cast<unsigned>(p.R < 1 ? 1 : (p.R < cap ? p.R : cap));
  kernel<<<grid, kV, smem, stream>>>(p);
  g_launches.add();
}

template <Mode M, bool I8, DType OT>
void by_input(DType in, const Params& p, cudaStream_t stream) {
  switch (in) {
    case DType::f32: return launch<DType::f32, M, I8, OT>(p, stream);
    case DType::bf16: return launch<DType::bf16, M, I8, OT>(p, stream);
    case DType::f16: return launch<DType::f16, M, I8, OT>(p, stream);
    default: HT_UNSUPPORTED_DTYPE("halo square rows", in);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool applies(const HaloRowsArgs& a) {
  return a.n == kN && a.C == kN && a.k == 1 && aligned16(a.x) &&
         (a.in_dtype == DType::f32 || a.in_dtype == DType::bf16 || a.in_dtype == DType::f16);
}

void absmax(const HaloRowsArgs& a, float* absmax, cudaStream_t stream) {
  Params p;
  p.x = a.x;
  p.R = a.R;
  p.absmax = absmax;
  by_input<Mode::absmax, false, DType::f32>(a.in_dtype, p, stream);
  HT_CHECK_LAUNCH("halo_absmax_square");
}

bool quantize_applies(const HaloRowsArgs& a, const void* codes) { return applies(a) && aligned16(codes); }

void quantize(const HaloRowsArgs& a, uint8_t* codes, bool int8, const float* absmax, float* scale,
              cudaStream_t stream) {
  Params p;
  p.x = a.x;
  p.R = a.R;
  p.codes = codes;
  p.m = absmax;
  p.scale = scale;
  if (int8) by_input<Mode::quantize, true, DType::f32>(a.in_dtype, p, stream);
  else by_input<Mode::quantize, false, DType::f32>(a.in_dtype, p, stream);
  HT_CHECK_LAUNCH("halo_quantize_square");
}

bool rotate_applies(const HaloRowsArgs& a, const void* out, DType out_dtype, int64_t cols) {
  return applies(a) && cols == kN && aligned16(out) && (out_dtype == DType::f32 || out_dtype == DType::bf16);
}

void rotate(const HaloRowsArgs& a, void* out, DType out_dtype, float mult, cudaStream_t stream) {
  Params p;
  p.x = a.x;
  p.R = a.R;
  p.out = out;
  p.mult = mult;
  if (out_dtype == DType::f32) by_input<Mode::rotate, false, DType::f32>(a.in_dtype, p, stream);
  else by_input<Mode::rotate, false, DType::bf16>(a.in_dtype, p, stream);
  HT_CHECK_LAUNCH("halo_rotate_square");
}

}  // namespace halo_square

int64_t halo_square_launches() { return halo_square::g_launches.get(); }

}  // namespace ht::kernels
