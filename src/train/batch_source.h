// Where the training loop and evaluation get their batches: the image loader (data/loader.h) or the text
// loader (data/text_loader.h) behind one interface, so the loop knows neither. Internal to src/train.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "hadatrain/data/loader.h"
#include "hadatrain/nn/module.h"
#include "hadatrain/train/task.h"

namespace ht::train {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next batch of the current epoch, or nullopt at its end (the following call starts the next epoch).
  virtual std::optional<data::Batch> next() = 0;
  virtual data::LoaderPosition position() const = 0;
  // Continues from `pos` exactly as an uninterrupted source would.
  virtual void seek(data::LoaderPosition pos) = 0;
  virtual int64_t batches_per_epoch() const = 0;
  // Samples (images, or text rows) per epoch, the batches' rows together before any is dropped.
  virtual int64_t samples_per_epoch() const = 0;
};

// A BatchSource over any loader with DataLoader's next / position / seek / batches_per_epoch / samples_per_epoch.
template <class Loader>
class LoaderSource final : public BatchSource {
 public:
  template <class... Args>
  explicit LoaderSource(Args&&... args) : loader_(std::forward<Args>(args)...) {}
  std::optional<data::Batch> next() override { return loader_.next(); }
  data::LoaderPosition position() const override { return loader_.position(); }
  void seek(data::LoaderPosition pos) override { loader_.seek(pos); }
  int64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  int64_t samples_per_epoch() const override { return loader_.samples_per_epoch(); }

 private:
  Loader loader_;
};

// evaluate() (task.h) over one epoch of `source`.
inline EvalResult evaluate(nn::Module& model, const Task& task, BatchSource& source, Device device) {
  return evaluate(model, task, [&] { return source.next(); }, device);
}

}  // namespace ht::train
