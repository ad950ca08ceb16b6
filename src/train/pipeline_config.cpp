// Reading the `grad_pipeline` section into grad::PipelineConfig; every option of every pipeline with its
// default (documented in docs/config.md).
#include "hadatrain/train/pipeline_config.h"

#include <fmt/format.h>

namespace ht::train {
namespace {

grad::ScaleGranularity read_granularity(ConfigReader& r, const std::string& key, grad::ScaleGranularity def,
                                        bool allow_token) {
  std::vector<std::pair<std::string, grad::ScaleGranularity>> c{{"tensor", grad::ScaleGranularity::tensor},
                                                                {"sample", grad::ScaleGranularity::sample}};
  if (allow_token) c.push_back({"token", grad::ScaleGranularity::token});
  return r.get_choice(key, def, c);
}

grad::WeightQuant read_weight_quant(ConfigReader& r, const std::string& key) {
  return r.get_choice(key, grad::WeightQuant::sawb,
                      {{"sawb", grad::WeightQuant::sawb},
                       {"absmax", grad::WeightQuant::absmax},
                       {"absmax_sr", grad::WeightQuant::absmax_sr}});
}

int read_bits(ConfigReader& r, const std::string& key, int def, const std::vector<int>& allowed) {
  const int v = r.get<int>(key, def);
  for (int a : allowed)
    if (v == a) return v;
  std::string list;
  for (int a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
  r.fail(key, fmt::format("expected one of {}, got {}", list, v));
}

grad::HlqOptions read_hlq(ConfigReader& r) {
  grad::HlqOptions o;
  o.gx_bits = read_bits(r, "gx_bits", 4, {0, 2, 3, 4, 5, 6, 7, 8});
  o.block = r.get<int64_t>("block", 16, Range::at_least(1));
  if ((o.block & (o.block - 1)) != 0) r.fail("block", fmt::format("expected a power of two, got {}", o.block));
  o.gy_scale = read_granularity(r, "gy_scale", grad::ScaleGranularity::token, true);
  o.w_quant = read_weight_quant(r, "w_quant");
  o.carrier = r.get_choice("carrier", grad::Carrier::fp8, {{"fp8", grad::Carrier::fp8}, {"int8", grad::Carrier::int8}});
  o.gw_bits = read_bits(r, "gw_bits", 8, {0, 2, 3, 4, 5, 6, 7, 8});
  o.gw_scale = read_granularity(r, "gw_scale", grad::ScaleGranularity::tensor, false);
  const std::string rank = r.get("rank", "pct");
  if (rank == "pct") {
    o.rank.kind = grad::HlaRank::Kind::percentile;
  } else if (rank == "full") {
    o.rank.kind = grad::HlaRank::Kind::full;
  } else if (rank == "rows") {
    o.rank.kind = grad::HlaRank::Kind::rows;
  } else {
    r.fail("rank", fmt::format("expected pct, full or rows, got '{}'", rank));
  }
  o.rank.pct = r.get("rank_pct", 50.0, Range::positive());
  if (o.rank.pct > 50.0)
    r.fail("rank_pct", fmt::format("must be in (0, 50] (above 50 the reference rule duplicates rows), got {}",
                                   o.rank.pct));
  o.rank.rows = r.get<int64_t>("rank_rows", 1, Range::at_least(1));
  o.fallback = r.get_choice("fallback", grad::HlaFallback::ref,
                            {{"ref", grad::HlaFallback::ref},
                             {"split_extra", grad::HlaFallback::split_extra},
                             {"pad", grad::HlaFallback::pad}});
  o.extra_tokens = r.get<int64_t>("extra_tokens", 1, Range::at_least(1));
  o.pad_to = r.get<int64_t>("pad_to", 16, Range::at_least(2));
  if ((o.pad_to & (o.pad_to - 1)) != 0) r.fail("pad_to", fmt::format("expected a power of two, got {}", o.pad_to));
  o.x_scale = r.get_choice("x_quant", grad::ScaleRule::sawb, {{"sawb", grad::ScaleRule::sawb}, {"absmax", grad::ScaleRule::absmax}});
  o.acbp_bits = read_bits(r, "acbp_bits", o.gw_bits == 0 ? 0 : 8, {0, 4, 8});
  if (o.gw_bits == 0 && o.acbp_bits != 0)
    r.fail("acbp_bits", "a compressed saved activation needs a quantised g_w path: use acbp_bits 0 with gw_bits 0");
  o.acbp_conv = r.get_choice("acbp_conv", grad::AcbpConv::columns,
                             {{"columns", grad::AcbpConv::columns}, {"input_map", grad::AcbpConv::input_map}});
  o.conv_gx = r.get_choice("conv_gx", grad::ConvGx::dgrad,
                           {{"columns", grad::ConvGx::columns}, {"dgrad", grad::ConvGx::dgrad}});
  o.conv_gw = r.get_choice("conv_gw", grad::ConvGw::wgrad,
                           {{"columns", grad::ConvGw::columns}, {"wgrad", grad::ConvGw::wgrad}});
  o.acbp_share = r.get("acbp_share", true);
  o.acbp_rebuild = r.get("acbp_rebuild", true);
  return o;
}

}  // namespace

grad::PipelineSpec read_pipeline_spec(ConfigReader r) {
  grad::PipelineSpec s;
  s.name = r.get_enum("name", "exact", {"exact", "hlq", "lbp_wht", "luq"});
  s.recompute_output = r.get("recompute_output", false);
  if (s.name == "hlq") {
    s.hlq = read_hlq(r);
  } else if (s.name == "lbp_wht") {
    s.lbp_wht.order = r.get<int64_t>("order", 6, Range::closed(1, 15));
    s.lbp_wht.extra_tokens = r.get<int64_t>("extra_tokens", -1, Range::at_least(-1));
  } else if (s.name == "luq") {
    s.luq.bits = read_bits(r, "bits", 4, {2, 3, 4});
    s.luq.x_bits = read_bits(r, "x_bits", 4, {2, 3, 4, 5});
    s.luq.w_quant = read_weight_quant(r, "w_quant");
  }
  return s;
}

grad::PipelineConfig read_grad_pipeline(ConfigReader r, uint64_t seed) {
  grad::PipelineConfig c;
  c.seed = seed;
  c.default_spec = read_pipeline_spec(r.child("default"));
  ConfigReader layers = r.child("layers");
  for (const std::string& pattern : layers.keys()) c.overrides.emplace_back(pattern, read_pipeline_spec(layers.child(pattern)));
  return c;
}

}  // namespace ht::train
