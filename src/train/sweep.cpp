// Sweep plans and results tables (train/sweep.h); running them is sweep_runner.cpp.
#include "hadatrain/train/sweep.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/core/error.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;

// {out_dir} -> the plan's out_dir; ${NAME} -> the environment variable NAME (an unset one is an error).
std::string substitute(std::string s, const SweepPlan& plan) {
  const std::string key = "{out_dir}";
  for (std::size_t at = s.find(key); at != std::string::npos; at = s.find(key, at))
    s.replace(at, key.size(), plan.out_dir.string());
  for (std::size_t at = s.find("${"); at != std::string::npos; at = s.find("${", at)) {
    const std::size_t end = s.find('}', at);
    HT_CHECK(end != std::string::npos, "{}: '{}' has '${{' without a closing '}}'", plan.source, s);
    const std::string name = s.substr(at + 2, end - at - 2);
    const char* value = std::getenv(name.c_str());
    HT_CHECK(value != nullptr, "{}: the override '{}' uses ${{{}}}, which is not set in the environment", plan.source,
             s, name);
    s.replace(at, end + 1 - at, value);
  }
  return s;
}

// A grid value as part of a run name: letters, digits, '.', '_' kept; anything else becomes '_'.
std::string name_part(const std::string& v) {
  std::string out;
  for (char c : v) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ? c : '_';
  return out.empty() ? "_" : out;
}

std::string fmt_opt(const std::optional<double>& v, const char* spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::vector<std::string> grid_keys(const SweepPlan& plan) {
  std::vector<std::string> keys;
  for (const SweepRun& r : plan.runs)
    for (const auto& [k, v] : r.values)
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  return keys;
}

std::string value_of(const SweepRow& row, const std::string& key) {
  for (const auto& [k, v] : row.values)
    if (k == key) return v;
  return "";
}

}  // namespace

