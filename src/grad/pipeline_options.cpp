// Config readers of option values shared by the built-in pipelines (pipeline_options.h).
#include "pipeline_options.h"

#include <fmt/format.h>

namespace ht::grad {

int read_bits(ConfigReader& r, const std::string& key, int def, const std::vector<int>& allowed) {
  const int v = r.get<int>(key, def);
  for (int a : allowed)
    if (v == a) return v;
  std::string list;
  for (int a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
  r.fail(key, fmt::format("expected one of {}, got {}", list, v));
}

WeightQuant read_weight_quant(ConfigReader& r, const std::string& key) {
  return r.get_choice(key, WeightQuant::sawb,
                      {{"sawb", WeightQuant::sawb}, {"absmax", WeightQuant::absmax}, {"absmax_sr", WeightQuant::absmax_sr}});
}

Fp8Accumulation read_fp8_accumulation(ConfigReader& r, Carrier carrier) {
  if (carrier != Carrier::fp8) {
    r.reject_unless("fp8_accumulation", "precise",
                    "fast accumulation is for the fp8 carrier's products; this layer's carrier is int8");
    return Fp8Accumulation::precise;
  }
  return r.get_choice("fp8_accumulation", Fp8Accumulation::fast,
                      {{"precise", Fp8Accumulation::precise}, {"fast", Fp8Accumulation::fast}});
}

ScaleGranularity read_granularity(ConfigReader& r, const std::string& key, ScaleGranularity def,
                                  bool allow_token) {
  std::vector<std::pair<std::string, ScaleGranularity>> c{{"tensor", ScaleGranularity::tensor},
                                                          {"sample", ScaleGranularity::sample}};
  if (allow_token) c.push_back({"token", ScaleGranularity::token});
  return r.get_choice(key, def, c);
}

}  // namespace ht::grad
