// Internal to src/grad: the list of built-in gradient pipelines that the registry adds on its first use. The
// list is generated at configure time (builtin_pipelines.cpp in the build tree) from the HT_BUILTIN_PIPELINE
// markers in src/grad/*.cpp; see Note [Registration and static linking] in grad/registry.h.
#pragma once
#include <vector>

#include "hadatrain/grad/registry.h"

namespace ht::grad {

// A built-in pipeline: the name in its HT_BUILTIN_PIPELINE marker and the function the marker defines.
struct BuiltinPipeline {
  const char* name;
  PipelineRegistration (*registration)();
};

// Every built-in, names sorted.
std::vector<BuiltinPipeline> builtin_pipelines();

}  // namespace ht::grad
