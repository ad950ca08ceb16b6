// hadatrain: the command-line entry point.
#include <CLI/CLI.hpp>

#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"hadatrain: training with Hadamard-domain gradient pipelines"};
  app.require_subcommand(1);
  auto* version = app.add_subcommand("version", "Print the version and build configuration");
  CLI11_PARSE(app, argc, argv);
  if (*version) fmt::print("hadatrain {}\n", HADATRAIN_VERSION);
  return 0;
}
