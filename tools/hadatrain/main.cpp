// hadatrain: the command-line entry point. Subcommands live in the other files of this directory.
// Exit codes: 0 success, 1 an error reported by hadatrain ("error: ..." on stderr), 2 a command-line
// usage error (reported by CLI11).
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "commands.h"
#include "hadatrain/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"hadatrain: a C++20 deep-learning training framework (tensors, autograd, training from YAML configs)"};
  app.require_subcommand(1);
  const std::vector<ht::cli::Command> commands = {ht::cli::add_version_command(app),
                                                  ht::cli::add_train_command(app),
                                                  ht::cli::add_eval_command(app),
                                                  ht::cli::add_inspect_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors 2
  }
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const ht::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // ht::InternalError says "internal error: ..." itself
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
