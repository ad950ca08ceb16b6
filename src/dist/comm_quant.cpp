// Low-precision communication (dist/comm_quant.h): the 8-bit weight codec of HQ-FSDP over HALO's rotation and
// quantiser, and the block-quantised reduce-scatter over grad::quantize, the communicator's all-to-all and the
// dequantise-and-sum below (CPU reference loop; CUDA through cuda/glue/comm_quant_glue.h, the same bits).
#include "hadatrain/dist/comm_quant.h"

#include <cmath>

#include "hadatrain/autograd/meta.h"  // TensorImpl's autograd slot, for byte_view
#include "hadatrain/core/error.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/comm_quant_glue.h"
#endif

namespace ht::dist {
namespace {

int64_t padded_chunk(int64_t chunk, int64_t block) { return (chunk + block - 1) / block * block; }

void check_spec(const QuantReduceSpec& s) {
  HT_CHECK(s.bits == 8 || s.bits == 4, "dist.reduce_quant: expected int8 or int4 (8 or 4 bits), got {} bits", s.bits);
  HT_CHECK(s.block >= 2 && s.block % 2 == 0, "dist.reduce_quant_block: expected an even block of at least 2 values, got {}",
           s.block);
}

// Level of element i of one rank's codes (bits 8: int8; bits 4: nibble i % 2 of byte i / 2, two's complement).
int level_at(const uint8_t* codes, int64_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  const int nib = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
  return (nib ^ 8) - 8;
}

}  // namespace

const char* gather_dtype_name(GatherDType d) {
  switch (d) {
    case GatherDType::f32: return "fp32";
    case GatherDType::bf16: return "bf16";
    case GatherDType::int8: return "int8";
    case GatherDType::fp8: return "fp8";
  }
  return "?";
}

const char* reduce_quant_name(ReduceQuant q) {
  switch (q) {
    case ReduceQuant::none: return "none";
    case ReduceQuant::int8: return "int8";
    case ReduceQuant::int4: return "int4";
  }
  return "?";
}

Tensor byte_view(const Tensor& t) {
  HT_CHECK(t.defined() && t.is_contiguous() && t.offset() == 0,
           "byte_view: expected a contiguous tensor at offset 0 of its storage, got {}",
           t.defined() ? t.describe() : "undefined");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = Shape({static_cast<int64_t>(t.nbytes())});
  impl->strides = Strides({1});
  impl->dtype = DType::u8;
  impl->device = t.device();
  return Tensor(std::move(impl));
}

// ---- 8-bit weight all-gather ------------------------------------------------------------------------------

RowCodec make_row_codec(GatherDType carrier, int64_t cols, const std::string& what) {
  HT_CHECK(carrier == GatherDType::int8 || carrier == GatherDType::fp8,
           "{}: an 8-bit row codec carries int8 or fp8, got {}", what, gather_dtype_name(carrier));
  HT_CHECK(cols >= 1, "{}: rows need at least one column, got {}", what, cols);
  HT_CHECK(cols <= grad::kHaloMaxRotation,
           "{}: rows of {} columns need a Hadamard rotation above HALO's largest ({}); gather it in fp32 or bf16",
           what, cols, grad::kHaloMaxRotation);
  const grad::HaloRotation rot = grad::halo_rotation_size(cols);  // <= kHaloMaxRotation: a power of two fits
  return {carrier == GatherDType::int8 ? grad::Carrier::int8 : grad::Carrier::fp8, cols, rot};
}

Tensor rows_absmax(const RowCodec& c, const Tensor& rows) {
  HT_CHECK(rows.dim() == 2 && rows.size(1) == c.cols, "rows_absmax: expected rows (R, {}), got {}", c.cols,
           rows.describe());
  return grad::halo_absmax(rows, c.rotation);
}

grad::HaloQuantized quantize_rows(const RowCodec& c, const Tensor& rows, const Tensor& absmax) {
  HT_CHECK(rows.dim() == 2 && rows.size(1) == c.cols, "quantize_rows: expected rows (R, {}), got {}", c.cols,
           rows.describe());
  return grad::halo_quantize_with_absmax(rows, c.carrier, c.rotation, absmax);
}

Tensor dequantize_rows(const RowCodec& c, const grad::HaloQuantized& q) {
  const int64_t width = c.rotation.n > 1 ? c.rotation.n : c.cols;  // no rotation (C = 1): the codes are the rows
  HT_CHECK(q.codes.dim() == 2 && q.codes.size(1) == width, "dequantize_rows: expected codes (R, {}), got {}", width,
           q.codes.describe());
  const Tensor v = grad::halo_dequantize(q);  // (R, n) f32: codes·s, the rotated values
  if (c.rotation.n <= 1) return v;
  return grad::halo_rotate(v, {.rotation = c.rotation,
                               .direction = grad::HaloDirection::inverse,
                               .cols = c.cols,
                               .mult = 1.0f / static_cast<float>(c.rotation.n),
                               .out_dtype = DType::f32});
}

// ---- quantised reduce-scatter ------------------------------------------------------------------------------

BlockCodes quantize_blocks(const Tensor& input, int64_t ranks, const QuantReduceSpec& spec) {
  check_spec(spec);
  HT_CHECK(input.dim() == 1 && input.dtype() == DType::f32 && input.numel() % ranks == 0,
           "quantize_blocks: expected f32 (N·c) with N = {} ranks, got {}", ranks, input.describe());
  const int64_t c = input.numel() / ranks, cp = padded_chunk(c, spec.block);
  Tensor padded = input.contiguous().view({ranks, c});  // (N, c') with each destination's chunk zero-padded
  if (cp != c) {
    padded = zeros({ranks, cp}, {DType::f32, input.device()});
    copy_(padded.narrow(1, 0, c), input.contiguous().view({ranks, c}));
  }
  grad::QuantSpec q;
  q.bits = spec.bits;
  q.granularity = grad::Granularity::row;
  q.scale_rule = grad::ScaleRule::absmax;
  q.rounding = grad::Rounding::nearest;
  const grad::Quantized quantized = grad::quantize(padded.view({ranks * cp / spec.block, spec.block}), q);
  BlockCodes out;
  const Tensor levels = quantized.values.view({ranks * cp});  // i8 in −qmax..qmax
  out.codes = byte_view(spec.bits == 8 ? levels : grad::pack_int4(levels));
  out.scales = quantized.scale.contiguous().view({ranks * cp / spec.block});
  return out;
}

namespace {

// The sum over `ranks` of chunk `dest` of their codes, each rank's codes holding `per_rank` destination chunks
// (Note [Quantised reduce-scatter]).
Tensor dequantize_sum_of(const BlockCodes& codes_in, int64_t ranks, int64_t per_rank, int64_t chunk, int64_t dest,
                         const QuantReduceSpec& spec, const char* what) {
  check_spec(spec);
  const int64_t cp = padded_chunk(chunk, spec.block);
  HT_CHECK(codes_in.codes.dtype() == DType::u8 && codes_in.codes.numel() == ranks * per_rank * cp * spec.bits / 8 &&
               codes_in.scales.dtype() == DType::f32 && codes_in.scales.numel() == ranks * per_rank * cp / spec.block &&
               dest >= 0 && dest < per_rank,
           "{}: expected codes u8 ({}) and scales f32 ({}) of {} ranks for chunk {} of {}, got {} and {}", what,
           ranks * per_rank * cp * spec.bits / 8, ranks * per_rank * cp / spec.block, ranks, dest, chunk,
           codes_in.codes.describe(), codes_in.scales.describe());
  Tensor out = empty({chunk}, {DType::f32, codes_in.codes.device()});
  if (chunk == 0) return out;
  const Tensor codes = codes_in.codes.contiguous(), scales = codes_in.scales.contiguous();
  if (out.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::comm_dequant_sum(out, codes, scales, {.ranks = ranks, .chunks_per_rank = per_rank, .chunk = chunk,
                                                    .chunk_padded = cp, .dest = dest, .block = spec.block,
                                                    .bits = spec.bits});
    return out;
#else
    HT_FAIL("{}: built without CUDA", what);
#endif
  }
  const auto* pc = static_cast<const uint8_t*>(codes.data_ptr());
  const float* ps = scales.data<float>();
  const int64_t values_per_rank = per_rank * cp, blocks_per_rank = values_per_rank / spec.block;
  float* po = out.data<float>();
  for (int64_t e = 0; e < chunk; ++e) {
    float acc = 0.0f;
    const int64_t i = dest * cp + e;  // the element's index in one rank's codes
    for (int64_t r = 0; r < ranks; ++r) {
      const float level = static_cast<float>(level_at(pc + r * values_per_rank * spec.bits / 8, i, spec.bits));
      const float term = level * ps[r * blocks_per_rank + i / spec.block];
      acc = acc + term;
    }
    po[e] = acc;
  }
  return out;
}

}  // namespace

Tensor dequantize_sum(const BlockCodes& gathered, int64_t ranks, int64_t chunk, int64_t dest,
                      const QuantReduceSpec& spec) {
  return dequantize_sum_of(gathered, ranks, ranks, chunk, dest, spec, "dequantize_sum");
}

Tensor dequantize_sum_received(const BlockCodes& received, int64_t ranks, int64_t chunk, const QuantReduceSpec& spec) {
  return dequantize_sum_of(received, ranks, 1, chunk, 0, spec, "dequantize_sum_received");
}

QuantReduceResult quantized_reduce_scatter(Communicator& comm, const Tensor& input, const QuantReduceSpec& spec) {
  const int64_t n = comm.size();
  HT_CHECK(input.dim() == 1 && input.dtype() == DType::f32 && input.device() == comm.device() && input.numel() % n == 0,
           "quantized_reduce_scatter: expected f32 (N·c) on {} with N = {} ranks, got {}", to_string(comm.device()), n,
           input.describe());
  const int64_t c = input.numel() / n;
  const BlockCodes mine = quantize_blocks(input, n, spec);
  // Each destination's chunk of codes and scales goes to its rank: this rank receives every rank's codes of its own
  // chunk, in rank order.
  BlockCodes received;
  received.codes = empty({mine.codes.numel()}, {DType::u8, comm.device()});
  received.scales = empty({mine.scales.numel()}, {DType::f32, comm.device()});
  auto w_codes = comm.all_to_all(mine.codes, received.codes);
  auto w_scales = comm.all_to_all(mine.scales, received.scales);
  w_codes->wait();
  w_scales->wait();
  QuantReduceResult res;
  res.bytes_sent = static_cast<int64_t>(mine.codes.nbytes() + mine.scales.nbytes());
  res.chunk = dequantize_sum_received(received, n, c, spec);
  if (!spec.measure_error) return res;
  Tensor exact = empty({c}, {DType::f32, comm.device()});
  comm.reduce_scatter(input.contiguous(), exact, ReduceOp::sum)->wait();
  res.bytes_sent += static_cast<int64_t>(input.nbytes());
  const Tensor d = sub(res.chunk, exact).to(DType::f64), e = exact.to(DType::f64);
  Tensor sums = cat({sum(mul(d, d)).reshape({1}), sum(mul(e, e)).reshape({1})}, 0);  // (2) f64
  comm.all_reduce(sums, ReduceOp::sum)->wait();
  const std::vector<double> host = sums.to(Device::cpu()).to_vector<double>();
  res.err_sq = host[0];
  res.ref_sq = host[1];
  res.rel_error = res.ref_sq > 0 ? std::sqrt(res.err_sq / res.ref_sq) : (res.err_sq > 0 ? INFINITY : 0.0);
  return res;
}

}  // namespace ht::dist
