// The gradient-pipeline registry: every pipeline registers, from its own files, its name, its options reader,
// its constructor and its description. The config reader, make_pipeline and describe() look a name up here,
// so adding a pipeline edits no central file.
//
//   struct ScaleOptions { double factor = 2.0; };
//   const grad::PipelineRegistrar scaled{grad::PipelineKind<ScaleOptions>{
//       .name = "scaled",
//       .read_options = [](ConfigReader& r) { return ScaleOptions{r.get("factor", 2.0)}; },
//       .make = [](const ScaleOptions& o) { return std::make_shared<ScaledPipeline>(o); },
//       .describe = [](const ScaleOptions& o) { return fmt::format("scaled (x{})", o.factor); }}};
//
// A built-in pipeline (one in src/grad/, compiled into hadatrain_core) declares itself in its own file instead:
//
//   namespace ht::grad {
//   HT_BUILTIN_PIPELINE(scaled) {
//     return erase(PipelineKind<ScaleOptions>{.name = "scaled", ...});
//   }
//   }
//
// Note [Registration and static linking]
// hadatrain_core is a static library: the linker only takes an object file from it when something already
// linked refers to one of its symbols, so a registrar object alone in a pipeline's .cpp inside the library
// would be dropped with its file. A built-in pipeline therefore defines a function,
// `ht::grad::builtin_registration_<name>()`, through HT_BUILTIN_PIPELINE(<name>) written at the start of a
// line in its own src/grad/*.cpp. At configure time src/CMakeLists.txt scans src/grad/*.cpp for that marker
// (every scanned file is a configure dependency, so adding or removing a marker re-runs the scan) and
// generates builtin_pipelines.cpp in the build tree: one call per marker, names sorted. The registry calls
// that generated list once, the first time it is used, and so refers to every built-in's function, which
// links each built-in's file; a new built-in edits no central file. The marker's argument is the name configs
// use (the registry checks that the registration carries it), so built-ins come first in name order.
// A pipeline outside the library (a program's or a test's own file) is linked because the executable contains
// it: it registers with a PipelineRegistrar at namespace scope, or calls register_pipeline before it reads a
// config, and edits nothing of the library.
//
// Options are read through core/'s ConfigReader (only declared here), the one strict YAML reader, so that
// every pipeline's errors name the file, line and key as the rest of the config's do.
#pragma once
#include <any>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/grad/pipeline.h"

namespace ht {
class ConfigReader;
}

namespace ht::grad {

// The options type of a pipeline that has none.
struct NoOptions {};

// A pipeline as its own file describes it, with its options type O (default-constructible: the defaults).
template <class O>
struct PipelineKind {
  std::string name;  // as configs write it: `grad_pipeline: {default: {name: NAME, ...}}`
  // The pipeline's own keys of a config entry (`name` and `recompute_output` are read already). Problems go
  // through ConfigReader::fail, so they name the file, line and key. Null: the pipeline has no options.
  std::function<O(ConfigReader&)> read_options;
  // A new pipeline object for one layer (a stateful pipeline keeps per-layer state in it).
  std::function<std::shared_ptr<Pipeline>(const O&)> make;
  // The one line the logs and inspect-grads show ("hlq (g_x: 4 bit, ...)"). Null: the name.
  std::function<std::string(const O&)> describe;
};

// A registered pipeline, its options held as std::any (PipelineSpec::options).
struct PipelineRegistration {
  std::string name;
  std::function<std::any(ConfigReader&)> read_options;
  std::function<std::shared_ptr<Pipeline>(const std::any&)> make;
  std::function<std::string(const std::any&)> describe;
};

// The type-erased form of `kind`: empty options read as O's defaults; options of another type are an error.
template <class O>
PipelineRegistration erase(PipelineKind<O> kind) {
  PipelineRegistration r;
  r.name = kind.name;
  auto options = [name = kind.name](const std::any& a) -> const O& { return options_of<O>(a, name); };
  r.read_options = [read = std::move(kind.read_options)](ConfigReader& reader) -> std::any {
    return read ? read(reader) : O{};
  };
  r.make = [options, make = std::move(kind.make)](const std::any& a) { return make(options(a)); };
  r.describe = [options, name = kind.name, describe = std::move(kind.describe)](const std::any& a) {
    return describe ? describe(options(a)) : name;
  };
  return r;
}

// Adds a pipeline. Throws when the name is empty, already registered, or `make` is missing.
void register_pipeline(PipelineRegistration registration);
template <class O>
void register_pipeline(PipelineKind<O> kind) {
  register_pipeline(erase(std::move(kind)));
}

// Registers at static initialisation, from a namespace-scope object in the pipeline's own file (Note
// [Registration and static linking]: that file must be linked, as a program's or a test's own file is).
struct PipelineRegistrar {
  template <class O>
  explicit PipelineRegistrar(PipelineKind<O> kind) {
    register_pipeline(std::move(kind));
  }
};

// Defines the registration function of the built-in pipeline `name` (Note [Registration and static linking]);
// the function body follows. Write it at the start of a line, inside namespace ht::grad, in a src/grad/*.cpp.
#define HT_BUILTIN_PIPELINE(name) PipelineRegistration builtin_registration_##name()

// The registered names, built-ins first in name order (exact, hlq, lbp_wht, luq), then in registration order.
std::vector<std::string> registered_pipelines();
// The registration of `name`; throws for an unknown name, listing the registered ones.
PipelineRegistration find_pipeline(const std::string& name);

}  // namespace ht::grad
