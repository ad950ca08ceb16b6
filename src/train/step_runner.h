// The step runner: one training step (zero the gradients, the task's loss, backward, optional clipping, the
// optimiser step) run eagerly, or recorded into a CUDA graph and replayed (train.cuda_graph). Internal to
// src/train; the loop calls run() per batch and reads the summed losses at its log points.
#pragma once
#include <cstdint>
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

struct StepParts {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  const Task* task = nullptr;
  Generator* dropout_gen = nullptr;  // restored when a recording is refused (it drew nothing that ran)
  double clip_grad_norm = 0.0;       // optim.clip_grad_norm; 0 = no clipping
  int64_t batch_size = 0;            // the full batch size: a graph is recorded for batches of this size
};

class StepRunner {
 public:
  StepRunner(StepStream& stream, Device device, GraphMode mode, const StepParts& parts);
  ~StepRunner();

  // One optimiser step on `batch` (host memory) at learning rate `lr`; `step` is the number of steps run
  // before it (for messages). The loss is added to the unread sum on the device; nothing is read back.
  void run(const data::Batch& batch, double lr, int64_t step);
  // The f64 sum of the losses of the steps since the last call, read from the device (a synchronisation);
  // then raises what the task deferred (Task::check_deferred) and restarts the sum.
  double take_loss_sum();
  // The global gradient norm before clipping of the latest step (optim.clip_grad_norm > 0); reads the device.
  double grad_norm() const;

 private:
  void device_step(const data::Batch& on_device);
  void clip_gradients();
  bool run_graphed(const data::Batch& batch, double lr, int64_t step);

  StepStream& stream_;
  Device device_;
  GraphMode mode_;
  StepParts p_;
  // Note [Deferred loss reads] (trainer.cpp): f64 sum of the losses not read yet, updated in place, so a
  // recorded step graph adds to the same tensor at every replay.
  Tensor loss_zero_, unread_loss_;
  Tensor last_grad_norm_;  // optim.clip_grad_norm: read when logged
  // The graph's input batch: fixed device tensors the batch is copied into before each replay.
  data::Batch staged_;
  int eager_steps_ = 0;
  bool graph_off_ = false;  // recording was refused: every step eager from then on
};

}  // namespace ht::train
