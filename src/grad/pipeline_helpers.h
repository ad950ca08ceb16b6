// Internal to src/grad: the small tensor helpers the pipelines share, and their noise roles. Each pipeline is
// in its own files and registers itself (grad/registry.h).
#pragma once
#include <memory>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/ops/nn_ops.h"

namespace ht::grad {

// Noise roles (the 8-bit purpose field of philox_stream), one per quantised operand.
enum Role : uint32_t {
  role_gx_gy = 1,  // HQ: g_y of the g_x product
  role_gx_w = 2,   // HQ: W when quantised with stochastic rounding
  role_gw_gy = 3,  // HLA: projected g_y of the g_w product
  role_luq_gy = 4, // LUQ: g_y
};

// Bytes of a tensor's elements (packed int4 counts half a byte each).
int64_t tensor_bytes(const Tensor& t);

// An input a pipeline need not keep a copy of in its forward, because backward can have it again with the same bits
// (Note [Shared saved inputs], Note [Rebuilt inputs] in autograd/saved_tensor.h): a reference to the tensor another
// op keeps for its own backward, or the op that rebuilds it. Backward takes it once and compresses it as the forward
// would have.
struct LaterInput {
  struct Allowed {
    bool share = true;    // keep a reference when another op keeps x
    bool rebuild = true;  // keep the rebuild when x's op can rebuild it
  };
  SavedTensor kept;
  RebuildInput rebuild;
  // Defers x when `allowed` lets it: a reference, else the rebuild. False when the forward must keep its own copy.
  bool defer(const Tensor& x, const RebuildInput& r, Allowed allowed) {
    if (allowed.share && kept_for_backward(x)) {
      kept = SavedTensor(x);
      return true;
    }
    if (allowed.rebuild && r) {
      rebuild = r;
      return true;
    }
    return false;
  }
  bool pending() const { return kept.defined() || static_cast<bool>(rebuild); }
  // The input, keeping it: the reference, or a rebuild left for the take() of a LaterInput sharing this one's
  // RebuildInput (a product node rebuilding its output, Note [Recomputed outputs]).
  Tensor get() const { return kept.defined() ? kept.get() : rebuild.rebuild_and_leave(); }
  // The input, once: the reference or the rebuilt tensor (releasing the node).
  Tensor take() {
    if (kept.defined()) return kept.release();
    Tensor t = rebuild.take();  // the x a product node rebuilt for its output, or a rebuild now
    rebuild = {};
    return t;
  }
};

// x (B, L, I), w (O, I) -> y (B, L, O) = x·wᵀ + info.bias in x's dtype (the high-precision forward every pipeline
// uses; the bias, when there is one, in the GEMM's epilogue).
Tensor forward_product(const Tensor& x, const Tensor& w, const ProductInfo& info);

// The same product for a conv product (forward_conv): y (B, L, O) of the convolution of info.image (N, C, H, W)
// with w (O, C·kh·kw) through the conv2d op (cuDNN on CUDA), without the im2col columns. A channels-last image
// (the permuted view of a contiguous (N, H, W, C) map) gives contiguous (N, OH·OW, O) rows, any other the
// (N, O, OH·OW) result viewed transposed. Equal to forward_product(unfold2d(image), w) up to summation order.
Tensor conv_forward_product(const ProductInfo& info, const Tensor& w);
// The conv2d params of an unfold window (groups 1, NCHW).
Conv2dParams conv_params(const Unfold2dParams& u);

// Exact backward products (matmul in g's dtype, f32 accumulation) of (B, L, O) g, (B, L, I) x, (O, I) w:
Tensor exact_grad_x(const Tensor& g_y, const Tensor& w);  // (B, L, I) in g's dtype
Tensor exact_grad_w(const Tensor& g_y, const Tensor& x);  // (O, I) in g's dtype

// (2, B, ...) bf16 for codes (B, ...) (i8 or f8e4m3) and scale (B): with t = scale[b]·code in f32, [0] is
// hi = bf16(t) and [1] lo = bf16(t − hi) (|t − hi − lo| ≤ 2⁻¹⁸·|t|). One pass on CUDA, the same bits as the CPU's
// conversions. Note [Per-sample scales in one product].
Tensor split_scaled_codes(const Tensor& codes, const Tensor& scale);

// Σ_b scale[b]·a[b]ᵀ·b[b] -> (M, N) f32 for codes a (B, K, M), b (B, K, N), each i8 (HLQ's levels, LUQ's x levels)
// or f8e4m3 (LUQ's ±2^k), and scale (B): per-sample scales on the contraction axis, in two bf16 products.
// Note [Per-sample scales in one product].
Tensor scaled_code_product(const Tensor& a, const Tensor& b, const Tensor& scale);

// int8 values in −8..7 of any shape <-> packed int4 storage (a zero nibble pads an odd count).
Tensor pack_int4_any(const Tensor& q);
Tensor unpack_int4_any(const Tensor& packed, const Shape& shape);

// The epilogue of an integer product: f32(acc) · (scale_a · scale_b · mult · row_scale[row / rows_per_scale])
// as out_dtype (f32 or bf16), for acc i32 (rows, C), one-element f32 scales on acc's device and an optional
// f32 row_scale (rows / rows_per_scale). One pass on CUDA (cuda/kernels/lowp_gemm.cuh, scale_i32).
Tensor scale_i32(const Tensor& acc, const Tensor& scale_a, const Tensor& scale_b, double mult, DType out_dtype,
                 const Tensor& row_scale = Tensor(), int64_t rows_per_scale = 1);

// v (G) -> (G·k) f32: each element repeated k times, times mult (the outer-vector scales of fp8_matmul_nt_outer: a
// scale per sample over its rows, or one scale over every column). One pass over a broadcast view of v.
Tensor repeat_each(const Tensor& v, int64_t k, double mult = 1.0);

// Per-group scale (f32, shape (G)) broadcast against t (G, ...): t · scale[g] along dim 0.
Tensor scale_dim0(const Tensor& t, const Tensor& scale);

}  // namespace ht::grad
