// The step runner (step_runner.h): eager steps, and the step recorded into a CUDA graph and replayed.
#include "step_runner.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <spdlog/spdlog.h>

#ifdef HADATRAIN_CUDA
#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/graph.h"
#endif
#include "hadatrain/core/error.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::train {

namespace {

// `k` micro-batches of consecutive rows of `batch`, sizes as even as possible; each scale the micro-batch's loss
// weight (unnormalised).
std::vector<MicroBatch> split_rows(const Task& task, const data::Batch& batch, int64_t k) {
  const int64_t b = batch.size();
  std::vector<MicroBatch> plan;
  int64_t start = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t rows = b / k + (i < b % k ? 1 : 0);
    plan.push_back({start, rows, task.loss_weight(data::slice_rows(batch, {start, rows}))});
    start += rows;
  }
  return plan;
}

double total_weight(const std::vector<MicroBatch>& plan) {
  double total = 0.0;
  for (const MicroBatch& m : plan) total += m.scale;
  return total;
}

}  // namespace

std::vector<MicroBatch> plan_micro_batches(const Task& task, const data::Batch& batch, int64_t grad_accum_steps) {
  HT_ASSERT(grad_accum_steps >= 1, "grad_accum_steps {} < 1", grad_accum_steps);
  const std::vector<MicroBatch> plan =
      split_rows(task, batch, std::min(grad_accum_steps, std::max<int64_t>(batch.size(), 1)));
  const double total = total_weight(plan);
  HT_CHECK(total > 0, "{}: batch {} of epoch {} has nothing the loss counts (every label is ignored)", task.name(),
           batch.position.batch + 1, batch.position.epoch + 1);
  std::vector<MicroBatch> kept;
  for (MicroBatch m : plan) {
    if (m.scale == 0.0) continue;
    m.scale /= total;
    kept.push_back(m);
  }
  return kept;
}

std::vector<MicroBatch> plan_rank_micro_batches(const Task& task, const data::Batch& batch, int64_t count) {
  HT_ASSERT(count >= 1 && count <= batch.size(), "{} micro-batches of a {}-row slice", count, batch.size());
  std::vector<MicroBatch> plan = split_rows(task, batch, count);
  const double total = total_weight(plan);
  for (MicroBatch& m : plan) m.scale = total > 0 ? m.scale / total : 0.0;
  return plan;
}

GraphMode graph_mode_from_name(const std::string& name) {
  if (name == "false") return GraphMode::off;
  if (name == "true") return GraphMode::required;
  HT_CHECK(name == "auto", "train.cuda_graph: expected auto, true or false, got {}", name);
  return GraphMode::automatic;
}

#ifdef HADATRAIN_CUDA
struct StepStream::Graph {
  explicit Graph(int device) : graph(device), on_stream(graph.stream(), device) {}
  cuda::StepGraph graph;
  cuda::StreamGuard on_stream;  // declared after the graph: restores the previous stream before it goes
};
#else
struct StepStream::Graph {};
#endif

StepStream::StepStream(Device device, GraphMode mode) {
#ifdef HADATRAIN_CUDA
  if (device.is_cuda() && mode != GraphMode::off) graph_ = std::make_unique<Graph>(device.index);
#else
  (void)device;
  (void)mode;
#endif
}

StepStream::~StepStream() = default;

StepRunner::StepRunner(StepStream& stream, Device device, GraphMode mode, const StepParts& parts)
    : stream_(stream), device_(device), mode_(mode), p_(parts) {
  HT_ASSERT(p_.model && p_.optimizer && p_.task && p_.dropout_gen, "StepRunner: a part is missing");
  loss_zero_ = zeros({}, {DType::f64, device});
  unread_loss_ = zeros({}, {DType::f64, device});
  finite_steps_ = zeros({}, {DType::f64, device});
  last_grad_norm_ = zeros({}, {DType::f64, device});
  HT_CHECK(p_.grad_accum_steps >= 1, "train.grad_accum_steps must be at least 1, got {}", p_.grad_accum_steps);
  if (p_.grad_accum_steps > 1) scales_ = zeros({p_.grad_accum_steps}, {DType::f64, device});
}

