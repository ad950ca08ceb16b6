// The `dist:` config section (dist/options.h).
#include "hadatrain/dist/options.h"

#include "hadatrain/core/error.h"

namespace ht::dist {

DistOptions read_dist_options(ConfigReader r) {
  DistOptions o;
  o.mode = r.get_choice("mode", DistMode::none, {{"none", DistMode::none}, {"ddp", DistMode::ddp}, {"fsdp", DistMode::fsdp}});
  o.engine = r.get_enum("engine", "auto", {"auto", "gloo", "nccl"});
  if (o.engine == "auto") o.engine.clear();
  // Whole milliseconds from 1 ms to one week: the collectives take their timeout in milliseconds (an int64).
  o.timeout_s = r.get("timeout_s", 300.0, Range::closed(0.001, 604800.0));
  o.bucket_mb = r.get("bucket_mb", 25.0, Range::positive());
  o.reduce_in_backward = r.get("reduce_in_backward", true);
  o.fsdp_units = r.get_list<std::string>("fsdp_units", {});
  o.reduce_dtype = r.get_enum("reduce_dtype", "f32", {"f32", "bf16"});
  o.prefetch = r.get("prefetch", true);
  o.reshard_after_forward = r.get("reshard_after_forward", true);
  o.gather_dtype = r.get_choice("gather_dtype", GatherDType::f32,
                                {{"fp32", GatherDType::f32}, {"bf16", GatherDType::bf16}, {"int8", GatherDType::int8},
                                 {"fp8", GatherDType::fp8}});
  o.reduce_quant = r.get_choice("reduce_quant", ReduceQuant::none,
                                {{"none", ReduceQuant::none}, {"int8", ReduceQuant::int8}, {"int4", ReduceQuant::int4}});
  o.reduce_quant_block = r.get<int64_t>("reduce_quant_block", 256, Range::at_least(2));
  o.reduce_quant_error_every = r.get<int64_t>("reduce_quant_error_every", 100, Range::at_least(0));
  // The FSDP library checks the same (fsdp_lowp.cpp); here the error names the config's file and line.
  if (o.reduce_quant_block % 2 != 0)
    r.fail("reduce_quant_block", fmt::format("expected an even number of values (int4 codes pack in pairs), got {}",
                                             o.reduce_quant_block));
  const std::string not_fsdp =
      fmt::format("low-precision communication is for dist.mode fsdp, got mode {}", dist_mode_name(o.mode));
  if (o.mode != DistMode::fsdp && o.gather_dtype != GatherDType::f32) r.fail("gather_dtype", not_fsdp);
  if (o.mode != DistMode::fsdp && o.reduce_quant != ReduceQuant::none) r.fail("reduce_quant", not_fsdp);
  if (o.reduce_quant != ReduceQuant::none && o.reduce_dtype != "f32")
    r.fail("reduce_dtype", fmt::format("dist.reduce_quant {} replaces the reduce-scatter's dtype: leave reduce_dtype "
                                       "at f32 (got {})", reduce_quant_name(o.reduce_quant), o.reduce_dtype));
  return o;
}

const char* dist_mode_name(DistMode m) {
  switch (m) {
    case DistMode::none: return "none";
    case DistMode::ddp: return "ddp";
    case DistMode::fsdp: return "fsdp";
  }
  return "?";
}

}  // namespace ht::dist
