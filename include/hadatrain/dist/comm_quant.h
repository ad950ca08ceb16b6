// Low-precision communication for sharded training (docs/distributed.md, "Low-precision communication"):
//   - the 8-bit weight all-gather of HALO's HQ-FSDP (reference/halo.md §6): each rank rotates its rows of a
//     weight by HALO's full-size Hadamard rotation, one scale per weight shared by every rank (the max over
//     ranks of the local absmax), int8 or fp8 e4m3 codes on the wire, dequantised by the receiver;
//   - a quantised gradient reduce-scatter in the style of ZeRO++ qgZ (reference/anchors.md §3): block-wise
//     int8 or int4 codes with one f32 scale per block, each destination's blocks sent to it with the
//     communicator's all-to-all and dequantised and summed in f32 by the receiver, with its error against the
//     f32 reduce-scatter measured on request.
// The rotation and the 8-bit quantiser are HALO's (grad/pipeline_halo.h), the block quantiser and the int4
// packing the gradient pipelines' (grad/quant.h); this module adds the collective choreography and the one
// kernel neither has: the receiver's dequantise-and-sum (CPU reference here, CUDA in
// cuda/kernels/comm_quant.cu, bit-identical).
//
// Note [8-bit weight all-gather]
// A weight of shape (O, I, ...) is seen as rows (O, C), C = I·... . FSDP shards it by whole rows: rank r
// holds rows [r·R, (r+1)·R), R = ceil(O/N) (rows past O are zero padding). Per unit of weights:
//   1. rank r: m_r = max |v| over its rows rotated by H̃ of size n = halo_rotation_size(C) (halo_absmax);
//   2. one all-reduce (max) of the unit's m_r vector: m = max_r m_r, the same f32 on every rank;
//   3. rank r: codes (R, n) = halo_quantize_with_absmax(rows, carrier, n, m); scale s = m / qmax (127 or
//      448) is computed by every rank from the same m, so no scale travels;
//   4. all-gather of the codes: N·R·n bytes arrive, R·n leave each rank (C·4 bytes per row in f32);
//   5. receiver: W ≈ ((codes·s)·H̃ᵀ)/n, the first C columns, in f32 (dequantize_rows: HALO's dequantise and
//      inverse rotation).
// FSDP keeps m for the step, so the re-gather in backward (reshard_after_forward) moves byte-identical codes
// (Note [Low-precision FSDP gathers] in src/dist/fsdp_lowp.h).
// Error bound per weight of R' gathered rows (R' = N·R): v = W·H̃ with H̃·H̃ᵀ = n·I, so ||v||_F = √n·||W||_F
// and the reconstruction error is ||ΔW||_F = ||Δv||_F/√n. int8 rounds to nearest and no value
// saturates (|v| <= m = 127·s): |Δv| <= s/2 per element. e4m3 rounds to nearest with 3 mantissa bits:
// |Δv| <= 2^-4·|v| for normals and half the subnormal step 2^-9·s, 2^-10·s, below. Over R'·n elements:
//   int8: ||ΔW||_F <= (s/2)·√R'            s = m/127
//   fp8:  ||ΔW||_F <= 2^-4·||W||_F + 2^-10·s·√R'   s = m/448
// plus the f32 roundings of the rotations (relative ~n·2^-24). test_comm_quant checks these bounds.
//
// Note [Quantised reduce-scatter]
// Every rank r block-quantises its whole input x_r (N·c values, chunk c per destination, each destination's
// chunk padded to c' = ceil(c/B)·B so no block straddles two ranks' chunks) with grad::quantize (row
// granularity over blocks of B, absmax scale, round to nearest, bits 8 or 4; int4 packed two per byte); one
// all-to-all of the codes and one of the scales send destination j's chunk to rank j (no hand-written
// algorithm: NCCL's grouped send/receive, Gloo's alltoall). Rank j then sums, in f32 and in rank order from 0,
//   out[e] = Σ_r float(level_r[j, e]) · scale_r[j, e / B]     (one f32 product and one f32 sum per term)
// (dequantize_sum_received; dequantize_sum computes the same from every rank's whole codes, for simulations).
// Wire bytes per rank, N ranks, P = N·c values, x = b/8 + 4/B bytes a value: the all-to-all sends (N−1)/N·P'·x
// (P' = N·c' >= P, the padded input), against (N−1)/N·P·4 for an f32 ring reduce-scatter: a ratio of about
// x/4 (int8, B 256: 0.254; int4: 0.129) whatever N. The bytes this rank puts into collectives (what
// FullyShardedModel::bytes_on_wire counts) are P'·x. Error:
// per block, |Δ| <= s/2 per element (round to nearest, s = absmax/qmax, qmax 127 or 7), so
//   ||out − exact||_2 <= √(Σ_r Σ_blocks B·s_rb²/4) + f32 summation rounding;
// with measure_error on, the exact f32 reduce-scatter also runs and the relative L2 error over every rank's
// chunk is returned (one more reduce-scatter and a two-number all-reduce: a host synchronisation on CUDA).
#pragma once
#include <cstdint>

