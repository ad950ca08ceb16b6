// The step runner: one training step (zero the gradients, the task's loss, backward, optional clipping, the
// optimiser step) run eagerly, or recorded into a CUDA graph and replayed (train.cuda_graph). With gradient
// accumulation (train.grad_accum_steps) the step's batch is split into micro-batches whose forward and
// backward run one after the other before the one optimiser step (Note [Gradient accumulation steps]).
// Internal to src/train; the loop calls run() per batch and reads the summed losses at its log points.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "hadatrain/data/loader.h"
#include "hadatrain/nn/module.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/train/task.h"

namespace ht::train {

// train.cuda_graph: false | auto (record when possible, else eager) | true (a refused recording is an error).
enum class GraphMode { off, automatic, required };
GraphMode graph_mode_from_name(const std::string& name);

// The stream every device operation of a run goes to (Note [Step graphs] in core/capture.h): on CUDA with
// graphs not off, the step graph's stream, made current for this thread while the StepStream lives, so eager
// steps, recorded steps and evaluation stay in one order. Create it before the model and optimiser: the
// stream must outlive the tensors allocated on it. On the CPU (or with graphs off) it holds nothing.
class StepStream {
 public:
  StepStream(Device device, GraphMode mode);
  ~StepStream();
  StepStream(const StepStream&) = delete;
  StepStream& operator=(const StepStream&) = delete;

 private:
  friend class StepRunner;
  struct Graph;
  std::unique_ptr<Graph> graph_;  // null: no graph
};

// The losses of the steps since the last read.
struct LossSum {
  double sum = 0.0;            // their f64 sum; non-finite when one of them is
  int64_t finite_steps = 0;    // how many of them came before the first non-finite loss (all: none was)
};

struct StepParts {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  const Task* task = nullptr;
  Generator* dropout_gen = nullptr;  // restored when a recording is refused (it drew nothing that ran)
  double clip_grad_norm = 0.0;       // optim.clip_grad_norm; 0 = no clipping
  int64_t batch_size = 0;            // the full batch size: a graph is recorded for batches of this size
  int64_t grad_accum_steps = 1;      // train.grad_accum_steps: micro-batches per optimiser step
  // Data parallelism (train/distributed.h): before_last_backward runs before the step's last backward (the
  // last micro-batch's); after_backward after it, before clipping: it takes the step's loss and returns the
  // loss to log (the global batch's).
  std::function<void()> before_last_backward;
  std::function<Tensor(const Tensor&)> after_backward;
  // Data parallelism with train.grad_accum_steps > 1: the number of micro-batches every rank runs in this step,
  // given grad_accum_steps (Note [Micro-batches on every rank]).
  std::function<int64_t(int64_t)> micro_batches;
  // Sharded parameters (dist.mode fsdp): clips by the norm over every rank's gradient shards and returns it
  // (replaces the local clipping); after_step runs after the optimiser step (drops the gathered weights).
  std::function<double(double)> clip_global;
  std::function<void()> after_step;
};

// One micro-batch of a step: rows [start, start + rows) of the batch, its loss weighted by `scale`.
struct MicroBatch {
  int64_t start = 0, rows = 0;
  double scale = 1.0;
};
// Note [Gradient accumulation steps]
// A batch of B rows is split into min(k, B) micro-batches of consecutive rows, sizes as even as possible
// (the first B mod k one row larger). Micro-batch i's mean loss is weighted by w_i / W, with w_i the units its
// loss is a mean over (Task::loss_weight: images, or tokens with a label) and W their sum, so the summed
// gradients are those of the whole batch's mean loss, and the logged loss is that mean. A micro-batch with
// w_i = 0 (every label ignored) is left out. A batch with W = 0 is an error naming its position.
std::vector<MicroBatch> plan_micro_batches(const Task& task, const data::Batch& batch, int64_t grad_accum_steps);

// Note [Micro-batches on every rank]
// Under fsdp every forward gathers weights with the other ranks, so every rank must run as many micro-batches
// as the others in a step, although their slices of the global batch differ (the first G mod N ranks hold one
// row more) and so may which of their micro-batches count nothing. A rank's plan is therefore `count`
// micro-batches of its slice (count <= its rows; the trainer gives min(grad_accum_steps, floor(G/N)), the same
// on every rank: DistributedRun::micro_batches), none left out: a micro-batch with w_i = 0 runs with scale 0
// (its loss is not added to the step's), and a slice with W = 0 (every label of this rank's rows ignored, the
// others' counted) has scale 0 throughout. Under ddp the same plan keeps the ranks' steps alike.
std::vector<MicroBatch> plan_rank_micro_batches(const Task& task, const data::Batch& batch, int64_t count);

class StepRunner {
 public:
  StepRunner(StepStream& stream, Device device, GraphMode mode, const StepParts& parts);
  ~StepRunner();

  // One optimiser step on `batch` (host memory) at learning rate `lr`; `step` is the number of steps run
  // before it (for messages). The loss is added to the unread sum on the device; nothing is read back.
  void run(const data::Batch& batch, double lr, int64_t step);
  // The losses of the steps since the last call, read from the device (a synchronisation); then raises what
  // the task deferred (Task::check_deferred) and restarts the sum.
  LossSum take_loss_sum();
  // On the CPU: whether a loss since the last read is NaN or infinite (reading it costs nothing). On CUDA
  // always false: the device is not read per step, take_loss_sum finds it and names the step.
  bool saw_non_finite_loss() const;
  // The global gradient norm before clipping of the latest step (optim.clip_grad_norm > 0); reads the device.
  double grad_norm() const;

 private:
  void device_step(const data::Batch& on_device);
  Tensor micro_step_loss(const data::Batch& on_device, std::size_t i);
  void clip_gradients();
  bool run_graphed(const data::Batch& batch, double lr, int64_t step);

  StepStream& stream_;
  Device device_;
  GraphMode mode_;
  StepParts p_;
  // Note [Deferred loss reads] (trainer.cpp): f64 sum of the losses not read yet, updated in place, so a
  // recorded step graph adds to the same tensor at every replay.
  Tensor loss_zero_, unread_loss_;
  // The number of steps since the last read whose running loss sum was still finite, counted on the device
  // (f64, added to in place like unread_loss_): the first non-finite loss is the step after them.
  Tensor finite_steps_;
  Tensor last_grad_norm_;  // optim.clip_grad_norm: read when logged
  // Gradient accumulation: this step's micro-batches (empty: the whole batch in one pass) and their scales
  // (k) f64 on the device, written before the step (a recorded step reads them from there).
  std::vector<MicroBatch> plan_;
  Tensor scales_;
  // The graph's input batch: fixed device tensors the batch is copied into before each replay.
  data::Batch staged_;
  int eager_steps_ = 0;
  bool graph_off_ = false;  // recording was refused: every step eager from then on
};

}  // namespace ht::train
