// `hadatrain sweep --plan FILE`: a grid of training runs and the table of their results.
//
// A plan (YAML, read by the typed config reader: unknown keys are errors):
//   sweep:
//     out_dir: runs/sweeps/fmnist_to_mnist  # each run writes <out_dir>/<run name>/; the tables go here too
//     parallel: 2                           # runs at once (child processes of the same binary)
//     set: ["train.device=cpu"]             # overrides for every run
//     recipe: "Fashion-MNIST -> MNIST"      # names the plan's rows in accuracy records (default: the plan's stem)
//   stages:                                 # run one after another, in document order
//     pretrain:
//       config: configs/repro/fashion_mnist_resnet18_pretrain.yaml
//       set: ["train.epochs=2"]             # overrides for this stage's runs
//     finetune:                             # `configs: [A, B]` instead of config: a first grid axis over
//       config: configs/repro/mnist_resnet18_finetune.yaml   # configs, named by their file stems
//       set: ["model.init_from={out_dir}/pretrain/checkpoints"]   # {out_dir}: sweep.out_dir
//       grid:                               # every combination of the values: 4 x 2 runs
//         grad_pipeline.default.name: [exact, hlq, lbp_wht, luq]
//         run.seed: [0, 1]
// A run is named <stage>[-<value>...] (values in grid order, e.g. finetune-hlq-1). A run whose folder holds
// the marker sweep_done.json finished in an earlier sweep and is skipped; one that started and did not finish
// is resumed from its latest checkpoint with --resume, or started again without it. After the runs, the table
// of every run (results.md, results.csv), accuracy records for the results page (accuracy.jsonl) and one PNG
// of curves per stage (tools/plot_metrics.py, skipped with a warning when python3 or matplotlib is missing).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ht::train {

struct SweepRun {
  std::string name;   // <stage>[-<value>...]
  std::string stage;  // the stage it belongs to
  std::string config;
  std::vector<std::string> overrides;                       // --set values, in order (plan, stage, grid)
  std::vector<std::pair<std::string, std::string>> values;  // the grid's (key, value) of this run
  std::filesystem::path dir;                                // <out_dir>/<name>
  bool selected = true;                                     // matched by SweepPlanOptions::only
};

struct SweepPlan {
  std::string source;
  std::filesystem::path out_dir;
  int parallel = 1;
  std::string recipe;
  std::vector<std::string> stages;  // in order
  std::vector<SweepRun> runs;       // stage by stage, grid in row-major order (last key fastest)
};

struct SweepPlanOptions {
  // --set on the sweep command line: applied to every run after the plan's own overrides, so the command line
  // has the last word; "STAGE:key=value" applies to that stage's runs only.
  std::vector<std::string> overrides;
  std::string out_dir;              // replaces sweep.out_dir when not empty
  std::vector<std::string> only;    // run-name globs: only matching runs are run (empty: all)
};

// Reads and expands a plan. A run's overrides, in order: sweep.set, its stage's set, its grid values, then the
// command line's. In all of them {out_dir} is sweep.out_dir and ${NAME} an environment variable. Config paths
// are taken relative to the working directory, as `hadatrain train` takes them. An out_dir that cannot be
// created or written is an error naming it (--out-dir, or sweep.out_dir and the plan file); nothing is created.
SweepPlan load_sweep_plan(const std::string& path, const SweepPlanOptions& options = {});

// One row of the results table, read from a run's metrics.jsonl.
struct SweepRow {
  std::string run, stage, status;  // status: done, failed (exit N), not run
  std::vector<std::pair<std::string, std::string>> values;
  int64_t epochs = 0, steps = 0;
  std::optional<double> final_top1, best_top1, final_test_loss;  // top-1 in %
  std::optional<double> best_test_loss, final_ppl;  // lowest test_loss; test_ppl of the last eval (language models)
  double seconds = 0;                 // sum of the epochs' times
  std::optional<double> throughput;   // median of the train records' <unit>_per_s
  std::string throughput_unit;        // "img/s"
  std::optional<double> peak_mb;      // max gpu_peak_mb, else max host_peak_mb
  std::string pipeline;               // grad_pipeline.default.name of the run's saved config.yaml
  uint64_t seed = 0;                  // run.seed of the same
};

// The row of `run` from <run.dir>/metrics.jsonl (a missing file leaves the numbers empty).
SweepRow read_sweep_row(const SweepRun& run, const std::string& status);
// The Markdown and CSV tables of `rows` (the grid keys as columns).
std::string sweep_markdown(const SweepPlan& plan, const std::vector<SweepRow>& rows);
std::string sweep_csv(const SweepPlan& plan, const std::vector<SweepRow>& rows);

struct SweepOptions {
  bool resume = false;     // continue interrupted runs from their checkpoints
  bool dry_run = false;    // print the runs and their commands only
  std::string executable;  // the hadatrain binary the runs use (default /proc/self/exe)
};

// Runs the plan (sweep_runner.cpp) and writes the tables; returns the number of failed runs.
int run_sweep(const SweepPlan& plan, const SweepOptions& options);

}  // namespace ht::train
