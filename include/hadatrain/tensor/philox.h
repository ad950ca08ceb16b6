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

// A seeded generator handle passed explicitly to random ops (never global). `next_stream()` hands out
// fresh stream ids so successive calls (e.g. two dropout layers) draw independent numbers. A stream id
// drawn while a step graph is recorded would be replayed unchanged every step (Note [Step graphs]).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t next_stream() {
    note_step_capture_unsafe("it draws a random stream (dropout or another random op)");
    return counter_++;
  }
  uint64_t state() const { return counter_; }  // for checkpoints
  void set_state(uint64_t s) { counter_ = s; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace ht
