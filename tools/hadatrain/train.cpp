// `hadatrain train --config FILE [--set key=value]... [--log-level LEVEL]`: runs the classifier job.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/train/classifier_job.h"
#include "hadatrain/train/job_config.h"

namespace ht::cli {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string log_level = "info";
};

}  // namespace

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  Command c;
  c.app = app.add_subcommand("train", "Train a model from a YAML config (see docs/config.md)");
  c.app->add_option("-c,--config", args->config, "YAML config file, e.g. configs/fashion_mnist_mlp.yaml")->required();
  c.app->add_option("--set", args->sets, "Override a config value: --set optim.lr=0.05 (repeatable)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.app->add_option("--log-level", args->log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  c.run = [args] {
    ht::logging::set_level(args->log_level);
    const train::ClassifierJobConfig cfg = train::load_classifier_job_config(args->config, args->sets);
    const train::ClassifierJobResult r = train::run_classifier_job(cfg);
    fmt::print("final test accuracy: {:.2f}% after {} steps (metrics: {}/metrics.jsonl)\n", 100.0 * r.test_accuracy,
               r.steps, r.out_dir);
    return 0;
  };
  return c;
}

}  // namespace ht::cli
