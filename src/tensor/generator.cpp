// Generator's host logic (Note [Step-keyed streams] in tensor/philox.h).
#include "hadatrain/core/error.h"
#include "hadatrain/tensor/philox.h"

namespace ht {

uint64_t Generator::next_stream() {
  HT_CHECK(step_src_ == nullptr, "Generator::next_stream on a step-keyed generator: a random op in a step uses draw()");
  note_step_capture_unsafe("it draws a random stream (dropout or another random op)");
  return counter_++;
}

RandomDraw Generator::draw() {
  if (step_src_ == nullptr) {
    note_step_capture_unsafe("it draws a random stream (dropout or another random op)");
    return {seed_, counter_++, nullptr};
  }
  if (step_src_->step != step_seen_) {
    step_seen_ = step_src_->step;
    draws_in_step_ = 0;
  }
  // philox_stream keeps 16 bits of the draw index.
  HT_CHECK(draws_in_step_ < 0x10000u, "a training step drew more than 65536 random streams (dropout and drop path "
           "calls); at most 65536 are supported");
  const uint32_t k = static_cast<uint32_t>(draws_in_step_++);
  const int64_t* word = step_src_->device_word;
  // Without a device word the host step is in the stream: a recorded step would replay this step's masks.
  if (word == nullptr) note_step_capture_unsafe("a random op keys its stream by the host step (no device step word)");
  return {seed_, philox_stream(k, word != nullptr ? 0 : static_cast<uint64_t>(step_src_->step), kDrawPurpose), word};
}

void Generator::key_by_step(const StepSource* src) {
  step_src_ = src;
  step_seen_ = -1;
  draws_in_step_ = 0;
}

}  // namespace ht
