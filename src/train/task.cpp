// The task interface's shared parts (task.h): metric look-up, the batch-key check, and one evaluation pass.
#include "hadatrain/train/task.h"

#include <algorithm>

#include <fmt/format.h>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/error.h"

namespace ht::train {
namespace {

std::string names_of(const std::vector<EvalMetric>& metrics) {
  std::string out;
  for (const auto& m : metrics) out += (out.empty() ? "" : ", ") + m.name;
  return out.empty() ? "none" : out;
}

const EvalMetric& find_metric(const EvalResult& r, std::string_view name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return m;
  HT_FAIL("the evaluation has no metric '{}' (it has: {})", name, names_of(r.metrics));
}

}  // namespace

bool EvalResult::has(std::string_view name) const {
  return std::any_of(metrics.begin(), metrics.end(), [&](const EvalMetric& m) { return m.name == name; });
}

double EvalResult::number(std::string_view name) const {
  return std::visit([](auto v) { return static_cast<double>(v); }, find_metric(*this, name).value);
}

int64_t EvalResult::count(std::string_view name) const {
  const EvalMetric& m = find_metric(*this, name);
  HT_CHECK(std::holds_alternative<int64_t>(m.value), "the evaluation metric '{}' is not a count", name);
  return std::get<int64_t>(m.value);
}

void Task::check_batch(const data::Batch& batch) const {
  std::string missing, have;
  for (const auto& k : required_keys())
    if (!batch.has(k)) missing += (missing.empty() ? "" : ", ") + k;
  if (missing.empty()) return;
  for (const auto& [k, t] : batch.tensors) have += (have.empty() ? "" : ", ") + k;
  HT_FAIL("{}: the batch has no {} (it has: {})", name(), missing, have.empty() ? "no tensors" : have);
}

EvalResult evaluate(nn::Module& model, const Task& task, data::DataLoader& loader, Device device) {
  return evaluate(model, task, [&] { return loader.next(); }, device);
}

EvalResult evaluate(nn::Module& model, const Task& task, const std::function<std::optional<data::Batch>()>& next_batch,
                    Device device, const std::function<void(std::vector<double>&)>& combine_sums) {
  NoGradGuard no_grad;
  model.eval();
  const std::unique_ptr<Evaluator> ev = task.evaluator();
  while (const auto batch = next_batch()) {
    task.check_batch(*batch);
    ev->add(model, batch->to(device));
  }
  model.train();
  if (combine_sums) {
    std::vector<double> sums = ev->sums();
    combine_sums(sums);
    ev->set_sums(sums);
  }
  return ev->result();
}

}  // namespace ht::train
