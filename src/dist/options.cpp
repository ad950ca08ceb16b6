// The `dist:` config section (dist/options.h).
#include "hadatrain/dist/options.h"

namespace ht::dist {

DistOptions read_dist_options(ConfigReader r) {
  DistOptions o;
  o.mode = r.get_choice("mode", DistMode::none, {{"none", DistMode::none}, {"ddp", DistMode::ddp}, {"fsdp", DistMode::fsdp}});
  o.engine = r.get_enum("engine", "auto", {"auto", "gloo", "nccl"});
  if (o.engine == "auto") o.engine.clear();
  o.timeout_s = r.get("timeout_s", 300.0, Range::positive());
  o.bucket_mb = r.get("bucket_mb", 25.0, Range::positive());
  o.fsdp_units = r.get_list<std::string>("fsdp_units", {});
  o.reduce_dtype = r.get_enum("reduce_dtype", "f32", {"f32", "bf16"});
  o.prefetch = r.get("prefetch", true);
  o.reshard_after_forward = r.get("reshard_after_forward", true);
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
