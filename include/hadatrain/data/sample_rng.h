// The random stream a sample's augmentations (and an epoch's shuffle) draw from.
//
// Note [Data randomness]
// Every random choice of the data layer comes from Philox4x32-10 (tensor/philox.h) keyed by the loader's
// seed, in a stream that names what it is for:
//     stream = purpose (bits 63..62) | epoch (bits 61..40) | sample index (bits 39..0)
// purpose 0 = the augmentations of dataset sample i in epoch e; purpose 1 = the shuffle of epoch e (index 0);
// purpose 2 = the choice of a text corpus's validation documents (epoch 0, index 0; text_dataset.h);
// purpose 3 = the Mixup/CutMix draws of batch b of epoch e (index b; data/mix.h).
// Draw k of a stream is philox_word(seed, stream, k). A sample's crop and flip therefore depend only on
// (seed, epoch, dataset index): not on the worker thread that assembles it, the batch it lands in, the
// number of workers, or what was drawn before - and a run resumed from (epoch, batch) repeats them exactly.
// Epochs up to 2^22 and dataset indices up to 2^40 are accepted; larger values are an error.
#pragma once
#include <cstdint>

#include "hadatrain/tensor/philox.h"

namespace ht::data {

enum class RngPurpose : uint8_t { augment = 0, shuffle = 1, split = 2, mix = 3 };

inline constexpr int64_t kMaxRngEpoch = (int64_t{1} << 22) - 1;
inline constexpr int64_t kMaxRngIndex = (int64_t{1} << 40) - 1;

// The Philox stream id for (purpose, epoch, index) (Note [Data randomness]); throws when out of range.
uint64_t data_stream(RngPurpose purpose, int64_t epoch, int64_t index);

class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  // The augmentation stream of dataset sample `index` in `epoch`.
  static SampleRng for_sample(uint64_t seed, int64_t epoch, int64_t index) {
    return {seed, data_stream(RngPurpose::augment, epoch, index)};
  }
  // The shuffle stream of `epoch`.
  static SampleRng for_shuffle(uint64_t seed, int64_t epoch) { return {seed, data_stream(RngPurpose::shuffle, epoch, 0)}; }

  // Draw k = philox_word(seed, stream, k); each call below consumes the number of words it says.
  uint32_t next_u32();
  // Two words, the first one in the low half.
  uint64_t next_u64();
  // One word: uniform_from_word (24 bits, [0, 1)).
  float uniform() { return uniform_from_word(next_u32()); }
  // One word: lo + (hi - lo) * uniform().
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // One word: an integer in [lo, hi] (inclusive) by multiply-shift, lo + (w * (hi - lo + 1)) >> 32.
  // The range must hold at most 2^32 values (the bias is below range / 2^32).
  int64_t randint(int64_t lo, int64_t hi);
  // Two words (next_u64): an integer in [0, n) by 64-bit multiply-shift, for shuffles of any size.
  uint64_t below(uint64_t n);

  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t draws() const { return next_; }  // words consumed so far

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t next_ = 0;
  uint64_t cached_block_ = ~uint64_t{0};
  uint32_t block_[4] = {0, 0, 0, 0};
};

}  // namespace ht::data
