// The hadatrain subcommands. Each file registers one subcommand's options on the CLI11 app and returns the
// function main() runs when that subcommand was chosen; library errors propagate to main().
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "hadatrain/core/spellings.h"

namespace ht::cli {

// What `launch` checks, before it starts any rank, of the command its ranks run (Note [Checks before the ranks
// start] in launch_command.cpp): throws ht::Error for what every rank would fail on. `world_size` is the job's
// rank count.
using LaunchCheck = std::function<void(int world_size)>;

struct Command {
  CLI::App* app = nullptr;   // the subcommand, to ask whether it was selected
  std::function<int()> run;  // returns the process exit code
  LaunchCheck check_launch;  // empty: nothing beyond the command line (train, eval: the config)
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

// A numeric option's value against a range that depends on other options or comes with a reason (launch's), for
// the checks a subcommand runs once its options are parsed (its parse_complete_callback; a plain fixed range is a
// validator below, checked on the option's text): outside [lo, hi] it throws CLI11's ValidationError, a usage error (exit 2) naming the
// option and the value, "--elements: must be an integer from 1 to 1099511627776, got 0". `why`, when given, follows
// the range in parentheses. NaN is outside every range.
template <class T>
void check_option_range(const std::string& option, T value, T lo, T hi, const std::string& why = {}) {
  if (value >= lo && value <= hi) return;
  throw CLI::ValidationError(option, fmt::format("must be {} from {} to {}{}, got {}",
                                                 std::is_integral_v<T> ? "an integer" : "a number", lo, hi,
                                                 why.empty() ? "" : " (" + why + ")", value));
}

// Checks of numeric flags, run on the text before CLI11 converts it, so that a bad value is a usage error (exit 2)
// "--flag: must be <range>, got <text>": the whole text must be the number (no trailing characters), and
// NaN, infinities and out-of-range values are refused, which CLI11's own conversion and range checks let through
// (NaN compares false with every bound; "-1" converts to a large unsigned value).
// A real number that std::strtod reads in full, is finite and satisfies `ok`; `range` describes it ("a number in
// (0, 1]").
inline CLI::Validator number_check(std::string range, std::function<bool(double)> ok) {
  return CLI::Validator(
      [range, ok](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double x = std::strtod(v.c_str(), &end);
        const bool read = !v.empty() && *end == '\0' && errno != ERANGE;
        return read && std::isfinite(x) && ok(x) ? "" : "must be " + range + ", got " + v;
      },
      range);
}
// A decimal integer in [lo, hi].
inline CLI::Validator integer_check(int64_t lo, int64_t hi) {
  const std::string range = fmt::format("an integer from {} to {}", lo, hi);
  return CLI::Validator(
      [range, lo, hi](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        const bool read = !v.empty() && *end == '\0' && errno != ERANGE;
        return read && x >= lo && x <= hi ? "" : "must be " + range + ", got " + v;
      },
      range);
}
// One of `allowed`, or an alias of one of them in `spellings` (core/spellings.h), which the option then holds as the
// name it stands for (a transform: add it with ->transform): "--precision: must be fp32 (or f32) or bf16, got fp16".
inline CLI::Validator spelling_check(std::vector<std::string> allowed, Spellings spellings) {
  std::string words;
  for (std::size_t i = 0; i < allowed.size(); ++i)
    words += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + with_aliases(allowed[i], spellings);
  return CLI::Validator(
      [allowed, spellings, words](std::string& v) -> std::string {
        const std::string name = canonical_spelling(v, spellings);
        if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) return "must be " + words + ", got " + v;
        v = name;
        return "";
      },
      words);
}
// One of `allowed`: "--device: must be cpu or cuda, got gpu".
inline CLI::Validator choice_check(std::vector<std::string> allowed) { return spelling_check(std::move(allowed), {}); }
// A decimal integer from 0 to 2^64 - 1 (no sign).
inline CLI::Validator unsigned_check() {
  const std::string range = fmt::format("an integer from 0 to {}", std::numeric_limits<uint64_t>::max());
  return CLI::Validator(
      [range](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        std::strtoull(v.c_str(), &end, 10);
        const bool digits = !v.empty() && std::isdigit(static_cast<unsigned char>(v[0]));
        return digits && *end == '\0' && errno != ERANGE ? "" : "must be " + range + ", got " + v;
      },
      range);
}

Command add_version_command(CLI::App& app);  // version_command.cpp
Command add_train_command(CLI::App& app);    // train_command.cpp
Command add_eval_command(CLI::App& app);     // train_command.cpp
Command add_inspect_command(CLI::App& app);  // inspect_command.cpp
Command add_inspect_checkpoint_command(CLI::App& app);  // inspect_checkpoint_command.cpp
Command add_generate_command(CLI::App& app);  // generate_command.cpp
Command add_convert_command(CLI::App& app);   // convert_command.cpp
Command add_sweep_command(CLI::App& app);    // sweep_command.cpp
// launch_command.cpp. `parse_rank_command` parses the command line each rank will run (the arguments after `--`)
// as a rank would, without running it, throws CLI11's ParseError for a usage error in it and returns that command's
// check_launch (main.cpp).
Command add_launch_command(CLI::App& app,
                           std::function<LaunchCheck(const std::vector<std::string>&)> parse_rank_command);
Command add_comm_check_command(CLI::App& app);  // launch_command.cpp

}  // namespace ht::cli