SweepPlan load_sweep_plan(const std::string& path, const SweepPlanOptions& options) {
  ConfigReader root = ConfigReader::load_file(path);
  SweepPlan plan;
  plan.source = path;
  ConfigReader sweep = root.child("sweep");
  plan.out_dir = sweep.get<std::string>("out_dir", "runs/sweeps/" + fs::path(path).stem().string());
  if (!options.out_dir.empty()) plan.out_dir = options.out_dir;
  // Command-line overrides: (stage or "" for all, key=value).
  std::vector<std::pair<std::string, std::string>> extra;
  for (const std::string& o : options.overrides) {
    const std::size_t eq = o.find('='), colon = o.find(':');
    if (colon != std::string::npos && colon < eq) extra.emplace_back(o.substr(0, colon), o.substr(colon + 1));
    else extra.emplace_back("", o);
  }
  plan.parallel = sweep.get("parallel", 1, Range::closed(1, 64));
  plan.recipe = sweep.get<std::string>("recipe", fs::path(path).stem().string());
  const std::vector<std::string> common = sweep.get_list<std::string>("set", {});
  ConfigReader stages = root.child("stages");
  const std::vector<std::string> names = stages.keys();
  if (names.empty()) stages.fail("", "a plan needs at least one stage (stages: {<name>: {config: FILE, grid: ...}})");
  for (const auto& [stage, o] : extra)
    HT_CHECK(stage.empty() || std::find(names.begin(), names.end(), stage) != names.end(),
             "sweep --set {}:{}: the plan {} has no stage '{}'", stage, o, path, stage);
  std::vector<std::string> seen_runs;
  for (const std::string& stage : names) {
    if (stage.empty() || name_part(stage) != stage)
      stages.fail(stage, "stage names are letters, digits, '.' and '_'");
    ConfigReader s = stages.child(stage);
    // `config: FILE`, or `configs: [FILE, ...]`: a first grid axis over configs (named by their stems).
    std::vector<std::string> configs;
    if (s.has("configs")) {
      configs = s.get_list<std::string>("configs", {});
      if (configs.empty() || s.has("config")) s.fail("configs", "give either config: FILE or a non-empty configs: [FILE, ...]");
    } else {
      configs.push_back(s.require<std::string>("config"));
    }
    for (const std::string& config : configs) {
      std::error_code ec;
      if (fs::is_regular_file(config, ec)) continue;
      // A relative path is read from the working directory (as hadatrain train reads --config), not from the
      // plan's folder: the plans in configs/ name their configs from the repository's root.
      const std::string where =
          fs::path(config).is_relative() ? fmt::format(" (relative paths are read from the working directory {})",
                                                        fs::current_path(ec).string())
                                         : "";
      s.fail(s.has("configs") ? "configs" : "config", fmt::format("{} is not a file{}", config, where));
    }
    std::vector<std::string> overrides = common;
    for (const std::string& o : s.get_list<std::string>("set", {})) overrides.push_back(o);
    ConfigReader grid = s.child("grid");
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    if (configs.size() > 1) axes.emplace_back("config", configs);
    for (const std::string& key : grid.keys()) {
      auto values = grid.get_list<std::string>(key, {});
      if (values.empty()) grid.fail(key, "expected a non-empty list of values");
      axes.emplace_back(key, std::move(values));
    }
    plan.stages.push_back(stage);
    // Row-major expansion: the last key changes fastest.
    std::vector<std::size_t> at(axes.size(), 0);
    for (bool more = true; more;) {
      SweepRun run;
      run.stage = stage;
      run.config = configs[0];
      run.name = stage;
      for (std::size_t a = 0; a < axes.size(); ++a) {
        const std::string& v = axes[a].second[at[a]];
        if (axes[a].first == "config") {
          run.config = v;
          run.values.emplace_back("config", fs::path(v).stem().string());
        } else {
          run.values.emplace_back(axes[a].first, v);
        }
        run.name += fmt::format("-{}", name_part(run.values.back().second));
      }
      for (const std::string& o : overrides) run.overrides.push_back(substitute(o, plan));
      for (const auto& [k, v] : run.values)
        if (k != "config") run.overrides.push_back(k + "=" + v);
      for (const auto& [only_stage, o] : extra)
        if (only_stage.empty() || only_stage == stage) run.overrides.push_back(substitute(o, plan));  // the last word
      run.selected = options.only.empty() || std::any_of(options.only.begin(), options.only.end(), [&](const std::string& g) {
                       return grad::glob_match(g, run.name);
                     });
      run.dir = plan.out_dir / run.name;
      run.overrides.push_back("run.name=" + run.name);
      run.overrides.push_back("run.out_dir=" + run.dir.string());
      HT_CHECK(std::find(seen_runs.begin(), seen_runs.end(), run.name) == seen_runs.end(),
               "{}: two runs are named {} (grid values that differ only in characters other than letters, digits, "
               "'.' and '_')",
               path, run.name);
      seen_runs.push_back(run.name);
      plan.runs.push_back(std::move(run));
      more = false;
      for (std::size_t a = axes.size(); a-- > 0;) {
        if (++at[a] < axes[a].second.size()) {
          more = true;
          break;
        }
        at[a] = 0;
      }
    }
  }
  root.finish();
  for (const std::string& g : options.only)
    HT_CHECK(std::any_of(plan.runs.begin(), plan.runs.end(), [&](const SweepRun& r) { return grad::glob_match(g, r.name); }),
             "sweep --only {}: no run of {} is named like that (runs are named <stage>[-<value>...], e.g. {})", g, path,
             plan.runs.front().name);
  // Where the runs will write, checked with the plan (a dry run too), before any run starts.
  io::check_output_path(plan.out_dir, io::OutputKind::directory,
                        options.out_dir.empty() ? fmt::format("sweep.out_dir of {}", path) : "--out-dir");
  return plan;
}

