// The `hlq` pipeline's registration (grad/registry.h): its config keys with their defaults (docs/config.md) and
// its one-line description. The pipeline itself is in pipeline_hlq.cpp.
#include <fmt/format.h>

#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/grad/registry.h"
#include "pipeline_options.h"

namespace ht::grad {
namespace {

HlqOptions read_hlq(ConfigReader& r) {
  HlqOptions o;
  o.gx_bits = read_bits(r, "gx_bits", 4, {0, 2, 3, 4, 5, 6, 7, 8});
  o.block = r.get<int64_t>("block", 16, Range::at_least(1));
  if ((o.block & (o.block - 1)) != 0) r.fail("block", fmt::format("expected a power of two, got {}", o.block));
  o.gy_scale = read_granularity(r, "gy_scale", ScaleGranularity::token, true);
  o.w_quant = read_weight_quant(r, "w_quant");
  o.carrier = r.get_choice("carrier", Carrier::fp8, {{"fp8", Carrier::fp8}, {"int8", Carrier::int8}});
  o.gw_bits = read_bits(r, "gw_bits", 8, {0, 2, 3, 4, 5, 6, 7, 8});
  o.gw_scale = read_granularity(r, "gw_scale", ScaleGranularity::tensor, false);
  const std::string rank = r.get("rank", "pct");
  if (rank == "pct") {
    o.rank.kind = HlaRank::Kind::percentile;
  } else if (rank == "full") {
    o.rank.kind = HlaRank::Kind::full;
  } else if (rank == "rows") {
    o.rank.kind = HlaRank::Kind::rows;
  } else {
    r.fail("rank", fmt::format("expected pct, full or rows, got '{}'", rank));
  }
  // rank_pct is rank pct's and rank_rows rank rows'; under another rank each is refused, except at the default a
  // saved config records (Note [A --set that switches a choice] in core/config_reader.h).
  if (o.rank.kind == HlaRank::Kind::percentile) {
    o.rank.pct = r.get("rank_pct", 50.0, Range::positive());
    if (o.rank.pct > 50.0)
      r.fail("rank_pct", fmt::format("must be in (0, 50] (above 50 the reference rule duplicates rows), got {}",
                                     o.rank.pct));
  } else {
    r.reject_unless("rank_pct", 50.0, fmt::format("applies to rank pct only, got rank {}", rank));
  }
  if (o.rank.kind == HlaRank::Kind::rows)
    o.rank.rows = r.get<int64_t>("rank_rows", 1, Range::at_least(1));
  else
    r.reject_unless("rank_rows", int64_t{1}, fmt::format("applies to rank rows only, got rank {}", rank));
  o.fallback = r.get_choice("fallback", HlaFallback::ref,
                            {{"ref", HlaFallback::ref}, {"split_extra", HlaFallback::split_extra}, {"pad", HlaFallback::pad}});
  o.extra_tokens = r.get<int64_t>("extra_tokens", 1, Range::at_least(1));
  o.pad_to = r.get<int64_t>("pad_to", 16, Range::at_least(2));
  if ((o.pad_to & (o.pad_to - 1)) != 0) r.fail("pad_to", fmt::format("expected a power of two, got {}", o.pad_to));
  o.x_scale = r.get_choice("x_quant", ScaleRule::sawb, {{"sawb", ScaleRule::sawb}, {"absmax", ScaleRule::absmax}});
  // Without a quantised g_w (gw_bits 0) nothing compressed is saved: acbp_bits does not apply, and 0, what a saved
  // config records, passes (Note [A --set that switches a choice] in core/config_reader.h).
  if (o.gw_bits == 0) {
    r.reject_unless("acbp_bits", 0, "a compressed saved activation needs a quantised g_w path: use acbp_bits 0 with "
                                    "gw_bits 0");
    o.acbp_bits = 0;
  } else {
    o.acbp_bits = read_bits(r, "acbp_bits", 8, {0, 4, 8});
  }
  o.acbp_conv = r.get_choice("acbp_conv", AcbpConv::columns,
                             {{"columns", AcbpConv::columns}, {"input_map", AcbpConv::input_map}});
  o.conv_gx = r.get_choice("conv_gx", ConvGx::columns,
                            {{"columns", ConvGx::columns}, {"dgrad_simulated", ConvGx::dgrad_simulated}});
  o.conv_gw = r.get_choice("conv_gw", ConvGw::columns,
                            {{"columns", ConvGw::columns}, {"wgrad_simulated", ConvGw::wgrad_simulated}});
  o.acbp_share = r.get("acbp_share", true);
  o.acbp_rebuild = r.get("acbp_rebuild", true);
  o.overlap = r.get("overlap", true);
  o.fp8_accumulation = read_fp8_accumulation(r, o.carrier);
  return o;
}

std::string describe_hlq(const HlqOptions& o) {
  static const char* gran[] = {"tensor", "sample", "token"};
  static const char* wq[] = {"sawb", "absmax", "absmax_sr"};
  static const char* fb[] = {"ref", "split_extra", "pad"};
  const std::string rank = o.rank.kind == HlaRank::Kind::full   ? "full"
                           : o.rank.kind == HlaRank::Kind::rows ? fmt::format("{} rows", o.rank.rows)
                                                                : fmt::format("pct {}", o.rank.pct);
  return fmt::format("hlq (g_x: {} bit, T {}, g_y scale {}, W {}, {} carrier; g_w: {} bit, rank {}, fallback {}, "
                     "ACBP {} bit{}{}{}{}{}{}{})",
                     o.gx_bits, o.block, gran[static_cast<int>(o.gy_scale)], wq[static_cast<int>(o.w_quant)],
                     o.carrier == Carrier::fp8 ? "fp8" : "int8", o.gw_bits, rank, fb[static_cast<int>(o.fallback)],
                     o.acbp_bits, o.acbp_conv == AcbpConv::input_map ? ", conv input map" : "",
                     o.conv_gx == ConvGx::dgrad_simulated ? ", conv g_x simulated (dgrad over dequantised values)"
                                                          : "",
                     o.conv_gw == ConvGw::wgrad_simulated ? ", conv g_w simulated (wgrad over the unquantised image)"
                                                          : "",
                     o.acbp_share ? "" : ", never shared", o.acbp_rebuild ? "" : ", never rebuilt",
                     o.overlap ? "" : ", one stream",
                     o.carrier == Carrier::fp8 && o.fp8_accumulation == Fp8Accumulation::precise
                         ? ", precise fp8 accumulation"
                         : "");
}

}  // namespace

// Called once by the registry (Note [Registration and static linking] in grad/registry.h).
HT_BUILTIN_PIPELINE(hlq) {
  return erase(PipelineKind<HlqOptions>{.name = "hlq", .read_options = read_hlq, .make = make_hlq_pipeline,
                                        .describe = describe_hlq});
}

}  // namespace ht::grad
