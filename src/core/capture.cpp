// Step capture state (Note [Step graphs] in core/capture.h): one thread-local flag and reason.
#include "hadatrain/core/capture.h"

#include "hadatrain/core/error.h"

namespace ht {
namespace {

struct CaptureState {
  bool active = false;
  std::string reason;
};

CaptureState& state() {
  thread_local CaptureState s;
  return s;
}

}  // namespace

bool step_capture_active() { return state().active; }

void note_step_capture_unsafe(std::string_view reason) {
  CaptureState& s = state();
  if (s.active && s.reason.empty()) s.reason = std::string(reason);
}

StepCaptureScope::StepCaptureScope() {
  CaptureState& s = state();
  HT_ASSERT(!s.active, "a step capture is already active on this thread");
  s.active = true;
  s.reason.clear();
}

StepCaptureScope::~StepCaptureScope() { state().active = false; }

const std::string& StepCaptureScope::reason() const { return state().reason; }

}  // namespace ht
