// The text loader: batches of rows of a TextDataset as named tensors input_ids (B,T) i64 and labels (B,T) i64
// (LabelLayout says how the labels line up),
// in a per-epoch Philox permutation of the rows keyed like the image loader's (epoch_order in loader.h), with
// the same resumable position (epoch, batch). Its interface matches DataLoader's (next, position, seek,
// batches_per_epoch), so a training loop drives either the same way.
//
//   TextLoader loader(train_set, {.batch_size = 8, .seed = cfg.run.seed});
//   while (auto b = loader.next()) step(b->at(data::batch_key::input_ids), b->at(data::batch_key::labels));
//
// Rows are copied out of the memory-mapped token file in the caller's thread: a batch of B*T tokens is a few
// memcpy's, far below the cost of a training step, so there are no worker threads to keep in order.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "hadatrain/data/loader.h"
#include "hadatrain/data/text_dataset.h"

namespace ht::data {

// How a batch's labels line up with its input_ids. A TextDataset yields next-token labels; the loader hands them
// over in either layout (train/causal_lm.h reads both: CausalLmOptions::labels).
enum class LabelLayout : uint8_t {
  // labels[b][t] = the token after input_ids[b][t] (or -100): the loss scores logits[t] against labels[t].
  next_token,
  // Hugging Face's convention: labels[b][t] = input_ids[b][t]'s own token
  // where it is a target (else -100) and the loss scores logits[t] against labels[t+1]. Made from the
  // next-token labels as labels[t] = next[t-1], labels[0] = -100, so the row's last target (next[T-1]) is not
  // used: T-1 targets per row instead of T.
  same_position,
};

struct TextLoaderOptions {
  int64_t batch_size = 8;
  LabelLayout labels = LabelLayout::next_token;
  uint64_t seed = 0;  // the shuffle key (Note [Data randomness])
  Shuffle shuffle = Shuffle::on;
  DropLast drop_last = DropLast::no;
  int64_t min_last_batch = 1;  // as LoaderOptions::min_last_batch
  // Batches in page-locked host memory for asynchronous copies to pin_device (Note [Pinned batches]).
  bool pin_memory = false;
  Device pin_device = Device::cuda(0);
};

class TextLoader {
 public:
  TextLoader(std::shared_ptr<const TextDataset> dataset, TextLoaderOptions opts, LoaderPosition start = {});

  // The next batch of the current epoch, or nullopt once the epoch is over (the following call starts the
  // next epoch). Batch b of epoch e holds rows epoch_order(size, seed, e)[b*B, (b+1)*B); Batch::indices are
  // those row numbers and Batch::position is (e, b). A failure names the epoch, batch, row and its source.
  std::optional<Batch> next();

  LoaderPosition position() const { return pos_; }
  // Continues from `pos`: next() then returns exactly what an uninterrupted loader returns from there.
  void seek(LoaderPosition pos);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t dataset_size() const { return dataset_->size(); }
  int64_t samples_per_epoch() const { return dataset_->size(); }  // rows; as DataLoader's
  int64_t seq_len() const { return dataset_->seq_len(); }
  const TextLoaderOptions& options() const { return opts_; }

  // Batch `pos` made directly, without moving the loader.
  Batch make_batch(LoaderPosition pos);

 private:
  std::shared_ptr<const TextDataset> dataset_;
  TextLoaderOptions opts_;
  int64_t batches_per_epoch_ = 0;
  LoaderPosition pos_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;  // epoch_order of order_epoch_
};

}  // namespace ht::data
