// Internal to src/grad: config readers of option values that several built-in pipelines share. Errors go
// through ConfigReader::fail (file, line and key).
#pragma once
#include <string>
#include <vector>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline_hlq.h"  // Carrier, Fp8Accumulation
#include "hadatrain/grad/quant.h"

namespace ht::grad {

// An integer bit width that must be one of `allowed`.
int read_bits(ConfigReader& r, const std::string& key, int def, const std::vector<int>& allowed);
// sawb | absmax | absmax_sr, sawb by default.
WeightQuant read_weight_quant(ConfigReader& r, const std::string& key);
// `fp8_accumulation`: fast (the default of HLQ's and HALO's fp8 products) | precise, for the fp8 carrier. With the
// int8 carrier the key does not apply: precise, the value a saved config records, passes, another is an error that
// names the key (Note [A --set that switches a choice] in core/config_reader.h).
Fp8Accumulation read_fp8_accumulation(ConfigReader& r, Carrier carrier);
// tensor | sample (| token when allow_token).
ScaleGranularity read_granularity(ConfigReader& r, const std::string& key, ScaleGranularity def,
                                  bool allow_token);

}  // namespace ht::grad
