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
  const Fp8Accumulation def = carrier == Carrier::fp8 ? Fp8Accumulation::fast : Fp8Accumulation::precise;
  const auto a = r.get_choice("fp8_accumulation", def,
                              {{"precise", Fp8Accumulation::precise}, {"fast", Fp8Accumulation::fast}});
  if (a == Fp8Accumulation::fast && carrier != Carrier::fp8)
    r.fail("fp8_accumulation", "fast accumulation is for the fp8 carrier's products; this layer's carrier is int8");
  return a;
}

ScaleGranularity read_granularity(ConfigReader& r, const std::string& key, ScaleGranularity def,
                                  bool allow_token) {
  std::vector<std::pair<std::string, ScaleGranularity>> c{{"tensor", ScaleGranularity::tensor},
                                                          {"sample", ScaleGranularity::sample}};
  if (allow_token) c.push_back({"token", ScaleGranularity::token});
  return r.get_choice(key, def, c);
}

}  // namespace ht::grad
