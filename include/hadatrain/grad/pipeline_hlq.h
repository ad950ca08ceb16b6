// The `hlq` pipeline's options (docs/gradient_pipelines.md, docs/config.md; specification hlq.md §3–§5): g_x by
// Hadamard-rotated 4-bit products (HQ), g_w by low-rank Walsh projection and 8-bit products (HLA), the forward
// saving the projected, compressed activation (ACBP). The pipeline is in src/grad/pipeline_hlq.cpp, its config
// reader and description in src/grad/pipeline_hlq_options.cpp.
#pragma once
#include <cstdint>
#include <memory>

#include "hadatrain/grad/hla.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/lowp_matmul.h"  // Fp8Accumulation

namespace ht::grad {

enum class HlaFallback { ref, split_extra, pad };
enum class Carrier { fp8, int8 };  // tensor cores that run the 4-bit values (CUDA); the CPU computes exactly
// What HLQ's ACBP saves for a Conv2d (Note [ACBP of a convolution] in docs/gradient_pipelines.md): the
// projected, quantised im2col columns (the reference) or the input map, 8-bit with one scale per sample, from
// which backward re-runs im2col and the projection (a deviation that keeps the memory saving).
enum class AcbpConv { columns, input_map };
// How HLQ's g_x product of a Conv2d runs (Note [HLQ conv g_x] in src/grad/pipeline_hlq.cpp): columns (the
// default), the low-precision GEMM (int8 / fp8 tensor cores) over the im2col columns, folded back to the image
// (the specification's integer product); dgrad_simulated, the compute-dtype convolution backward (cuDNN) over the
// dequantised 4-bit g_y and W: a simulation of the low-precision product, for comparison only.
enum class ConvGx { columns, dgrad_simulated };
// How HLQ's g_w product of a Conv2d runs (Note [HLQ conv g_w] in src/grad/pipeline_hlq.cpp): columns (the
// default), the integer product of the 8-bit g̃ = P·g_y and x̃ = P·cols over the reduced axis (the specification's
// form); wgrad_simulated, the compute-dtype convolution backward (cuDNN) of the input image and the
// back-projected g̃, Pᵀ·deq(q_g̃) / n, when backward has the image (a rebuilt, shared or input-map input): x̃ is
// not quantised, so it simulates the product, for comparison only.
enum class ConvGw { columns, wgrad_simulated };

struct HlqOptions {
  // g_x path (HQ)
  int gx_bits = 4;             // 0: no quantisation (rotation only, for tests)
  int64_t block = 16;          // largest Hadamard block T; the layer uses min(block, largest 2^k dividing O)
  ScaleGranularity gy_scale = ScaleGranularity::token;
  WeightQuant w_quant = WeightQuant::sawb;
  Carrier carrier = Carrier::fp8;
  // g_w path (HLA)
  int gw_bits = 8;             // 0: no quantisation of either HLA operand
  // Scales of both HLA operands: one per tensor (one integer product with K = B·R) or one per sample (the
  // reference: one integer product per sample, whose B·O·I int32 results are then scaled and summed — more
  // memory traffic than the whole exact backward on ViT-B). Note [HLA scale granularity].
  ScaleGranularity gw_scale = ScaleGranularity::tensor;
  HlaRank rank;                // percentile 50 by default
  HlaFallback fallback = HlaFallback::ref;
  int64_t extra_tokens = 1;    // split_extra: the first E tokens take the exact path
  int64_t pad_to = 16;         // pad: each sample's axis is zero-padded to a multiple of this power of two
  ScaleRule x_scale = ScaleRule::sawb;  // forward quantiser of the projected activation (round to nearest)
  // ACBP: bits of the saved projected activation: 8 (int8), 4 (packed int4) or 0 (keep f32, no compression)
  int acbp_bits = 8;
  // Conv2d products (conv_product): save the columns (reference) or the input map (int8, or unquantised
  // when acbp_bits is 0); other products always save the columns.
  AcbpConv acbp_conv = AcbpConv::columns;
  // Conv2d products: the g_x product: the 4-bit integer product over the im2col columns, folded (columns, the
  // specification's form), or the dequantised levels through the compute-dtype convolution backward
  // (dgrad_simulated, for comparison only). Note [HLQ conv g_x].
  ConvGx conv_gx = ConvGx::columns;
  // Conv2d products: the g_w product: the 8-bit integer product over the projected columns (columns, the
  // specification's form), or the compute-dtype convolution backward over the image and the back-projected 8-bit
  // g̃ (wgrad_simulated, for comparison only). wgrad_simulated needs the image in backward: a conv whose forward
  // saved its projected columns (acbp_rebuild and acbp_share off, or not applicable) runs columns. Note [HLQ conv g_w].
  ConvGw conv_gw = ConvGw::columns;
  // ACBP of an input that another op already keeps for its own backward (Note [Shared saved inputs]; e.g. the
  // attention output a ViT's proj layer reads): keep a reference instead of a compressed copy, and compress in
  // backward (the same bits). Off: always compress in the forward.
  bool acbp_share = true;
  // ACBP of a Linear input that the op before it can rebuild exactly from what it keeps anyway (ProductInfo::
  // rebuild; e.g. fc2's input, the gelu output, from the gelu's kept input, or a LayerNorm output): keep nothing,
  // rebuild and compress in backward (the same bits, the op's forward once more). Note [Rebuilt inputs]. Off: keep
  // the compressed copy from the forward (no recomputation in backward).
  bool acbp_rebuild = true;
  // On CUDA, g_w's chain (projection, 8-bit quantiser, integer product, rescaling) runs on a side stream beside
  // g_x's (Note [HLQ's two chains] in src/grad/pipeline_hlq.cpp); the same values either way. Off: one stream.
  bool overlap = true;
  // fp8 carrier: how CUDA's g_x product sums (ops/lowp_matmul.h, Fp8Accumulation). Its operands are integer levels
  // held in e4m3, whose partial sums the tensor cores' fast accumulator holds exactly below 2^14 (Note [Fast
  // accumulation of integer codes]): `fast` (the default) then gives the bits of `precise`, the promoted
  // FP32-class accumulation of hlq.md §9, at the fast product's speed. The int8 carrier sums in int32 and
  // ignores this field (a config that asks it for `fast` is an error).
  Fp8Accumulation fp8_accumulation = Fp8Accumulation::fast;
};

// A new hlq pipeline for one layer.
std::shared_ptr<Pipeline> make_hlq_pipeline(const HlqOptions& o);

}  // namespace ht::grad
