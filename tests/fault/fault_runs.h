// Helpers of the fault tests: a tiny training run (8x8 MNIST-layout data, 64 train / 32 test samples, batch
// 16: 4 steps per epoch, 2 epochs, a log record per step, checkpoints every 2 steps) in a folder of this test
// program's scratch directory, and the records of a run's metrics.jsonl.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/testing.h"

#include "hadatrain/train/trainer_config.h"

namespace ht::test {

inline std::string fault_config_path() {
  static const std::string path = [] {
    const std::filesystem::path p = scratch_dir() / "fault_runs.yaml";
    std::ofstream(p) << fmt::format(
        "run:\n  seed: 5\n"
        "data:\n  dataset: mnist\n  root: {}\n  batch_size: 16\n  eval_batch_size: 16\n  num_workers: 0\n"
        "model:\n  name: mlp\n  hidden: [16]\n"
        "train:\n  epochs: 2\n  log_every: 1\n"
        "checkpoint:\n  every_steps: 2\n  keep_last: 0\n",
        idx8_dataset().string());
    return p.string();
  }();
  return path;
}

// The config of a run in scratch_dir()/<name> with the given --set overrides.
inline train::TrainerConfig fault_config(const std::string& name, std::vector<std::string> sets = {}) {
  sets.push_back("run.out_dir=" + (scratch_dir() / name).string());
  return train::load_trainer_config(fault_config_path(), sets);
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every line of a metrics file parsed; a line that is not a JSON object fails the calling test through
// the returned `bad` count (lines are kept in order).
struct MetricsFile {
  std::vector<nlohmann::json> records;
  int bad_lines = 0;
  bool ends_with_newline = true;

  // The "step" of each record of `type`, in file order.
  std::vector<int64_t> steps(const std::string& type) const {
    std::vector<int64_t> out;
    for (const auto& r : records)
      if (r.value("type", "") == type) out.push_back(r.at("step").get<int64_t>());
    return out;
  }
  std::vector<nlohmann::json> of_type(const std::string& type) const {
    std::vector<nlohmann::json> out;
    for (const auto& r : records)
      if (r.value("type", "") == type) out.push_back(r);
    return out;
  }
};

inline MetricsFile read_metrics(const std::filesystem::path& file) {
  MetricsFile m;
  const std::string text = read_text(file);
  m.ends_with_newline = text.empty() || text.back() == '\n';
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_object()) m.records.push_back(r);
    else ++m.bad_lines;
  }
  return m;
}

}  // namespace ht::test
