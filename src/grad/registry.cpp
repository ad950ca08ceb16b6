// The gradient-pipeline registry (grad/registry.h): the registered pipelines by name, make_pipeline and
// describe() through them.
#include "hadatrain/grad/registry.h"

#include <mutex>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "builtin_pipelines.h"

namespace ht::grad {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<PipelineRegistration> entries;  // built-ins first, then in registration order

  void add(PipelineRegistration r) {
    HT_CHECK(!r.name.empty(), "register_pipeline: a gradient pipeline needs a name");
    HT_CHECK(r.make != nullptr, "register_pipeline: gradient pipeline '{}' has no constructor (make)", r.name);
    std::lock_guard<std::mutex> lock(mu);
    for (const PipelineRegistration& e : entries)
      HT_CHECK(e.name != r.name, "register_pipeline: a gradient pipeline named '{}' is already registered", r.name);
    entries.push_back(std::move(r));
  }
};

// The one registry, with the built-ins added the first time anything asks for it. A function-local static, so
// that registrars of other translation units may run in any order of static initialisation.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: registrars and late lookups may outlive static destruction
    for (const BuiltinPipeline& b : builtin_pipelines()) {
      PipelineRegistration r = b.registration();
      HT_CHECK(r.name == b.name, "built-in gradient pipeline HT_BUILTIN_PIPELINE({}) registers the name '{}' (the "
               "marker's argument must be the name configs use)", b.name, r.name);
      reg->add(std::move(r));
    }
    return reg;
  }();
  return *r;
}

// "a, b or c"
std::string either(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

}  // namespace

void throw_options_mismatch(const std::string& name) {
  HT_FAIL("gradient pipeline '{}': the spec holds options of another pipeline's type (set PipelineSpec::options "
          "to the options type that '{}' registered, or leave it empty for its defaults)",
          name, name);
}

void register_pipeline(PipelineRegistration registration) { registry().add(std::move(registration)); }

std::vector<std::string> registered_pipelines() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const PipelineRegistration& e : r.entries) names.push_back(e.name);
  return names;
}

PipelineRegistration find_pipeline(const std::string& name) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (const PipelineRegistration& e : r.entries)
      if (e.name == name) return e;
  }
  HT_FAIL("unknown gradient pipeline '{}' (expected {})", name, either(registered_pipelines()));
}

std::shared_ptr<Pipeline> make_pipeline(const PipelineSpec& spec) {
  std::shared_ptr<Pipeline> p = find_pipeline(spec.name).make(spec.options);
  HT_CHECK(p != nullptr, "gradient pipeline '{}': its constructor returned no pipeline", spec.name);
  return p;
}

std::string describe(const PipelineSpec& spec) {
  const std::string d = find_pipeline(spec.name).describe(spec.options);
  return spec.recompute_output ? d + ", output recomputed in backward" : d;
}

}  // namespace ht::grad
