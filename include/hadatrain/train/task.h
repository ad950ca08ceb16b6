// A task says what training optimises and what evaluation measures: it turns a batch (named tensors) into
// a loss on the device, accumulates its metrics over a test set, and names its throughput unit. The
// training loop, the step runner and the logs know only this interface; image classification
// (train/image_classification.h) is one task, causal language modelling another.
//
//   ImageClassification task({.compute_dtype = DType::f32});
//   Tensor loss = task.loss(model, batch.to(device));   // scalar, recordable in a CUDA graph
//   loss.backward();
//   EvalResult r = evaluate(model, task, test_loader, device);
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "hadatrain/data/loader.h"
#include "hadatrain/nn/module.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::train {

// One figure of an evaluation, written to the eval record as "test_<name>". Counts stay integers.
struct EvalMetric {
  std::string name;  // "acc", "top5", "correct", "total"
  std::variant<int64_t, double> value;
};

// What a task's evaluation measured on a test set.
struct EvalResult {
  double loss = 0.0;           // the mean test loss per evaluated unit
  int64_t total = 0;           // units evaluated (images, tokens); 0 when no evaluation ran
  double score = 0.0;          // the task's higher-is-better figure; the best checkpoint maximises it
  std::vector<EvalMetric> metrics;  // the task's figures, in the order of the eval record
  std::string summary;         // the figures for the log line, without the count (`total`): "test loss 0.4123,
                               // top-1 85.10%, top-5 97.20%"

  bool has(std::string_view name) const;
  // The metric `name` as a number (counts converted); throws ht::Error naming the metrics there are.
  double number(std::string_view name) const;
  // The count `name`; throws ht::Error when there is no such metric or it is not a count.
  int64_t count(std::string_view name) const;
};

// Accumulates a task's evaluation over the batches of one pass over a test set.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // Called under NoGradGuard with the model in eval mode; `batch` is on the model's device.
  virtual void add(nn::Module& model, const data::Batch& batch) = 0;
  virtual EvalResult result() const = 0;
  // The running sums result() is computed from (loss sum, counts), in a fixed order: ranks that each evaluated
  // part of a test set add theirs over the ranks and set the totals, and result() is then the whole set's.
  virtual std::vector<double> sums() const = 0;
  virtual void set_sums(const std::vector<double>& sums) = 0;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // The batch keys loss() and the evaluator read.
  virtual std::vector<std::string> required_keys() const = 0;
  // Throws ht::Error naming the task, the missing keys and the keys the batch has.
  void check_batch(const data::Batch& batch) const;

  // The throughput unit ("img", "tok") and how many of them a batch holds, counted on the host.
  virtual std::string unit() const = 0;
  virtual int64_t units(const data::Batch& batch) const = 0;
  // How many units the loss of `batch` is a mean over, counted on the host (images; tokens with a label).
  // Gradient accumulation (train.grad_accum_steps) weighs each micro-batch's loss by its share of the step's
  // total, so the accumulated gradient is that of the whole batch's mean loss.
  virtual double loss_weight(const data::Batch& batch) const { return static_cast<double>(units(batch)); }
  // Whether every row of a batch is one unit of equal loss weight (units and loss_weight count rows): then a
  // data-parallel rank can make only its rows of each global batch (data::LoaderOptions::slice_count) and know
  // its share of the loss from the row counts (Batch::global_rows). Images: yes; text (tokens with a label): no.
  virtual bool rows_are_units() const { return false; }
  // Training FLOPs per unit for the model FLOPs utilisation in the training log; 0 when unknown.
  virtual double flops_per_unit() const { return 0.0; }

  // The training loss of `batch` (on the model's device): a scalar with autograd history. It reads nothing
  // on the host, so a step that calls it can be recorded into a CUDA graph (cuda/graph.h).
  virtual Tensor loss(nn::Module& model, const data::Batch& batch) const = 0;
  // Raises what loss() could only record on the device (e.g. an out-of-range class index); the loop calls it
  // where it reads the losses, so the error surfaces within the logging window of the step that caused it.
  virtual void check_deferred(Device device) const { (void)device; }

  virtual std::unique_ptr<Evaluator> evaluator() const = 0;
  // The name of EvalResult::score ("top1"; checkpoints store the best as "best_<name>") and a value below
  // any score, held before the first evaluation.
  virtual std::string score_name() const = 0;
  virtual double initial_score() const = 0;
};

// One pass of `loader` (its next epoch) through task.evaluator(), with gradients off and the model in eval
// mode (train mode again afterwards); each batch is checked and moved to `device`.
EvalResult evaluate(nn::Module& model, const Task& task, data::DataLoader& loader, Device device);
// The same over the batches `next_batch` returns until it returns nullopt (any loader: text_loader.h).
// `combine_sums`, when given, replaces the evaluator's sums before its result (ranks: their sum over the ranks).
EvalResult evaluate(nn::Module& model, const Task& task, const std::function<std::optional<data::Batch>()>& next_batch,
                    Device device, const std::function<void(std::vector<double>&)>& combine_sums = {});

}  // namespace ht::train
