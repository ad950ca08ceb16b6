// The Dataset interface the loader reads from, and a wrapper that applies a transform to each sample.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "hadatrain/data/image.h"
#include "hadatrain/data/sample_rng.h"
#include "hadatrain/data/transforms.h"

namespace ht::data {

// A finite, indexable set of labelled images. get() is called concurrently from the loader's worker threads
// and must be thread-safe; any randomness must come from `rng` (Note [Data randomness]).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index, SampleRng& rng) const = 0;
  // Where sample `index` comes from, for error messages ("record 17 of .../data_batch_2.bin", a file path).
  virtual std::string describe_sample(int64_t index) const;
};

// `base` with `transform` applied to every image it returns.
class TransformedDataset final : public Dataset {
 public:
  TransformedDataset(std::shared_ptr<const Dataset> base, Transform transform);
  int64_t size() const override { return base_->size(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe_sample(int64_t index) const override { return base_->describe_sample(index); }

 private:
  std::shared_ptr<const Dataset> base_;
  Transform transform_;
};

std::shared_ptr<const Dataset> with_transform(std::shared_ptr<const Dataset> base, Transform transform);

}  // namespace ht::data
