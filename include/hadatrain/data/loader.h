// The data loader: deterministic per-epoch shuffling, worker threads that assemble whole batches into a
// bounded prefetch queue, batches delivered in the same order for any worker count, and a resumable
// position (epoch, batch) for checkpoints. See Note [Loader ordering] in loader.cpp and docs/data.md.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "hadatrain/data/dataset.h"
#include "hadatrain/data/transforms.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::data {

enum class Shuffle : uint8_t { off, on };
enum class DropLast : uint8_t {
  no,   // the last batch of an epoch may be smaller
  yes,  // only full batches
};

struct Batch;

struct LoaderOptions {
  int64_t batch_size = 128;
  int num_workers = 2;   // 0: batches are made in the consumer's thread, inside next()
  int prefetch = 4;      // batches being made or waiting, at most (>= 1); keep >= num_workers
  uint64_t seed = 0;     // shuffle and augmentation key (Note [Data randomness])
  Shuffle shuffle = Shuffle::on;
  DropLast drop_last = DropLast::no;
  // With DropLast::no, the epoch's last, partial batch is dropped when it holds fewer rows than this
  // (epoch_batches below). Data-parallel training sets the world size: every rank needs a row of every batch.
  int64_t min_last_batch = 1;
  Normalize normalize = Normalize::unit();
  // Assemble batches in page-locked host memory (empty_pinned), so that copying them to a CUDA device is
  // asynchronous (Note [Pinned batches] in loader.cpp). The batches hold the same values either way; a no-op
  // in a CPU-only build or without a visible CUDA device. The trainer sets it when training on CUDA.
  bool pin_memory = false;
  Device pin_device = Device::cuda(0);  // with pin_memory: the CUDA device the batches will be copied to
  // Run on each finished batch in the worker that made it (e.g. Mixup/CutMix, data/mix.h). It must depend
  // only on the batch (its tensors, indices and position) so that batches stay the same for any worker count
  // and after a seek.
  std::function<void(Batch&)> batch_transform;
  // Data parallelism: make only slice `slice_index` of `slice_count` of each batch (row_slice), so that each
  // process reads and decodes its own rows only (Note [Sliced batches] in loader.cpp). The rows equal those of
  // the whole batch cut afterwards; Batch::global_rows keeps the whole batch's size. With a batch_transform
  // (which may mix rows) the whole batch is made, transformed and then cut.
  int slice_index = 0;
  int slice_count = 1;
  // Repeated augmentation (Note [Repeated augmentation] in loader.cpp): every index of the epoch's order appears
  // this many times in a row, each copy with its own augmentation, and the epoch keeps about the dataset's size.
  // 1: off.
  int64_t repeats = 1;
};

// Where the loader stands: the next batch next() returns is batch `batch` of epoch `epoch`. This is what a
// checkpoint stores; batch == batches_per_epoch() means the epoch is done but its end not yet reported.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

// The names of a batch's tensors. The loader fills image and label; a task says which keys it needs
// (Task::required_keys), so the text loader (text_loader.h) fills others without changing Batch.
namespace batch_key {
inline constexpr std::string_view image = "image";  // (B, C, H, W) f32, normalised
inline constexpr std::string_view label = "label";  // (B) i64 class index
inline constexpr std::string_view input_ids = "input_ids";  // (B, T) i64 token ids
inline constexpr std::string_view labels = "labels";  // (B, T) i64: labels[b][t] = the token after input t, -100 = no loss
}  // namespace batch_key

// One batch: named tensors whose dim 0 is the batch, in host memory from the loader (page-locked with
// LoaderOptions::pin_memory) until the consumer moves it to the device with to(); from pinned memory that
// copy is asynchronous.
struct Batch {
  std::map<std::string, Tensor, std::less<>> tensors;
  std::vector<int64_t> indices;  // (B) dataset index of each row; empty for a batch made by hand
  LoaderPosition position;       // which batch of the loader this is
  // The rows of the whole batch when this one is a slice of it (LoaderOptions::slice_count, slice_rows);
  // 0: the batch is whole.
  int64_t global_rows = 0;

