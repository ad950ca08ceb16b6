// hadatrain: the command-line entry point. Subcommands live in the other files of this directory.
// Exit codes: 0 success, 1 an error reported by hadatrain ("error: ..." on stderr), 2 a command-line
// usage error (reported by CLI11).
#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/dist/rendezvous.h"

namespace {

// Edits (insertions, deletions, substitutions) that turn `a` into `b`.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A first argument that is no option and no subcommand: "unknown command 'trian' (commands: version, train,
// eval, inspect-grads; did you mean 'train'?)". CLI11 alone would only say that a subcommand is required.
std::string unknown_command_error(const std::string& word, const std::vector<ht::cli::Command>& commands) {
  std::string names, hint;
  std::size_t best = 3;
  for (const auto& c : commands) {
    const std::string& name = c.app->get_name();
    names += (names.empty() ? "" : ", ") + name;
    const std::size_t d = edit_distance(word, name);
    if (d < best && d < name.size()) {
      best = d;
      hint = fmt::format("; did you mean '{}'?", name);
    }
  }
  return fmt::format("unknown command '{}' (commands: {}{})", word, names, hint);
}

std::vector<ht::cli::Command> add_commands(CLI::App& app);

// Note [Commands under launch]
// launch starts its command once per rank. train, eval and comm-check join the ranks into one job (one training run,
// one shared evaluation, one check of the collectives); version only prints. The others do not join the ranks, so
// under launch they would run once per rank: convert and sweep writing the same outputs from every rank at once,
// generate, inspect-grads and inspect-checkpoint printing the same text N times, launch starting N launches of N
// ranks. launch refuses them as a usage error before any rank starts.
constexpr const char* kUnderLaunch[] = {"version", "train", "eval", "comm-check"};

// launch's check of the command line its ranks run: parsed here as each rank will parse it, with nothing run, so
// that a usage error in it ends the launch before any rank starts. Throws CLI11's ValidationError (exit code 2)
// with the rank's message; --help and the like (exit code 0) pass, for the ranks to print. Returns the parsed
// command's check_launch, which launch runs before it starts the ranks (empty after --help).
ht::cli::LaunchCheck parse_rank_command(const std::vector<std::string>& args) {
  CLI::App app;
  app.require_subcommand(1);
  const std::vector<ht::cli::Command> commands = add_commands(app);
  std::string line;
  for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
  const auto fail = [&](const std::string& message) {
    throw CLI::ValidationError(fmt::format("{} (in the command each rank runs: {}; no rank was started)", message, line));
  };
  if (!args.empty() && !args[0].empty() && args[0][0] != '-' &&
      std::none_of(commands.begin(), commands.end(), [&](const auto& c) { return c.app->get_name() == args[0]; }))
    fail(unknown_command_error(args[0], commands));
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes a vector last argument first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) fail(e.what());
    return {};
  }
  for (const auto& c : commands) {
    if (!c.app->parsed()) continue;
    const std::string name = c.app->get_name();
    if (std::none_of(std::begin(kUnderLaunch), std::end(kUnderLaunch), [&](const char* n) { return name == n; }))
      fail(fmt::format("'{}' does not join the ranks, so every rank would run it on its own; run it without launch "
                       "(launch runs train, eval, comm-check and version)",
                       name));
    return c.check_launch;
  }
  return {};
}

std::vector<ht::cli::Command> add_commands(CLI::App& app) {
  return {ht::cli::add_version_command(app),  ht::cli::add_train_command(app),
          ht::cli::add_eval_command(app),     ht::cli::add_inspect_command(app),
          ht::cli::add_inspect_checkpoint_command(app),
          ht::cli::add_generate_command(app), ht::cli::add_convert_command(app),
          ht::cli::add_sweep_command(app),    ht::cli::add_launch_command(app, parse_rank_command),
          ht::cli::add_comm_check_command(app)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hadatrain: a C++20 deep-learning training framework (tensors, autograd, training from YAML configs)"};
  app.require_subcommand(1);
  const std::vector<ht::cli::Command> commands = add_commands(app);
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(commands.begin(), commands.end(), [&](const auto& c) { return c.app->get_name() == argv[1]; })) {
    fmt::print(stderr, "error: {}\nRun with --help for more information.\n", unknown_command_error(argv[1], commands));
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors 2
  }
  // Note [Log on stderr] in core/logging.h
  spdlog::set_default_logger(spdlog::stderr_color_mt("hadatrain"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  try {
    // A rank of a job (torchrun, Slurm or launch variables) tags its lines, and only rank 0 logs the progress (Note
    // [Logs of several ranks] in core/logging.h); not a launcher, which may run as one task per node under srun.
    // Variables that do not describe a job are reported by the command that joins the ranks, with the variable named.
    const bool launcher = std::any_of(commands.begin(), commands.end(), [](const auto& c) {
      return c.app->parsed() && c.app->get_name() == "launch";
    });
    try {
      const ht::dist::DistEnv env = ht::dist::dist_env_from_environment();
      if (!launcher) ht::logging::set_rank(env.rank, env.world_size);
    } catch (const ht::Error&) {
    }
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
