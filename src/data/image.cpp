// Image helpers, the per-sample Philox stream (Note [Data randomness]) and the Dataset base pieces.
#include "hadatrain/data/image.h"

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/data/dataset.h"
#include "hadatrain/data/sample_rng.h"

namespace ht::data {

Image Image::zeros(int64_t height, int64_t width, int64_t channels, ImageLayout layout) {
  HT_CHECK(height >= 0 && width >= 0 && channels >= 0, "Image: negative size {}x{}x{}", channels, height, width);
  Image img;
  img.height = height;
  img.width = width;
  img.channels = channels;
  img.layout = layout;
  img.pixels.assign(static_cast<std::size_t>(height * width * channels), 0);
  return img;
}

std::string Image::describe() const {
  return fmt::format("{}x{}x{} ({})", channels, height, width, layout == ImageLayout::hwc ? "hwc" : "chw");
}

Image to_layout(const Image& img, ImageLayout layout) {
  if (img.layout == layout) return img;
  Image out = Image::zeros(img.height, img.width, img.channels, layout);
  for (int64_t c = 0; c < img.channels; ++c)
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x) out.at(c, y, x) = img.at(c, y, x);
  return out;
}

uint64_t data_stream(RngPurpose purpose, int64_t epoch, int64_t index) {
  HT_CHECK(epoch >= 0 && epoch <= kMaxRngEpoch, "data RNG: epoch {} is outside [0, {}]", epoch, kMaxRngEpoch);
  HT_CHECK(index >= 0 && index <= kMaxRngIndex, "data RNG: sample index {} is outside [0, {}]", index, kMaxRngIndex);
  return (static_cast<uint64_t>(purpose) << 62) | (static_cast<uint64_t>(epoch) << 40) | static_cast<uint64_t>(index);
}

uint32_t SampleRng::next_u32() {
  const uint64_t k = next_++;
  const uint64_t block = k >> 2;
  if (block != cached_block_) {
    // Same counter/key layout as philox_word (Note [Philox stream layout]), one block for four draws.
    const uint32_t ctr[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                             static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)};
    const uint32_t key[2] = {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
    philox4x32_10(ctr, key, block_);
    cached_block_ = block;
  }
  return block_[k & 3];
}

uint64_t SampleRng::next_u64() {
  const uint64_t lo = next_u32();
  const uint64_t hi = next_u32();
  return lo | (hi << 32);
}

int64_t SampleRng::randint(int64_t lo, int64_t hi) {
  HT_CHECK(lo <= hi, "SampleRng::randint: empty range [{}, {}]", lo, hi);
  const uint64_t range = static_cast<uint64_t>(hi - lo) + 1;
  HT_CHECK(range <= (uint64_t{1} << 32), "SampleRng::randint: range [{}, {}] holds more than 2^32 values", lo, hi);
  return lo + static_cast<int64_t>((static_cast<uint64_t>(next_u32()) * range) >> 32);
}

uint64_t SampleRng::below(uint64_t n) {
  HT_CHECK(n > 0, "SampleRng::below: n must be positive");
  const unsigned __int128 prod = static_cast<unsigned __int128>(next_u64()) * n;
  return static_cast<uint64_t>(prod >> 64);
}

std::string Dataset::describe_sample(int64_t index) const { return fmt::format("sample {}", index); }

TransformedDataset::TransformedDataset(std::shared_ptr<const Dataset> base, Transform transform)
    : base_(std::move(base)), transform_(std::move(transform)) {
  HT_CHECK(base_ != nullptr, "TransformedDataset: no base dataset");
  HT_CHECK(static_cast<bool>(transform_), "TransformedDataset: empty transform");
}

Sample TransformedDataset::get(int64_t index, SampleRng& rng) const {
  Sample s = base_->get(index, rng);
  s.image = transform_(std::move(s.image), rng);
  return s;
}

std::shared_ptr<const Dataset> with_transform(std::shared_ptr<const Dataset> base, Transform transform) {
  return std::make_shared<TransformedDataset>(std::move(base), std::move(transform));
}

}  // namespace ht::data
