// The text loader: per-epoch permutations of a TextDataset's rows, batches of input_ids and labels, and
// resumable positions.
#include "hadatrain/data/text_loader.h"

#include <algorithm>

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/factory.h"

namespace ht::data {

TextLoader::TextLoader(std::shared_ptr<const TextDataset> dataset, TextLoaderOptions opts, LoaderPosition start)
    : dataset_(std::move(dataset)), opts_(opts) {
  HT_CHECK(dataset_ != nullptr, "TextLoader: no dataset");
  const int64_t n = dataset_->size();
  HT_CHECK(n > 0, "TextLoader: the dataset has no rows");
  HT_CHECK(opts_.batch_size > 0, "TextLoader: batch_size must be positive, got {}", opts_.batch_size);
  HT_CHECK(n - 1 <= kMaxRngIndex, "TextLoader: {} rows is more than the data RNG supports", n);
  batches_per_epoch_ = epoch_batches(n, opts_.batch_size, opts_.drop_last, opts_.min_last_batch);
  HT_CHECK(batches_per_epoch_ > 0,
           "TextLoader: {} rows of seq_len {} in batches of {} give no batch ({}); lower the batch size or seq_len, or "
           "add text",
           n, dataset_->seq_len(), opts_.batch_size, no_batch_reason(opts_.drop_last, opts_.min_last_batch));
  seek(start);
}

void TextLoader::seek(LoaderPosition pos) {
  HT_CHECK(pos.epoch >= 0 && pos.epoch <= kMaxRngEpoch, "TextLoader::seek: epoch {} is outside [0, {}]", pos.epoch,
           kMaxRngEpoch);
  HT_CHECK(pos.batch >= 0 && pos.batch <= batches_per_epoch_,
           "TextLoader::seek: batch {} is outside [0, {}] (batches per epoch with batch_size {})", pos.batch,
           batches_per_epoch_, opts_.batch_size);
  pos_ = pos;
}

Batch TextLoader::make_batch(LoaderPosition pos) {
  HT_CHECK(pos.batch >= 0 && pos.batch < batches_per_epoch_, "TextLoader: batch {} is outside [0, {})", pos.batch,
           batches_per_epoch_);
  if (order_epoch_ != pos.epoch) {
    order_ = epoch_order(dataset_->size(), opts_.seed, pos.epoch, opts_.shuffle);
    order_epoch_ = pos.epoch;
  }
  const int64_t n = dataset_->size(), T = dataset_->seq_len();
  const int64_t begin = pos.batch * opts_.batch_size;
  const int64_t count = std::min(opts_.batch_size, n - begin);
  Batch b;
  b.position = pos;
  b.indices.assign(order_.begin() + begin, order_.begin() + begin + count);
  auto host_tensor = [&](const Shape& shape) {
    return opts_.pin_memory ? empty_pinned(shape, DType::i64, opts_.pin_device) : empty(shape, {DType::i64, Device::cpu()});
  };
  Tensor ids = host_tensor({count, T});     // (B, T)
  Tensor labels = host_tensor({count, T});  // (B, T)
  for (int64_t k = 0; k < count; ++k) {
    const int64_t row = b.indices[static_cast<std::size_t>(k)];
    try {
      int64_t* l = labels.data<int64_t>() + k * T;
      dataset_->get(row, ids.data<int64_t>() + k * T, l);
      if (opts_.labels == LabelLayout::same_position) {  // l[t] = next[t-1], l[0] = -100
        std::copy_backward(l, l + T - 1, l + T);
        l[0] = kIgnoreIndex;
      }
    } catch (const std::exception& e) {
      HT_FAIL("text loader: epoch {}, batch {}, row {} ({}): {}", pos.epoch, pos.batch, row, dataset_->describe(row),
              e.what());
    }
  }
  b.set(batch_key::input_ids, std::move(ids));
  b.set(batch_key::labels, std::move(labels));
  return b;
}

std::optional<Batch> TextLoader::next() {
  if (pos_.batch >= batches_per_epoch_) {
    pos_ = {pos_.epoch + 1, 0};
    return std::nullopt;
  }
  Batch b = make_batch(pos_);
  ++pos_.batch;
  return b;
}

}  // namespace ht::data
