// Fused attention for bf16 / f16, head dim 64 or 128 (see flash_attention.cuh), FlashAttention-2 structure:
//
// Forward: one CTA of 4 warps per (b, query head, 128-query block), each warp owning 32 query rows (two
// m-tiles, so every K/V fragment loaded from shared memory feeds two mma). K/V tiles of 128 keys (64 for
// D = 128) stream through shared memory (cp.async, two stages, one barrier per tile); S = Q Kᵀ and O += P V
// run on mma.sync m16n8k16 (fp32 accumulate) with ldmatrix fragment loads; the softmax is online in fp32
// registers in the exp2 domain; only the tiles crossing S or the causal diagonal run mask code, per warp.
// Causal grids take the heaviest query blocks of all heads first (Note [Forward kernel]).
//
// Backward: a preprocess kernel dsum[t] = rowsum(dO ∘ O)[t] (which also zeroes dq_acc); then one CTA of
// 8 warps per (b, kv head, 128-key block), each warp owning 16 keys. It loops over the query heads of its kv
// group and over the query blocks that see its keys, recomputes Sᵀ = K Qᵀ and Pᵀ = exp(Sᵀ - lse), dPᵀ = V dOᵀ
// and dSᵀ = Pᵀ ∘ (dPᵀ - dsum), and accumulates dV += Pᵀ dO and dK += dSᵀ Q in registers; dQ += dS K is
// computed from dSᵀ staged in shared memory and added into an fp32 buffer with atomics (so dq is not
// bitwise deterministic; dk and dv are). A last kernel scales dQ and converts it to the input dtype.
// The query rows per iteration depend on the head dim (Note [Backward variants], Note [Lean backward]).
// At D 128 the split-tile kernel runs instead (Note [Split backward]: 128 keys x 64 queries per iteration, a
// different warp tiling for each product group, Pᵀ and dSᵀ through shared memory; Note [Backward variants]).
//
// Operands are strided (B, H, T, D) views (FlashParams' strides; D contiguous, rows 16-byte aligned), so q,
// k, v can be slices of one packed qkv projection and dq, dk, dv slots of one packed gradient; lse, dsum and
// dq_acc are contiguous workspaces. The backward's first kernel computes dsum and zeroes dq_acc; the last
// scales dq_acc into the strided dq.
//
// Files: flash_attention_fwd.cu (the forward), flash_attention_bwd_lean.cu and flash_attention_bwd_split.cu
// (the two backward main kernels), flash_attention_common.cuh (device helpers: element types, cp.async,
// ldmatrix, fragment layouts, shared-memory padding), flash_attention_launch.cuh (FlashParams, the families'
// launch functions); this file: the backward's dsum and dQ conversion kernels, the choice of the backward
// kernel by head dim (Note [Backward variants]) and the public launchers.
//
// Note [Ragged tiles]
// 16-row slices past T or S (zero in shared memory, P = dS = 0 there) skip their products, and warps whose
// rows all lie past the end skip their work: the results are those of computing them (the products would
// add exact zeros or be masked to -inf). This matters for short odd lengths (a ViT's N = 65 or 197), where
// much of a 64- or 128-row block is padding. Every such condition is warp-uniform. The backward's per-element
// mask is evaluated only in blocks that cross S or the causal diagonal.
#include <atomic>
#include <cstdint>

#include "cuda/kernels/flash_attention.cuh"
#include "cuda/kernels/flash_attention_common.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels::fa {
namespace {

// The 8 16-bit values of a 16-byte chunk as floats.
template <class E>
__device__ __forceinline__ void unpack8(float (&f)[8], const uint4& x) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = E::to_float(static_cast<uint16_t>(w[i] & 0xffffu));
    f[2 * i + 1] = E::to_float(static_cast<uint16_t>(w[i] >> 16));
  }
}

// Flat query row (b, h, t) of the contiguous (B, Hq, T) workspaces -> (b, h, t).
__device__ __forceinline__ void split_row(int64_t row, int T, int Hq, int& b, int& h, int& t) {
  t = static_cast<int>(row % T);
  const int64_t bh = row / T;
  b = static_cast<int>(bh / Hq);
  h = static_cast<int>(bh % Hq);
}

