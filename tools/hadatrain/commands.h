// The hadatrain subcommands. Each file registers one subcommand's options on the CLI11 app and returns the
// function main() runs when that subcommand was chosen; library errors propagate to main().
#pragma once
#include <functional>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ht::cli {

struct Command {
  CLI::App* app = nullptr;   // the subcommand, to ask whether it was selected
  std::function<int()> run;  // returns the process exit code
};

// The check of --log-level: a level logging::set_level accepts, so a wrong one is a usage error (exit 2).
inline CLI::Validator log_level_check() {
  return CLI::Validator(
      [](std::string& level) -> std::string {
        if (level == "off" || spdlog::level::from_str(level) != spdlog::level::off) return "";
        return fmt::format("unknown log level '{}': expected trace, debug, info, warn, error or off", level);
      },
      "LEVEL");
}

// A numeric option's value against its range, for the checks a subcommand runs once its options are parsed (its
// parse_complete_callback): outside [lo, hi] it throws CLI11's ValidationError, a usage error (exit 2) naming the
// option and the value, "--elements: must be an integer from 1 to 1099511627776, got 0". `why`, when given, follows
// the range in parentheses. NaN is outside every range.
template <class T>
void check_option_range(const std::string& option, T value, T lo, T hi, const std::string& why = {}) {
  if (value >= lo && value <= hi) return;
  throw CLI::ValidationError(option, fmt::format("must be {} from {} to {}{}, got {}",
                                                 std::is_integral_v<T> ? "an integer" : "a number", lo, hi,
                                                 why.empty() ? "" : " (" + why + ")", value));
}

Command add_version_command(CLI::App& app);  // version_command.cpp
Command add_train_command(CLI::App& app);    // train_command.cpp
Command add_eval_command(CLI::App& app);     // train_command.cpp
Command add_inspect_command(CLI::App& app);  // inspect_command.cpp
Command add_generate_command(CLI::App& app);  // generate_command.cpp
Command add_convert_command(CLI::App& app);   // convert_command.cpp
Command add_sweep_command(CLI::App& app);    // sweep_command.cpp
Command add_launch_command(CLI::App& app);      // launch_command.cpp
Command add_comm_check_command(CLI::App& app);  // launch_command.cpp

}  // namespace ht::cli
