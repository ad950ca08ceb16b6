// The hadatrain subcommands. Each file registers one subcommand's options on the CLI11 app and returns the
// function main() runs when that subcommand was chosen; library errors propagate to main().
#pragma once
#include <functional>

#include <CLI/CLI.hpp>

namespace ht::cli {

struct Command {
  CLI::App* app = nullptr;   // the subcommand, to ask whether it was selected
  std::function<int()> run;  // returns the process exit code
};

Command add_version_command(CLI::App& app);  // version_command.cpp
Command add_train_command(CLI::App& app);    // train_command.cpp
Command add_eval_command(CLI::App& app);     // train_command.cpp
Command add_inspect_command(CLI::App& app);  // inspect_command.cpp

}  // namespace ht::cli
