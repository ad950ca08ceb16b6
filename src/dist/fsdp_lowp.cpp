// FSDP's low-precision gathers and reduce-scatters (fsdp_lowp.h, Note [Low-precision FSDP gathers]).
#include "fsdp_lowp.h"

#include <cmath>
#include <functional>

#include <spdlog/spdlog.h>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::dist {
namespace {

// A gather whose arrival is decoded into the parameter's buffer: wait() waits for the collective, then decodes
// (once).
class DecodedGather final : public Work {
 public:
  DecodedGather(std::unique_ptr<Work> inner, std::function<void()> decode)
      : inner_(std::move(inner)), decode_(std::move(decode)) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  void synchronize() override {
    inner_->synchronize();
    finish();
  }

 private:
  void finish() {
    if (!decode_) return;
    NoGradGuard no_grad;
    const auto decode = std::move(decode_);
    decode_ = nullptr;
    decode();
  }
  std::unique_ptr<Work> inner_;
  std::function<void()> decode_;
};

}  // namespace

FsdpLowPrecision::FsdpLowPrecision(Communicator& comm, const FsdpOptions& options) : comm_(comm), options_(options) {
  HT_CHECK(options_.reduce_quant == ReduceQuant::none || options_.reduce_dtype == DType::f32,
           "dist.reduce_quant {} replaces the reduce-scatter's dtype: leave dist.reduce_dtype at fp32 (got {})",
           reduce_quant_name(options_.reduce_quant), dtype_name(options_.reduce_dtype));
  HT_CHECK(options_.reduce_quant_block >= 2 && options_.reduce_quant_block % 2 == 0,
           "dist.reduce_quant_block: expected an even number of values of at least 2, got {}",
           options_.reduce_quant_block);
  HT_CHECK(options_.reduce_quant_error_every >= 0, "dist.reduce_quant_error_every: expected >= 0 steps, got {}",
           options_.reduce_quant_error_every);
}

int64_t FsdpLowPrecision::add_param(const std::string& name, const Shape& shape, std::size_t unit, bool named_unit) {
  const int64_t n = comm_.size(), numel = numel_of(shape);
  const bool eight_bit = options_.gather_dtype == GatherDType::int8 || options_.gather_dtype == GatherDType::fp8;
  std::optional<RowCodec> codec;
  if (eight_bit && named_unit && shape.size() >= 2 && numel > 0)
    codec = make_row_codec(options_.gather_dtype, numel / shape[0], "dist.gather_dtype " +
                           std::string(gather_dtype_name(options_.gather_dtype)) + " of parameter '" + name + "'");
  if (unit_rows_.size() <= unit) unit_rows_.resize(unit + 1);
  slot_.push_back(codec ? unit_rows_[unit].size() : 0);
  if (codec) unit_rows_[unit].push_back(codecs_.size());
  codecs_.push_back(codec);
  gathered_.emplace_back();
  absmax_.resize(unit_rows_.size());
  if (!codec) return (numel + n - 1) / n;
  return (shape[0] + n - 1) / n * codec->cols;  // whole rows: ceil(O/N) of them
}

int64_t FsdpLowPrecision::quantized_params() const {
  int64_t k = 0;
  for (const auto& c : codecs_) k += c.has_value();
  return k;
}

const Tensor& FsdpLowPrecision::unit_absmax(const std::vector<FullyShardedModel::Param>& params, std::size_t unit,
                                            int64_t& bytes) {
  Tensor& m = absmax_[unit];
  if (m.defined()) return m;
  std::vector<Tensor> local;
  for (const std::size_t j : unit_rows_[unit]) {
    const RowCodec& c = *codecs_[j];
    const Tensor& shard = params[j].shard;
    local.push_back(rows_absmax(c, shard.detach().view({shard.numel() / c.cols, c.cols})));
  }
  m = cat(local, 0);  // (k) f32: this rank's, then the max over ranks
  bytes += static_cast<int64_t>(m.nbytes());
  comm_.all_reduce(m, ReduceOp::max)->wait();
  return m;
}