SweepRow read_sweep_row(const SweepRun& run, const std::string& status) {
  SweepRow row;
  row.run = run.name;
  row.stage = run.stage;
  row.status = status;
  row.values = run.values;
  // The pipeline and seed the run trained with, from the config it saved.
  std::error_code ec;
  if (fs::is_regular_file(run.dir / "config.yaml", ec)) {
    try {
      const TrainerConfig cfg = load_trainer_config((run.dir / "config.yaml").string());
      row.pipeline = cfg.grad_pipeline.default_spec.name;
      row.seed = cfg.run.seed;
    } catch (const Error&) {
      // A saved config this binary cannot read (another version): the row keeps no pipeline.
    }
  }
  std::ifstream in(run.dir / "metrics.jsonl");
  std::vector<double> rates;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;  // a cut-off last line of an interrupted run
    auto num = [&](const char* k) -> std::optional<double> {
      const auto it = j.find(k);
      return it != j.end() && it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
    };
    auto peak = [&](std::optional<double> v) {
      if (v) row.peak_mb = std::max(row.peak_mb.value_or(0.0), *v);
    };
    const std::string type = j.value("type", "");
    if (type == "train") {
      for (const auto& [k, v] : j.items())
        if (k.size() > 6 && k.ends_with("_per_s") && v.is_number()) {
          rates.push_back(v.get<double>());
          row.throughput_unit = k.substr(0, k.size() - 6) + "/s";
        }
      if (const auto g = num("gpu_peak_mb")) peak(g);
      else peak(num("host_peak_mb"));
      if (const auto s = num("step")) row.steps = std::max<int64_t>(row.steps, static_cast<int64_t>(*s));
    } else if (type == "eval") {
      // An eval record names the step it ran after: a run whose last steps fall between two logged training
      // windows still counts them.
      if (const auto s = num("step")) row.steps = std::max<int64_t>(row.steps, static_cast<int64_t>(*s));
      if (const auto e = num("epoch")) row.epochs = static_cast<int64_t>(*e);
      if (const auto s = num("epoch_seconds")) row.seconds += *s;
      if (const auto a = num("test_acc")) {
        row.final_top1 = 100.0 * *a;
        row.best_top1 = std::max(row.best_top1.value_or(0.0), 100.0 * *a);
      }
      row.final_test_loss = num("test_loss");
      if (row.final_test_loss) row.best_test_loss = std::min(row.best_test_loss.value_or(*row.final_test_loss), *row.final_test_loss);
      row.final_ppl = num("test_ppl");
      if (!j.contains("gpu_peak_mb")) peak(num("host_peak_mb"));
    }
  }
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    row.throughput = rates[rates.size() / 2];
  }
  return row;
}

std::string sweep_markdown(const SweepPlan& plan, const std::vector<SweepRow>& rows) {
  const auto keys = grid_keys(plan);
  std::string out = fmt::format("# Sweep {}\n\nPlan: `{}`; runs in `{}`. Top-1 in %; time is the sum of the epochs' "
                                "times; throughput the median of the logged training windows; peak memory the GPU's "
                                "when the run was on CUDA, else the process's. Test loss is the validation loss (per token for language "
                                "models, whose perplexity is exp of it).\n\n",
                                plan.recipe, plan.source, plan.out_dir.string());
  out += "| run | stage |";
  for (const auto& k : keys) out += fmt::format(" {} |", k);
  out += " status | epochs | final top-1 | best top-1 | final test loss | best test loss | final perplexity | time (s) | "
         "throughput | peak memory (MB) |\n|";
  for (std::size_t i = 0; i < keys.size() + 12; ++i) out += "---|";
  out += "\n";
  for (const SweepRow& r : rows) {
    out += fmt::format("| {} | {} |", r.run, r.stage);
    for (const auto& k : keys) out += fmt::format(" {} |", value_of(r, k));
    out += fmt::format(" {} | {} | {} | {} | {} | {} | {} | {:.1f} | {} | {} |\n", r.status, r.epochs,
                       fmt_opt(r.final_top1, "{:.2f}"), fmt_opt(r.best_top1, "{:.2f}"), fmt_opt(r.final_test_loss, "{:.4f}"),
                       fmt_opt(r.best_test_loss, "{:.4f}"), fmt_opt(r.final_ppl, "{:.3f}"), r.seconds,
                       r.throughput ? fmt::format("{:.0f} {}", *r.throughput, r.throughput_unit) : "-",
                       fmt_opt(r.peak_mb, "{:.0f}"));
  }
  return out;
}

std::string sweep_csv(const SweepPlan& plan, const std::vector<SweepRow>& rows) {
  const auto keys = grid_keys(plan);
  std::string out = "run,stage";
  for (const auto& k : keys) out += fmt::format(",{}", csv_field(k));
  // The language-model columns come before final_top1 so that the columns after it keep their places from the end
  // (tests/cli/check_transfer.cmake reads final_top1 counting from the end).
  out += ",status,epochs,steps,best_test_loss,final_ppl,final_top1,best_top1,final_test_loss,seconds,throughput,"
         "throughput_unit,peak_mb\n";
  auto num = [](const std::optional<double>& v) { return v ? fmt::format("{}", *v) : std::string(); };
  for (const SweepRow& r : rows) {
    out += csv_field(r.run) + "," + csv_field(r.stage);
    for (const auto& k : keys) out += fmt::format(",{}", csv_field(value_of(r, k)));
    out += fmt::format(",{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(r.status), r.epochs, r.steps,
                       num(r.best_test_loss), num(r.final_ppl), num(r.final_top1),
                       num(r.best_top1), num(r.final_test_loss), r.seconds, num(r.throughput), r.throughput_unit,
                       num(r.peak_mb));
  }
  return out;
}

}  // namespace ht::train