  // Rows: dim 0 of the tensors (the number of indices when there are no tensors).
  int64_t size() const;
  bool has(std::string_view key) const { return tensors.find(key) != tensors.end(); }
  // The tensor named `key`; throws ht::Error naming the key and the keys the batch has when it is missing.
  const Tensor& at(std::string_view key) const;
  Batch& set(std::string_view key, Tensor t);
  // Every tensor copied to `device` (indices and position kept).
  Batch to(Device device) const;
};

// A batch of `batch_rows` rows cut into `count` slices of consecutive rows, sizes as even as possible (the first
// batch_rows mod count one row larger): slice `index`'s rows [start, start + rows). The cut data parallelism
// uses (one slice per rank, Note [Data-parallel equivalence] in dist/data_parallel.h); a batch with fewer rows
// than slices is an error naming the sizes.
struct RowSlice {
  int64_t start = 0, rows = 0;
};
RowSlice row_slice(int64_t batch_rows, int index, int count);
// Batches of an epoch of `rows` rows: the full ones, and the partial last one when drop_last is DropLast::no and it
// holds at least min_last_batch (>= 1, else an error) rows. no_batch_reason: why that count is 0, for the loaders'
// errors.
int64_t epoch_batches(int64_t rows, int64_t batch_size, DropLast drop_last, int64_t min_last_batch);
std::string no_batch_reason(DropLast drop_last, int64_t min_last_batch);
// The rows [start, start + rows) of every tensor of `batch` (views, no copy), with their indices; global_rows
// is the whole batch's size.
Batch slice_rows(const Batch& batch, RowSlice slice);

// The sample order of an epoch: a Fisher-Yates shuffle of 0..n-1 drawing j = below(i + 1) for i = n-1 .. 1
// from SampleRng::for_shuffle(seed, epoch), or the identity with Shuffle::off.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, Shuffle shuffle);
// Epoch `order` (dataset indices) with every index repeated `repeats` times in a row, cut to the size rounded down
// to a multiple of 256 (the whole size below 256), as virtual indices i + copy * size (Note [Repeated augmentation]).
std::vector<int64_t> repeated_order(const std::vector<int64_t>& order, int64_t repeats);
// The samples of such an epoch for a dataset of n: n rounded down to a multiple of 256, or n below 256.
int64_t repeated_epoch_length(int64_t n);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions opts, LoaderPosition start = {});
  ~DataLoader();  // stops and joins the workers
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch of the current epoch, or nullopt once the epoch is over (the following call starts the
  // next epoch). A failure while making a batch (e.g. a corrupt file) is thrown here, when that batch is
  // due, as ht::Error naming the epoch, batch, dataset index and sample (file or record); the loader then
  // keeps throwing it until seek().
  std::optional<Batch> next();

  LoaderPosition position() const { return pos_; }
  // Continues from `pos` (drops prefetched batches); next() then returns exactly what an uninterrupted
  // loader would have returned from that point.
  void seek(LoaderPosition pos);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t samples_per_epoch() const { return epoch_length_; }  // the dataset's size, unless repeats > 1
  int64_t dataset_size() const { return dataset_->size(); }
  const LoaderOptions& options() const { return opts_; }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  LoaderPosition position_of(int64_t sequence) const;
  std::shared_ptr<const std::vector<int64_t>> order_for(int64_t epoch);
  Batch make_batch(LoaderPosition pos);
  Slot make_slot(LoaderPosition pos);
  void start_workers();
  void stop_workers();
  void worker_loop();

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions opts_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_length_ = 0;  // samples per epoch
  LoaderPosition pos_;        // consumer position
  LoaderPosition stream_start_;  // position of sequence number 0 for the producers
  int64_t consumed_ = 0;      // sequence number of the next batch the consumer takes
  std::exception_ptr failed_;

  // Shared with the workers (guarded by mu_).
  std::mutex mu_;
  std::condition_variable space_cv_, ready_cv_;
  bool stop_ = false;
  int64_t next_claim_ = 0;
  std::map<int64_t, Slot> ready_;
  std::vector<std::thread> workers_;

  std::mutex order_mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
};

}  // namespace ht::data
