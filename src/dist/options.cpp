// The `dist:` config section (dist/options.h).
#include "hadatrain/dist/options.h"

#include "hadatrain/core/error.h"

namespace ht::dist {

// Keys that apply to one mode are rejected under the others, except at their defaults, which a config.yaml saved by a
// run records (Note [A --set that switches a choice] in core/config_reader.h); so are those of a reduce_quant choice.
// The dtypes take fp32 or f32 (Note [Float spellings] in core/spellings.h).
DistOptions read_dist_options(ConfigReader r) {
  const DistOptions def;
  DistOptions o;
  o.mode = r.get_choice("mode", DistMode::none, {{"none", DistMode::none}, {"ddp", DistMode::ddp}, {"fsdp", DistMode::fsdp}});
  o.engine = r.get_enum("engine", "auto", {"auto", "gloo", "nccl"});
  if (o.engine == "auto") o.engine.clear();
  // Whole milliseconds from 1 ms to one week: the collectives take their timeout in milliseconds (an int64).
  o.timeout_s = r.get("timeout_s", 300.0, Range::closed(0.001, 604800.0));
  const std::string mode = dist_mode_name(o.mode);
  if (o.mode == DistMode::ddp) {
    o.bucket_mb = r.get("bucket_mb", def.bucket_mb, Range::positive());
    o.reduce_in_backward = r.get("reduce_in_backward", def.reduce_in_backward);
  } else {
    const std::string ddp_only = fmt::format("applies to dist.mode ddp only, got mode {}", mode);
    r.reject_unless("bucket_mb", def.bucket_mb, ddp_only);
    r.reject_unless("reduce_in_backward", def.reduce_in_backward, ddp_only);
  }
  if (o.mode != DistMode::fsdp) {
    const std::string fsdp_only = fmt::format("applies to dist.mode fsdp only, got mode {}", mode);
    const std::string lowp = fmt::format("low-precision communication is for dist.mode fsdp, got mode {}", mode);
    r.reject_unless("fsdp_units", def.fsdp_units, fsdp_only);
    r.reject_unless("reduce_dtype", "fp32", float_spellings(), fsdp_only);
    r.reject_unless("prefetch", def.prefetch, fsdp_only);
    r.reject_unless("reshard_after_forward", def.reshard_after_forward, fsdp_only);
    r.reject_unless("gather_dtype", "fp32", float_spellings(), lowp);
    r.reject_unless("reduce_quant", "none", lowp);
    r.reject_unless("reduce_quant_block", def.reduce_quant_block, fsdp_only);
    r.reject_unless("reduce_quant_error_every", def.reduce_quant_error_every, fsdp_only);
    return o;
  }
  o.fsdp_units = r.get_list<std::string>("fsdp_units", {});
  o.prefetch = r.get("prefetch", def.prefetch);
  o.reshard_after_forward = r.get("reshard_after_forward", def.reshard_after_forward);
  o.gather_dtype = r.get_choice("gather_dtype", GatherDType::f32,
                                {{"fp32", GatherDType::f32}, {"bf16", GatherDType::bf16}, {"int8", GatherDType::int8},
                                 {"fp8", GatherDType::fp8}},
                                float_spellings());
  o.reduce_quant = r.get_choice("reduce_quant", ReduceQuant::none,
                                {{"none", ReduceQuant::none}, {"int8", ReduceQuant::int8}, {"int4", ReduceQuant::int4}});
  // A quantised reduce-scatter replaces the reduce-scatter's dtype: reduce_dtype applies to reduce_quant none only.
  if (o.reduce_quant == ReduceQuant::none)
    o.reduce_dtype = r.get_choice("reduce_dtype", DType::f32, {{"fp32", DType::f32}, {"bf16", DType::bf16}},
                                  float_spellings());
  else
    r.reject_unless("reduce_dtype", "fp32", float_spellings(),
                    fmt::format("dist.reduce_quant {} replaces the reduce-scatter's dtype: leave reduce_dtype at fp32 or "
                                "remove it", reduce_quant_name(o.reduce_quant)));
  if (o.reduce_quant == ReduceQuant::none) {  // the quantised reduce-scatter's block and error check do not apply
    const std::string quant_only = "applies to a quantised reduce-scatter only (dist.reduce_quant int8 or int4), got none";
    r.reject_unless("reduce_quant_block", def.reduce_quant_block, quant_only);
    r.reject_unless("reduce_quant_error_every", def.reduce_quant_error_every, quant_only);
    return o;
  }
  o.reduce_quant_block = r.get<int64_t>("reduce_quant_block", def.reduce_quant_block, Range::at_least(2));
  o.reduce_quant_error_every = r.get<int64_t>("reduce_quant_error_every", def.reduce_quant_error_every, Range::at_least(0));
  // The FSDP library checks the same (fsdp_lowp.cpp); here the error names the config's file and line.
  if (o.reduce_quant_block % 2 != 0)
    r.fail("reduce_quant_block", fmt::format("expected an even number of values (int4 codes pack in pairs), got {}",
                                             o.reduce_quant_block));
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
