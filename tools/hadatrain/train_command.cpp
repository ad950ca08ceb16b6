// `hadatrain train --config FILE [--set key=value]... [--resume [DIR]] [--log-level LEVEL]` and
// `hadatrain eval --config FILE --checkpoint DIR [--ema] [--json FILE]`.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::cli {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string log_level = "info";
  std::string resume;  // "" = no resume, "latest", or a checkpoint directory
  std::string checkpoint;
};

// SIGINT / SIGTERM during `train`: the first stores the signal for the training loop, which finishes its step,
// checkpoints and returns (run_training's `stop`); a second one ends the process at once with 128 + signal.
// The handler only touches a lock-free atomic and calls _exit, both async-signal-safe.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (!g_stop_signal.compare_exchange_strong(none, sig)) _exit(128 + sig);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and waits in progress go on; the loop sees the flag after its step
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

void add_common(CLI::App* app, TrainArgs& a) {
  app->add_option("-c,--config", a.config, "YAML config file, e.g. configs/fashion_mnist_resnet18.yaml")->required();
  app->add_option("--set", a.sets, "Override a config value: --set optim.lr=0.05 (repeatable)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_option("--log-level", a.log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  Command c;
  c.app = app.add_subcommand("train", "Train a model from a YAML config (see docs/config.md)");
  add_common(c.app, *args);
  c.app->add_option("--resume", args->resume,
                    "Continue a run: 'latest' (the newest checkpoint in checkpoint.dir) or a step_<N> directory")
      ->expected(0, 1)
      ->default_str("latest");
  // Note [Checks before the ranks start] in launch_command.cpp: the config as run() loads it, and a mode that
  // trains on every rank when the job has several.
  c.check_launch = [args](int world_size) {
    const train::TrainerConfig cfg = train::load_trainer_config(args->config, args->sets);
    if (world_size > 1 && cfg.dist.mode == dist::DistMode::none)
      throw Error(fmt::format("dist.mode is none but the launch starts {} ranks: every rank would train alone; set "
                              "dist.mode: ddp or fsdp (--set dist.mode=ddp)",
                              world_size));
  };
  c.run = [args] {
    ht::logging::set_level(args->log_level);
    const train::TrainerConfig cfg = train::load_trainer_config(args->config, args->sets);
    train::ResumeFrom resume;
    if (!args->resume.empty()) {
      resume.kind = args->resume == "latest" ? train::ResumeFrom::Kind::latest : train::ResumeFrom::Kind::path;
      resume.path = args->resume;
    }
    install_stop_handlers();
    const train::TrainResult r = train::run_training(cfg, resume, &g_stop_signal);
    if (r.stopped_by != 0) {
      if (r.checkpoint.empty())
        fmt::print(stderr,
                   "stopped by {} after step {}: nothing could be saved, checkpointing is off (set "
                   "checkpoint.every_steps or checkpoint.every_epochs)\n",
                   signal_name(r.stopped_by), r.steps);
      else
        fmt::print(stderr,
                   "stopped by {} after step {}; checkpoint written: {}\nto continue, run the same command with "
                   "--resume\n",
                   signal_name(r.stopped_by), r.steps, r.checkpoint);
      return 128 + r.stopped_by;
    }
    // The ranks' figures are rank 0's (shared evaluation): rank 0 alone prints them, as hadatrain eval does.
    if (r.rank != 0) return 0;
    if (r.already_complete)
      fmt::print("run already complete: the checkpoint {} is at step {}; nothing was trained. Its weights on the "
                 "test split:\n",
                 r.checkpoint, r.steps);
    const train::EvalResult& e = r.last_eval;
    if (e.total == 0)
      fmt::print("no evaluation ran; {} steps (metrics: {}/metrics.jsonl)\n", r.steps, r.out_dir);
    else if (e.has("acc"))
      fmt::print("final test accuracy: {:.2f}% (top-5 {:.2f}%) after {} steps (metrics: {}/metrics.jsonl)\n",
                 100.0 * e.number("acc"), 100.0 * e.number("top5"), r.steps, r.out_dir);
    else
      fmt::print("final {} after {} steps (metrics: {}/metrics.jsonl)\n", e.summary, r.steps, r.out_dir);
    return 0;
  };
  return c;
}

Command add_eval_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  Command c;
  c.app = app.add_subcommand("eval", "Evaluate a checkpoint on the test split of a config's dataset");
  add_common(c.app, *args);
  c.app->add_option("--checkpoint", args->checkpoint, "A step_<N> directory, or a checkpoint root (uses its latest)")
      ->required();
  auto average = std::make_shared<bool>(false);
  c.app->add_flag("--ema", *average, "Evaluate the checkpoint's weight average (ema.safetensors, config section ema)");
  auto json = std::make_shared<std::string>();
  c.app->add_option("--json", *json, "Also write the figures as JSON to this file (checkpoint, step, loss, metrics)");
  c.check_launch = [args](int) {  // Note [Checks before the ranks start] in launch_command.cpp
    train::load_trainer_config(args->config, args->sets);
  };
  c.run = [args, average, json] {
    ht::logging::set_level(args->log_level);
    const train::TrainerConfig cfg = train::load_trainer_config(args->config, args->sets);
    if (!json->empty()) io::check_output_path(*json, io::OutputKind::file, "--json");  // before the work
    const train::CheckpointEvaluation r = train::run_evaluation(cfg, args->checkpoint, *average);
    // Under a launcher the ranks shared the evaluation and each holds its figures: rank 0 alone prints and writes
    // them (Note [Sharded evaluation] in src/train/distributed.cpp).
    if (r.rank != 0) return 0;
    // r.total counts the task's evaluated units: tokens with a label for language models, else images
    fmt::print("{} ({} {}{})\n", r.summary, r.total, r.has("tokens") ? "tokens" : "samples",
               r.world_size > 1 ? fmt::format(", evaluated by {} ranks", r.world_size) : "");
    if (!json->empty()) {
      const std::filesystem::path dir = std::filesystem::path(*json).parent_path();
      if (!dir.empty()) io::create_output_directory(dir, "--json");
      io::write_file_atomic(*json, train::evaluation_json(r));
    }
    return 0;
  };
  return c;
}

}  // namespace ht::cli
