// Philox4x32-10, the counter-based generator used for every random number in hadatrain
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//
// Note [Philox stream layout]
// A random stream is identified by (seed, stream id). The 64-bit seed is the key; the 128-bit counter
// is (element index / 4 low, element index / 4 high, stream low, stream high), and one call yields four
// 32-bit words for elements 4k..4k+3. Element i therefore gets word i % 4 of block i / 4, independent of
// how the work is split between threads, so CPU and CUDA draw identical bits for the same
// (seed, stream, element). Streams derive from (layer, step, purpose) with philox_stream().
#pragma once
#include <array>
#include <cstdint>

#include "hadatrain/core/capture.h"
#include "hadatrain/tensor/scalar_types.h"  // HT_HD

namespace ht {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

HT_HD inline void philox_round(uint32_t c[4], const uint32_t k[2]) {
  constexpr uint64_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  const uint64_t p0 = M0 * c[0], p1 = M1 * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  const uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}

// One Philox4x32-10 block: ten rounds with the Weyl key schedule.
HT_HD inline void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    philox_round(c, k);
  }
  out[0] = c[0];
  out[1] = c[1];
  out[2] = c[2];
  out[3] = c[3];
}

inline PhiloxCounter philox4x32_10(const PhiloxCounter& ctr, const PhiloxKey& key) {
  PhiloxCounter out{};
  philox4x32_10(ctr.data(), key.data(), out.data());
  return out;
}

// The four 32-bit words of block `block` of stream `stream` under `seed`: out[j] is element 4·block + j's word
// (Note [Philox stream layout]). Loops over consecutive elements draw each block once instead of once per word.
HT_HD inline void philox_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                           static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  philox4x32_10(ctr, key, out);
}

// The 32-bit random word for element `index` of stream `stream` under `seed` (Note [Philox stream layout]).
HT_HD inline uint32_t philox_word(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t out[4];
  philox_block(seed, stream, index >> 2, out);
  return out[index & 3];
}

// Uniform float in [0, 1) from the top 24 bits of a word (exactly representable, never 1.0).
HT_HD inline float uniform_from_word(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }

// Stream id for (layer, step, purpose): a simple reversible packing (16 + 40 + 8 bits).
HT_HD inline uint64_t philox_stream(uint32_t layer, uint64_t step, uint32_t purpose) {
  return (static_cast<uint64_t>(layer & 0xFFFFu) << 48) | ((step & 0xFFFFFFFFFFull) << 8) | (purpose & 0xFFu);
}

// The step a step-keyed Generator reads (Note [Step-keyed streams]); grad::StepClock is one. `device_word`: the
// step field of philox_stream ((step mod 2^40) << 8, int64) in device memory, which kernels add to their stream
// when they run, or null (the host step goes into the stream itself).
struct StepSource {
  int64_t step = 0;
  const int64_t* device_word = nullptr;
};

// A random stream as a random op uses it: stream id under seed, plus *step_word (device memory, read by the kernel
// when it runs) when step_word is set.
struct RandomDraw {
  uint64_t seed = 0;
  uint64_t stream = 0;
  const int64_t* step_word = nullptr;
};

// Note [Step-keyed streams]
// A random op in a training step (dropout, drop path) draws its stream from the run's dropout generator. Unkeyed,
// draw() hands out the counter's next stream id, a host value that a recorded step graph would replay unchanged
// (Note [Step graphs]). Keyed by a step (key_by_step: the trainer's step clock), the k-th draw of step s uses
// stream philox_stream(k, s, kDrawPurpose): on the CPU, or without a device word, s is in the stream id; with one
// the id carries step 0 and the kernel adds the word, so the draw's arguments are the same at every step and the
// step can be recorded and replayed with each step's own masks. CPU and CUDA draw the same bits either way. The
// draw index restarts when the step changes; state() / set_state() are that index (an activation checkpoint
// rewinds it to recompute with the forward's masks; a resumed run starts its next step at 0 anyway), and the
// counter otherwise. state() is 0 in a step that has not drawn yet: a checkpoint taken before the step's first
// draw must rewind to draw 0, not to the previous step's count.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  // A fresh stream id from the counter (initialisation and other unkeyed uses). Not on a keyed generator.
  uint64_t next_stream();
  // The stream of a random op in a step: the counter's next id (unkeyed) or the step's next draw (keyed).
  RandomDraw draw();
  // Keys the streams by the step `src` holds from now on (it must outlive this generator's draws); nullptr unkeys.
  void key_by_step(const StepSource* src);
  bool keyed() const { return step_src_ != nullptr; }
  // For checkpoints. Keyed: the draws made in the source's current step, 0 before its first (draws_in_step_ still
  // counts the previous step's until draw() sees the new step).
  uint64_t state() const {
    if (step_src_ == nullptr) return counter_;
    return step_src_->step == step_seen_ ? draws_in_step_ : 0;
  }
  void set_state(uint64_t s) { (step_src_ != nullptr ? draws_in_step_ : counter_) = s; }

  static constexpr uint32_t kDrawPurpose = 0xD0;  // the purpose field of a keyed draw's stream

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  const StepSource* step_src_ = nullptr;
  int64_t step_seen_ = -1;
  uint64_t draws_in_step_ = 0;
};

}  // namespace ht
