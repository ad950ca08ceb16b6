// `hadatrain inspect-grads --config FILE [--pipelines exact,hlq,lbp_wht,luq] [--json FILE] [--set k=v]...`:
// per layer, the crest factors of x, W and g_y, the relative error of each pipeline's Y (the forward: HALO's is
// quantised) and the relative error and cosine similarity of its g_x and g_w against exact on one training
// batch, and the activation bytes each pipeline saves (train/inspect.h). A --pipelines entry is a
// name or a YAML flow map with options: 'exact,hlq,{name: hlq, acbp_bits: 4},{name: hlq, rank_pct: 25}'.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/train/inspect.h"

namespace ht::cli {
namespace {

struct InspectArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string pipelines = "exact,hlq,lbp_wht,luq";
  std::string json;
  std::string log_level = "warn";
};

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  Command c;
  c.app = app.add_subcommand("inspect-grads",
                             "Per-layer error of each gradient pipeline against exact on one training batch");
  c.app->add_option("-c,--config", a->config, "YAML config file (model, data, grad_pipeline options)")->required();
  c.app->add_option("--pipelines", a->pipelines,
                    "Comma-separated pipelines to compare: names, or YAML maps with options, e.g. "
                    "'exact,hlq,{name: hlq, acbp_bits: 4}'")
      ->capture_default_str();
  c.app->add_option("--json", a->json, "Also write the report as JSON to this file");
  c.app->add_option("--set", a->sets, "Override a config value: --set data.batch_size=64 (repeatable)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] {
    ht::logging::set_level(a->log_level);
    const train::TrainerConfig cfg = train::load_trainer_config(a->config, a->sets);
    if (!a->json.empty()) io::check_output_path(a->json, io::OutputKind::file, "--json");  // before the work
    train::InspectOptions o;
    for (const std::string& entry : train::split_pipeline_list(a->pipelines))
      o.pipelines.push_back(train::inspected_pipeline(cfg, entry));
    const auto report = train::inspect_grads(cfg, o);
    fmt::print("{}", train::format_grad_report(report));
    if (!a->json.empty()) {
      const std::filesystem::path dir = std::filesystem::path(a->json).parent_path();
      if (!dir.empty()) io::create_output_directory(dir, "--json");  // as the trainer does for run.out_dir
      io::write_file_atomic(a->json, train::grad_report_json(report));
      fmt::print("report written to {}\n", a->json);
    }
    return 0;
  };
  return c;
}

}  // namespace ht::cli
