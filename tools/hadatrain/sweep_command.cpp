// `hadatrain sweep --plan FILE [--resume] [--dry-run] [--out-dir DIR] [--only GLOB]... [--set [STAGE:]k=v]...`: runs a plan's grid of training runs
// (configs x overrides), skipping finished runs, and writes the results table and curves (train/sweep.h).
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/train/sweep.h"

namespace ht::cli {
namespace {

struct SweepArgs {
  std::string plan;
  std::vector<std::string> sets;
  std::vector<std::string> only;
  std::string out_dir;
  bool resume = false;
  bool dry_run = false;
  std::string log_level = "info";
};

}  // namespace

Command add_sweep_command(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  Command c;
  c.app = app.add_subcommand("sweep", "Run a plan of training runs (configs x overrides) and tabulate the results");
  c.app->add_option("-p,--plan", a->plan, "YAML plan, e.g. configs/repro/plans/fashion_mnist_to_mnist.yaml")->required();
  c.app->add_flag("--resume", a->resume, "Continue interrupted runs from their latest checkpoints");
  c.app->add_flag("--dry-run", a->dry_run, "Print each run's command without running anything");
  c.app->add_option("--out-dir", a->out_dir, "Write the runs and tables here instead of the plan's sweep.out_dir");
  c.app->add_option("--only", a->only, "Run only the runs whose names match this glob, e.g. 'finetune-hlq-*' (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.app->add_option("--set", a->sets,
                    "An override for every run, --set train.device=cpu, or for one stage's, --set finetune:data.root=DIR "
                    "(repeatable)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] {
    ht::logging::set_level(a->log_level);
    const train::SweepPlan plan =
        train::load_sweep_plan(a->plan, {.overrides = a->sets, .out_dir = a->out_dir, .only = a->only});
    const int failed = train::run_sweep(plan, {.resume = a->resume, .dry_run = a->dry_run, .executable = ""});
    return failed == 0 ? 0 : 1;
  };
  return c;
}

}  // namespace ht::cli
