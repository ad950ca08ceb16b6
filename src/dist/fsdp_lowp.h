// FSDP's low-precision communication (FsdpOptions::gather_dtype, reduce_quant; docs/distributed.md,
// "Low-precision communication"): what each parameter's all-gather moves and how a gradient is reduce-scattered.
// Internal to src/dist: FullyShardedModel owns one and its policy calls it from its gathers and reduce-scatters.
//
// Note [Low-precision FSDP gathers]
// gather_dtype fp32: every shard travels as it is. bf16: every shard travels cast to bf16 and is widened back
// to the master dtype on arrival. int8 / fp8: a parameter of 2 or more dimensions that belongs to a unit named
// by dist.fsdp_units (or the automatic units: a transformer block, a ResNet stage) travels as HQ-FSDP's 8-bit
// rows (Note [8-bit weight all-gather] in dist/comm_quant.h); it is sharded by whole rows, so its chunk is
// ceil(O/N)·C elements instead of ceil(O·C/N). Every other parameter (norms, biases, and, as HQ-FSDP leaves
// them in high precision, the embedding and the head, which are units of their own) travels in fp32. The
// first 8-bit gather of a unit in a step all-reduces (max) the vector of its weights' local absmaxes; the
// gathers of the same unit later in that step (the re-gather in backward with reshard_after_forward) reuse it,
// so they move byte-identical codes; end_step() drops them. The gathered codes (the first O rows) and the scale
// stay with the gathered tensor: materialise attaches them to the tensor it hands the layer, and a halo layer
// whose level rotates W (1, 2) in the gather's carrier multiplies them directly instead of quantising the
// dequantised weight again (grad/pipeline_halo_weight.h); they are dropped with the gathered tensor's memory.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/grad/pipeline_halo_weight.h"

namespace ht::dist {

class FsdpLowPrecision {
 public:
  FsdpLowPrecision(Communicator& comm, const FsdpOptions& options);

  // Registers the next parameter (in store order) and returns its elements per rank. `named_unit`: it belongs
  // to a unit named by a prefix (Note [Low-precision FSDP gathers]).
  int64_t add_param(const std::string& name, const Shape& shape, std::size_t unit, bool named_unit);
  bool row_quantized(std::size_t i) const { return codecs_[i].has_value(); }
  int64_t quantized_params() const;

  // Starts the all-gather of params[i]'s shard into out ((N·chunk) in the shard's dtype, filled when the
  // returned Work's wait() returns); adds the bytes this rank puts into collectives to `bytes`.
  std::unique_ptr<Work> gather(const std::vector<FullyShardedModel::Param>& params, std::size_t i, const Tensor& out,
                               int64_t& bytes);

  // The codes and scale of params[i]'s last 8-bit gather (while the gathered tensor holds memory), attached to
  // `w`, the tensor the layer computes with, for a halo pipeline's Q(W·H̃) (Note [Gathered 8-bit weights] in
  // grad/pipeline_halo_weight.h); nothing for a parameter gathered otherwise. drop_codes forgets them.
  void attach_codes(std::size_t i, const Tensor& w) const;
  void drop_codes(std::size_t i) { gathered_[i].reset(); }

  bool quantized_reduce() const { return options_.reduce_quant != ReduceQuant::none; }
  // The quantised reduce-scatter (Note [Quantised reduce-scatter]) of a flat f32 gradient (N·chunk) -> this
  // rank's chunk (f32); its error is measured on the steps dist.reduce_quant_error_every selects.
  Tensor reduce_scatter(const Tensor& flat, int64_t& bytes);

  // After the optimiser step: drops the step's shared absmaxes; on a measured step logs the reduce-scatter's
  // relative L2 error over all its calls and keeps it (last_reduce_error).
  void end_step();
  double last_reduce_error() const { return last_error_; }
  int64_t measured_steps() const { return measured_steps_; }  // steps whose error was measured so far

 private:
  // The unit's absmax vector for this step: computed and all-reduced (max) at its first 8-bit gather.
  const Tensor& unit_absmax(const std::vector<FullyShardedModel::Param>& params, std::size_t unit, int64_t& bytes);

  Communicator& comm_;
  FsdpOptions options_;
  std::vector<std::optional<RowCodec>> codecs_;    // per parameter: its 8-bit row codec, or none
  std::vector<std::size_t> slot_;                   // per parameter: its index in its unit's absmax vector
  std::vector<std::vector<std::size_t>> unit_rows_;  // per unit: its row-quantised parameters
  std::vector<Tensor> absmax_;                       // per unit: this step's shared absmaxes (k) f32
  std::vector<std::shared_ptr<const grad::GatheredWeight>> gathered_;  // per parameter: its gathered codes, or null
  int64_t step_ = 0;
  double err_sq_ = 0, ref_sq_ = 0;
  int64_t measured_calls_ = 0;
  double last_error_ = -1.0;
  int64_t measured_steps_ = 0;
};

}  // namespace ht::dist