StepRunner::~StepRunner() = default;

// Clipping on the device (no host read, so a step graph can record it) on CUDA; on the host on the CPU.
void StepRunner::clip_gradients() {
  if (p_.clip_grad_norm <= 0) return;
  if (p_.clip_global) {
    fill_(last_grad_norm_, p_.clip_global(p_.clip_grad_norm));
  } else if (device_.is_cuda()) {
    const Tensor norm = optim::clip_grad_norm_on_device(p_.optimizer->params(), p_.clip_grad_norm);
    if (norm.defined()) copy_(last_grad_norm_, norm);
  } else {
    fill_(last_grad_norm_, optim::clip_grad_norm(p_.optimizer->params(), p_.clip_grad_norm));
  }
}

// The step's device work on a batch already on the device (the optimiser's begin_step is the caller's):
// eager steps and the recorded graph run the same code.
void StepRunner::device_step(const data::Batch& on_device) {
  Tensor step_loss;  // the step's (weighted) loss, without history
  if (plan_.empty()) {
    const Tensor loss = p_.task->loss(*p_.model, on_device);
    if (p_.before_last_backward) p_.before_last_backward();
    loss.backward();
    step_loss = loss.detach();
  } else {
    // Note [Gradient accumulation steps]: each micro-batch's graph is freed by its backward before the next
    // forward, so only one micro-batch's activations are alive at a time.
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      const Tensor loss = micro_step_loss(on_device, i);
      if (i + 1 == plan_.size() && p_.before_last_backward) p_.before_last_backward();
      loss.backward();
      // Note [Micro-batches on every rank]: a rank's micro-batch that counts nothing (a NaN mean) adds nothing.
      if (plan_[i].scale == 0.0) continue;
      step_loss = step_loss.defined() ? add(step_loss, loss.detach()) : loss.detach();
    }
    if (!step_loss.defined()) step_loss = zeros({}, {DType::f32, device_});  // this rank's rows count nothing
  }
  if (p_.after_backward) step_loss = p_.after_backward(step_loss);
  clip_gradients();
  p_.optimizer->apply();
  if (p_.after_step) p_.after_step();
  add_(unread_loss_, step_loss.to(DType::f64));
  // sum * 0 is 0 while the sum is finite and NaN once a loss was NaN or infinite (which the sum keeps).
  add_(finite_steps_, eq(mul(unread_loss_, 0.0), 0.0).to(DType::f64));
}

// Micro-batch i's loss times its scale (read on the device from scales_).
Tensor StepRunner::micro_step_loss(const data::Batch& on_device, std::size_t i) {
  const MicroBatch& m = plan_[i];
  const Tensor loss = p_.task->loss(*p_.model, data::slice_rows(on_device, {m.start, m.rows}));
  return mul(loss, select(scales_, 0, static_cast<int64_t>(i)).to(loss.dtype()));
}

void StepRunner::run(const data::Batch& batch, double lr, int64_t step) {
  p_.task->check_batch(batch);
  plan_.clear();
  if (p_.grad_accum_steps > 1) {
    plan_ = p_.micro_batches ? plan_rank_micro_batches(*p_.task, batch, p_.micro_batches(p_.grad_accum_steps))
                             : plan_micro_batches(*p_.task, batch, p_.grad_accum_steps);
    std::vector<double> scales(static_cast<std::size_t>(p_.grad_accum_steps), 0.0);
    for (std::size_t i = 0; i < plan_.size(); ++i) scales[i] = plan_[i].scale;
    copy_(scales_, from_vector(scales, {p_.grad_accum_steps}, {DType::f64}));
  }
  if (run_graphed(batch, lr, step)) return;
  p_.optimizer->zero_grad();
  p_.optimizer->begin_step(lr);
  device_step(batch.to(device_));
}

