// Step graphs: record one training step into a CUDA graph and replay it, so a step costs one launch of host
// time instead of one per kernel (a ResNet step issues ~200 small kernels; Note [Step graphs] in
// core/capture.h says what may be recorded).
//
// Usage (the trainer and bench_train do this):
//   cuda::StepGraph g(device);
//   cuda::StreamGuard on(g.stream(), device);   // warm-up steps and replays on the graph's stream
//   ... a few eager steps of body() (algorithm choice, lazily created state, workspaces) ...
//   if (const std::string why = g.record(body); !why.empty()) -> run body() eagerly from now on
//   each step: refresh the inputs the graph reads (copy_ into fixed tensors, Optimizer::begin_step), replay()
//
// record() runs body() with the stream in capture mode (cudaStreamCaptureModeThreadLocal: other threads,
// e.g. data workers, keep working), so body()'s device work is recorded, NOT executed: after a successful
// record(), replay() once to perform that step. A recording is refused, with the reason returned, when
// body() throws (a synchronising call such as item() throws while recording), when something it calls
// notes a per-step host value (note_step_capture_unsafe: random streams, stochastic-rounding noise), when a
// tensor allocated in body() is still alive after it (a graph's memory must be freed by the graph), or
// when a tensor from before the recording was freed during it. The host side effects of a refused body()
// stay done (e.g. a generator's counter), its device work does not happen, and tensors it created and kept
// (e.g. parameter gradients) belong to the discarded recording: drop them (zero_grad) before running eagerly.
#pragma once
#ifdef HADATRAIN_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

#include "hadatrain/cuda/context.h"

namespace ht::cuda {

class StepGraph {
 public:
  explicit StepGraph(int device = -1);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  cudaStream_t stream() const { return stream_.get(); }
  int device() const { return stream_.device(); }
  bool ready() const { return exec_ != nullptr; }

  // Records body() (see above). Returns "" when the graph is ready, otherwise why it was refused; a new
  // recording replaces an earlier graph.
  std::string record(const std::function<void()>& body);
  // Launches the recorded step on stream() (ready() must hold).
  void replay();
  // Nodes of the last accepted recording (kernels, memsets, copies and memory nodes): what one replay launches;
  // 0 before one. A measure of a step's launch overhead that needs no profiler.
  std::size_t nodes() const { return nodes_; }
  // Those nodes by kind: "K kernels, M memsets, C copies, A memory, O other".
  const std::string& node_kinds() const { return node_kinds_; }

 private:
  void reset();
  Stream stream_;
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
  std::string node_kinds_;
};

}  // namespace ht::cuda
#endif