std::unique_ptr<Work> FsdpLowPrecision::gather(const std::vector<FullyShardedModel::Param>& params, std::size_t i,
                                               const Tensor& out, int64_t& bytes) {
  const FullyShardedModel::Param& p = params[i];
  const int64_t n = comm_.size();
  if (codecs_[i]) {
    const RowCodec& c = *codecs_[i];
    const Tensor& m = unit_absmax(params, p.unit, bytes);
    const int64_t rows = p.chunk / c.cols;
    grad::HaloQuantized q = quantize_rows(c, p.shard.detach().view({rows, c.cols}), m.narrow(0, static_cast<int64_t>(slot_[i]), 1));
    const int64_t width = q.codes.size(1);
    Tensor all = empty({n * rows, width}, {q.codes.dtype(), comm_.device()});  // (N·R, n) codes in rank order
    bytes += static_cast<int64_t>(q.codes.nbytes());
    auto work = comm_.all_gather(byte_view(q.codes), byte_view(all));
    auto g = std::make_shared<grad::GatheredWeight>();  // read only after the gather's wait (materialise)
    g->codes = all.narrow(0, 0, p.shape[0]);           // the weight's O rows, without the padding rows
    g->scale = q.scale;
    g->carrier = c.carrier;
    g->rotation = c.rotation;
    g->cols = c.cols;
    gathered_[i] = std::move(g);
    return std::make_unique<DecodedGather>(std::move(work), [c, all, scale = q.scale, out] {
      copy_(out, dequantize_rows(c, {all, scale}).reshape({out.numel()}));
    });
  }
  if (options_.gather_dtype == GatherDType::bf16 && p.shard.dtype() != DType::bf16) {
    const Tensor mine = p.shard.detach().to(DType::bf16);
    Tensor all = empty({out.numel()}, {DType::bf16, comm_.device()});
    bytes += static_cast<int64_t>(mine.nbytes());
    auto work = comm_.all_gather(mine, all);
    return std::make_unique<DecodedGather>(std::move(work), [all, out] { copy_(out, all.to(out.dtype())); });
  }
  bytes += static_cast<int64_t>(p.shard.nbytes());
  return comm_.all_gather(p.shard.detach(), out);
}

void FsdpLowPrecision::attach_codes(std::size_t i, const Tensor& w) const {
  if (gathered_[i] != nullptr) grad::attach_gathered_weight(w, gathered_[i]);
}

Tensor FsdpLowPrecision::reduce_scatter(const Tensor& flat, int64_t& bytes) {
  const bool measure = options_.reduce_quant_error_every > 0 && step_ % options_.reduce_quant_error_every == 0;
  const QuantReduceResult r = quantized_reduce_scatter(
      comm_, flat.to(DType::f32).contiguous(),
      {.bits = options_.reduce_quant == ReduceQuant::int4 ? 4 : 8, .block = options_.reduce_quant_block,
       .measure_error = measure});
  bytes += r.bytes_sent;
  if (measure) {
    err_sq_ += r.err_sq;
    ref_sq_ += r.ref_sq;
    ++measured_calls_;
  }
  return r.chunk;
}

void FsdpLowPrecision::end_step() {
  for (Tensor& m : absmax_) m = Tensor();
  if (measured_calls_ > 0) {
    last_error_ = ref_sq_ > 0 ? std::sqrt(err_sq_ / ref_sq_) : 0.0;
    ++measured_steps_;
    if (comm_.rank() == 0)
      spdlog::info("dist: {} reduce-scatter (block {}) at step {}: relative L2 error {:.3e} against f32 over {} "
                   "reduce-scatter(s)",
                   reduce_quant_name(options_.reduce_quant), options_.reduce_quant_block, step_ + 1, last_error_,
                   measured_calls_);
  }
  err_sq_ = ref_sq_ = 0;
  measured_calls_ = 0;
  ++step_;
}

}  // namespace ht::dist