// Backward preprocessing: dsum[row] = sum_e dout[row, e] * out[row, e] (fp32) and dq_acc[row, :] = 0.
// D / 8 consecutive threads own a row, one 16-byte chunk each; the block size is a multiple of 32.
template <class E, int D>
__global__ void flash_bwd_prep_kernel(float* __restrict__ dsum, float* __restrict__ dq_acc,
                                      const uint16_t* __restrict__ out, const uint16_t* __restrict__ dout,
                                      FlashParams p, int64_t rows) {
  constexpr int kTpr = D / 8;  // threads per row (8 or 16: a power of two dividing 32)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = i / kTpr;
  const int c = static_cast<int>(i % kTpr);
  float acc = 0.f;  // rows past the end take part in the shuffles with 0
  if (row < rows) {
    int b, h, t;
    split_row(row, p.T, p.Hq, b, h, t);
    float o[8], d[8];
    unpack8<E>(o, *reinterpret_cast<const uint4*>(head_ptr(out, p.o, b, h) + static_cast<int64_t>(t) * p.o.t + c * 8));
    unpack8<E>(d, *reinterpret_cast<const uint4*>(head_ptr(dout, p.dout, b, h) + static_cast<int64_t>(t) * p.dout.t +
                                                  c * 8));
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += o[e] * d[e];
    float4* z = reinterpret_cast<float4*>(dq_acc + row * D + c * 8);
    z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int off = kTpr / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < rows && c == 0) dsum[row] = acc;
}
// dq[b, h, t, :] = scale * dq_acc[row, :] in the input dtype (dq strided, dq_acc contiguous); a thread per
// 16-byte chunk of dq.
template <class E, int D>
__global__ void flash_dq_convert_kernel(uint16_t* __restrict__ dq, const float* __restrict__ acc, FlashParams p,
                                        int64_t rows) {
  constexpr int kTpr = D / 8;
  const int64_t n = rows * kTpr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / kTpr;
    const int c = static_cast<int>(i % kTpr);
    int b, h, t;
    split_row(row, p.T, p.Hq, b, h, t);
    const float4* src = reinterpret_cast<const float4*>(acc + row * D + c * 8);
    const float4 x0 = src[0], x1 = src[1];
    const float sc = p.scale;
    const uint4 y = make_uint4(E::pack(x0.x * sc, x0.y * sc), E::pack(x0.z * sc, x0.w * sc),
                               E::pack(x1.x * sc, x1.y * sc), E::pack(x1.z * sc, x1.w * sc));
    *reinterpret_cast<uint4*>(head_ptr(dq, p.dq, b, h) + static_cast<int64_t>(t) * p.dq.t + c * 8) = y;
  }
}

}  // namespace
}  // namespace ht::kernels::fa