LossSum StepRunner::take_loss_sum() {
  LossSum out;
  out.sum = unread_loss_.item();
  out.finite_steps = static_cast<int64_t>(finite_steps_.item());
  p_.task->check_deferred(device_);
  copy_(unread_loss_, loss_zero_);
  copy_(finite_steps_, loss_zero_);
  return out;
}

bool StepRunner::saw_non_finite_loss() const { return !device_.is_cuda() && !std::isfinite(unread_loss_.item()); }

double StepRunner::grad_norm() const { return last_grad_norm_.item(); }

// train.cuda_graph (Note [Step graphs] in core/capture.h): the step is recorded into a CUDA graph after
// kGraphWarmup eager steps and replayed for every batch of the recorded shape (a smaller last batch runs
// eagerly). The recorded step reads the batch from fixed device tensors (staged_: copied into before each
// replay), the learning rate from the optimiser's staged buffer (Optimizer::begin_step) and adds its loss to
// unread_loss_. Returns false when the batch is to run eagerly.
bool StepRunner::run_graphed(const data::Batch& batch, double lr, int64_t step) {
#ifdef HADATRAIN_CUDA
  constexpr int kGraphWarmup = 3;  // eager steps first: algorithm choice, optimiser state, workspaces
  if (!stream_.graph_ || graph_off_) return false;
  // A recorded step runs every micro-batch; a step that leaves one out (all its labels ignored) runs eagerly.
  if (p_.grad_accum_steps > 1 && static_cast<int64_t>(plan_.size()) != std::min(p_.grad_accum_steps, p_.batch_size))
    return false;
  cuda::StepGraph& graph = stream_.graph_->graph;
  if (staged_.tensors.empty() && batch.size() == p_.batch_size) {  // a full batch (not a resumed tail)
    for (const auto& [key, t] : batch.tensors) staged_.set(key, empty(t.shape(), {t.dtype(), device_}));
  }
  if (staged_.tensors.empty() || staged_.tensors.size() != batch.tensors.size()) return false;
  for (const auto& [key, t] : batch.tensors)
    if (!staged_.has(key) || staged_.at(key).shape() != t.shape()) return false;
  for (const auto& [key, t] : batch.tensors) copy_(staged_.at(key), t);
  p_.optimizer->begin_step(lr);
  auto body = [&] {
    device_step(staged_);
    p_.optimizer->zero_grad();  // a recorded step frees the gradients it allocated
  };
  if (graph.ready()) {
    graph.replay();
  } else if (eager_steps_ < kGraphWarmup) {
    p_.optimizer->zero_grad();
    body();
    ++eager_steps_;
  } else {
    const uint64_t dropout_state = p_.dropout_gen->state();
    // The graph allocates its own memory (graph allocation nodes): hand the eager steps' cached, unused
    // blocks back to the driver first, so a model that fills most of the device still fits.
    cuda::empty_cache(device_.index);
    const std::string why = graph.record(body);
    if (why.empty()) {
      spdlog::info("train.cuda_graph: step recorded into a CUDA graph at step {} (batch {}, {} nodes)", step + 1,
                   to_string(staged_.tensors.begin()->second.shape()), graph.nodes());
      graph.replay();
    } else {
      HT_CHECK(mode_ != GraphMode::required, "train.cuda_graph is true, but {}", why);
      spdlog::info("train.cuda_graph: steps run without a graph: {}", why);
      p_.dropout_gen->set_state(dropout_state);  // the refused recording drew nothing that ran
      graph_off_ = true;
      p_.optimizer->zero_grad();  // gradients made while recording point to the discarded graph's memory
      body();
    }
  }
  return true;
#else
  (void)batch;
  (void)lr;
  (void)step;
  return false;
#endif
}

}  // namespace ht::train
