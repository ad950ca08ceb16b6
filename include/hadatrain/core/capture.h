// Step capture state: whether this thread is recording a CUDA graph of a training step, and why a recording
// cannot be replayed. Lives in the core library (no CUDA types) so that code below the CUDA layer — random
// streams, gradient-pipeline noise — can say that it bakes a per-step host value into the recorded work.
//
// Note [Step graphs]
// A CUDA graph replays the kernels, copies, allocations and frees recorded once, with the kernel arguments
// of that recording. A step may be recorded only if everything that changes from step to step reaches the
// device through memory the graph reads at replay (the input batch copied into fixed buffers, the
// optimiser's hyper-parameters staged into a device buffer before each replay), never through a kernel
// argument or a host decision. Code that takes such a value while recording calls
// note_step_capture_unsafe(reason): the recording is then discarded and the step runs eagerly
// (cuda/graph.h). Things recorded must also not outlive the step: every allocation made while recording is
// freed before recording ends, and no tensor allocated before it is freed during it.
#pragma once
#include <string>
#include <string_view>

namespace ht {

// True while this thread records a step (between StepCaptureScope's construction and destruction).
bool step_capture_active();

// Records `reason` as why the current recording cannot be replayed (the first reason is kept); does
// nothing when this thread is not recording.
void note_step_capture_unsafe(std::string_view reason);

// Marks this thread as recording for its lifetime; reason() is empty while the recording stays usable.
class StepCaptureScope {
 public:
  StepCaptureScope();
  ~StepCaptureScope();
  StepCaptureScope(const StepCaptureScope&) = delete;
  StepCaptureScope& operator=(const StepCaptureScope&) = delete;
  const std::string& reason() const;
};

}  // namespace ht