namespace ht::kernels {
namespace {

using fa::FlashParams;
using fa::OperandStrides;

std::atomic<int64_t> g_forward_calls{0}, g_backward_calls{0};

// Note [Backward variants]
// One backward main kernel per head dim, the faster of two on the H200 (B 4, H 16, causal bf16, T 1024..4096,
// forward + backward timed against PyTorch's SDPA in the same call): D 64 runs the lean kernel (Note [Lean
// backward]: 8 warps of 16 keys, each warp owning all columns of its keys), level with the split kernel there
// (within 1.3 %); D 128 runs the split-tile kernel (Note [Split backward]: 128 keys x 64 queries per iteration,
// a warp tiling per product group), 13-16 % faster than the lean kernel there. The lean kernel is compiled for
// D 64 only and the split kernel for D 128 only. Both compute the same gradients within rounding (dq's atomic
// order aside; dk and dv are deterministic).

FlashParams make_params(const AttnShape& s) {
  FlashParams p{};
  p.B = static_cast<int>(s.B);
  p.Hq = static_cast<int>(s.Hq);
  p.Hkv = static_cast<int>(s.Hkv);
  p.T = static_cast<int>(s.T);
  p.S = static_cast<int>(s.S);
  p.scale = static_cast<float>(s.scale);
  p.scale_log2 = static_cast<float>(s.scale * 1.4426950408889634);
  p.causal = s.causal;
  return p;
}

OperandStrides dev_strides(const AttnStrides& st) { return {st.b, st.h, static_cast<int>(st.t)}; }

}  // namespace

bool flash_attention_supported(DType dt, const AttnShape& s) {
  // the forward's grid.y holds the query blocks of 128 rows (FwdDefault's kBr), at most 65535
  constexpr int64_t kMaxGridY = 65535, kMaxLen = int64_t{1} << 24, kMaxT = kMaxGridY * 128;
  return (dt == DType::bf16 || dt == DType::f16) && s.D == s.Dv && (s.D == 64 || s.D == 128) && s.B > 0 &&
         s.Hkv > 0 && s.Hq % s.Hkv == 0 && s.T > 0 && s.S > 0 && s.T <= kMaxT && s.S < kMaxLen &&
         s.B * s.Hq <= kMaxGridY && s.B * s.Hkv <= kMaxGridY;
}

bool flash_layout_ok(const void* data, const AttnStrides& st) {
  constexpr int64_t kVec = 8;  // 16 bytes of 16-bit elements
  constexpr int64_t kMaxT = int64_t{1} << 23;  // load_tile's offsets (row < 128) times it fit in 32 bits
  return reinterpret_cast<std::uintptr_t>(data) % 16 == 0 && st.b % kVec == 0 && st.h % kVec == 0 &&
         st.t % kVec == 0 && st.t > -kMaxT && st.t < kMaxT;
}

FlashBackwardKernel flash_backward_kernel_for(int64_t head_dim) {
  return head_dim >= 128 ? FlashBackwardKernel::split : FlashBackwardKernel::lean;  // Note [Backward variants]
}

FlashAttentionCounts flash_attention_counts() { return {g_forward_calls.load(), g_backward_calls.load()}; }

// The glue (cuda/glue/flash_attention_glue.cpp) checks every operand with flash_layout_ok before launching.
void launch_flash_attention_forward(DType dt, const FlashForwardArgs& a, const AttnShape& s, cudaStream_t stream) {
  FlashParams p = make_params(s);
  p.q = dev_strides(a.q.st);
  p.k = dev_strides(a.k.st);
  p.v = dev_strides(a.v.st);
  p.o = dev_strides(a.out.st);
  fa::launch_forward(dt, s.D, a, p, stream);  // Note [Forward kernel]
  HT_CHECK_LAUNCH("flash_attention_forward");
  ++g_forward_calls;
}

void launch_flash_attention_backward(DType dt, const FlashBackwardArgs& a, const AttnShape& s, cudaStream_t stream) {
  FlashParams p = make_params(s);
  p.q = dev_strides(a.q.st);
  p.k = dev_strides(a.k.st);
  p.v = dev_strides(a.v.st);
  p.o = dev_strides(a.out.st);
  p.dout = dev_strides(a.dout.st);
  p.dq = dev_strides(a.dq.st);
  p.dk = dev_strides(a.dk.st);
  p.dv = dev_strides(a.dv.st);
  const int64_t rows = s.B * s.Hq * s.T;
  fa::dispatch(dt, s.D, "flash_attention_backward", [&](auto e, auto dc) {
    using E = decltype(e);
    constexpr int D = decltype(dc)::value;
    constexpr int kPrepBlock = 256;
    const int64_t chunks = rows * (D / 8);
    fa::flash_bwd_prep_kernel<E, D><<<static_cast<unsigned>((chunks + kPrepBlock - 1) / kPrepBlock), kPrepBlock, 0,
                                      stream>>>(a.dsum, a.dq_acc, static_cast<const uint16_t*>(a.out.data),
                                                static_cast<const uint16_t*>(a.dout.data), p, rows);
    HT_CHECK_LAUNCH("flash_attention_backward (dsum)");
    // Note [Backward variants]: the split kernel at D 128, the lean kernel at D 64
    if constexpr (D == 128) fa::launch_backward_split(dt, a, p, stream);
    else fa::launch_backward_lean(dt, a, p, stream);
    HT_CHECK_LAUNCH("flash_attention_backward");
    fa::flash_dq_convert_kernel<E, D><<<cuda::grid_for(chunks), cuda::kBlock, 0, stream>>>(
        static_cast<uint16_t*>(a.dq.data), a.dq_acc, p, rows);
    HT_CHECK_LAUNCH("flash_attention_backward (dq)");
  });
  ++g_backward_calls;
}

}  // namespace ht::kernels
