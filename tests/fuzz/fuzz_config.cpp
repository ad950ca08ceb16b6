// Fuzz target: the config reader (core/config_reader.h) on a YAML text with --set overrides. Input: the YAML
// text, then a NUL byte before each override ("optim.lr=0.1"). The target reads a schema shaped like the
// trainer's (sections, typed scalars with ranges, lists, choices, a section of user keys), checks unknown keys
// and renders the resolved config: each step may reject the input with ht::Error, never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/core/error.h"

namespace {

void read_schema(ht::ConfigReader root) {
  using ht::Range;
  ht::ConfigReader run = root.child("run");
  run.get<std::string>("name", "r");
  run.get<uint64_t>("seed", 0);
  ht::ConfigReader data = root.child("data");
  data.get<int64_t>("batch_size", 32, Range::at_least(1));
  data.get<double>("scale", 1.0, Range::half_open(0.0, 1.0));
  data.get<bool>("shuffle", true);
  data.get_list<int64_t>("sizes", {1, 2}, Range::positive());
  data.get_list<std::string>("files", {});
  ht::ConfigReader model = root.child("model");
  model.get_enum("name", "mlp", {"mlp", "resnet18", "vit"});
  model.get_list<double>("hidden", {}, Range::non_negative());
  ht::ConfigReader optim = root.child("optim");
  optim.get<double>("lr", 0.1, Range::positive());
  optim.get<int>("warmup", 0, Range::non_negative());
  ht::ConfigReader layers = root.child("grad_pipeline").child("layers");
  for (const std::string& k : layers.keys()) layers.child(k).get<std::string>("name", "exact");
  root.finish();
  (void)root.resolved_yaml();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= input.size(); ++i)
    if (i == input.size() || input[i] == '\0') {
      parts.push_back(input.substr(start, i - start));
      start = i + 1;
    }
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  try {
    read_schema(ht::ConfigReader::from_string(parts.front(), "fuzz.yaml", overrides));
  } catch (const ht::Error&) {
  }
  return 0;
}