#include "hadatrain/dist/communicator.h"
#include "hadatrain/grad/pipeline_halo.h"

namespace ht::dist {

// What FSDP's weights travel as (dist.gather_dtype) and how its gradients are reduced (dist.reduce_quant).
enum class GatherDType { f32, bf16, int8, fp8 };
enum class ReduceQuant { none, int8, int4 };
const char* gather_dtype_name(GatherDType d);
const char* reduce_quant_name(ReduceQuant q);

// The bytes of t (contiguous, at offset 0 of its storage) as a u8 tensor sharing its storage: what the
// collectives move for codes NCCL has no type for (packed int4) or may lack (fp8 in older NCCL).
Tensor byte_view(const Tensor& t);

// ---- 8-bit weight all-gather (Note [8-bit weight all-gather]) ------------------------------------------

// How one weight's rows travel: the carrier and the rotation of its C columns.
struct RowCodec {
  grad::Carrier carrier = grad::Carrier::int8;
  int64_t cols = 0;              // C
  grad::HaloRotation rotation;   // halo_rotation_size(C)
};
// The codec of rows of `cols` columns; throws (naming `what`) when C needs a rotation above HALO's largest.
RowCodec make_row_codec(GatherDType carrier, int64_t cols, const std::string& what);

// rows (R, C), any floating dtype -> max |v| of their rotated values, f32 (1) on rows' device.
Tensor rows_absmax(const RowCodec& c, const Tensor& rows);
// rows (R, C) -> codes (R, n) and scale f32 (1) = absmax / qmax; absmax: f32 (1) on rows' device.
grad::HaloQuantized quantize_rows(const RowCodec& c, const Tensor& rows, const Tensor& absmax);
// codes (R, n) and scale -> (R, C) f32 ≈ the rows quantised (on the codes' device).
Tensor dequantize_rows(const RowCodec& c, const grad::HaloQuantized& q);

// ---- quantised reduce-scatter (Note [Quantised reduce-scatter]) ------------------------------------------

struct QuantReduceSpec {
  int bits = 8;          // 8 or 4
  int64_t block = 256;   // values per scale; even (int4 packs pairs)
  bool measure_error = false;
};

// One rank's block-quantised input: codes of every destination's padded chunk, and their scales.
struct BlockCodes {
  Tensor codes;   // u8 (N·c'·bits/8): int8 levels, or int4 levels two per byte (low nibble first)
  Tensor scales;  // f32 (N·c'/B)
};
// input (N·c) f32 -> its block codes (CPU and CUDA bit-identical: grad::quantize and grad::pack_int4).
BlockCodes quantize_blocks(const Tensor& input, int64_t ranks, const QuantReduceSpec& spec);
// gathered codes (N ranks' BlockCodes one after another) -> chunk `dest` (c values, f32) of the sum over the
// ranks of their dequantised inputs, summed in rank order (Note [Quantised reduce-scatter]).
Tensor dequantize_sum(const BlockCodes& gathered, int64_t ranks, int64_t chunk, int64_t dest,
                      const QuantReduceSpec& spec);
// received codes (N ranks' chunks destined to this rank, one after another, as the all-to-all delivers them) ->
// the sum over the ranks of their dequantised chunks, in rank order: bit for bit dequantize_sum of the gathered
// codes for this rank's chunk.
Tensor dequantize_sum_received(const BlockCodes& received, int64_t ranks, int64_t chunk, const QuantReduceSpec& spec);

struct QuantReduceResult {
  Tensor chunk;             // (c) f32: this rank's chunk of the sum over ranks
  int64_t bytes_sent = 0;   // bytes this rank put into the collectives (codes and scales; the reference's too)
  double rel_error = -1.0;  // measure_error: ||out − exact||/||exact|| over every rank's chunk; else −1
  double err_sq = 0.0, ref_sq = 0.0;  // measure_error: the two sums over ranks behind rel_error
};
// input (N·c) f32 on comm's device, the same length on every rank -> this rank's chunk of the sum over
// ranks, through block codes (Note [Quantised reduce-scatter]). Blocks until the collectives are done.
QuantReduceResult quantized_reduce_scatter(Communicator& comm, const Tensor& input, const QuantReduceSpec& spec);

}  // namespace ht::dist
