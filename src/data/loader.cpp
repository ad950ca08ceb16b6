// The data loader: per-epoch Philox shuffles, worker threads assembling batches into a bounded reorder
// queue, in-order delivery, error propagation and resumable positions.
#include "hadatrain/data/loader.h"

#include <algorithm>
#include <numeric>

#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"

namespace ht::data {

// Note [Loader ordering]
// The loader produces a stream of batches numbered s = 0, 1, 2, ... from the position it was started or
// seeked to; batch s is batch b of epoch e (position_of), and it is fully determined by (seed, e, b): its rows
// are epoch_order(e)[b*B, (b+1)*B) and row idx is made with SampleRng::for_sample(seed, e, idx). A worker
// claims the lowest unclaimed s, builds the whole batch (decode, augment, normalise into the batch tensor)
// and files it in a map keyed by s; the consumer takes s = 0, 1, 2, ... from the map, waiting when the next
// one is not there yet. Which worker built a batch, and when, cannot change its content or its place in
// the stream, so the batches are identical for any number of workers (0 = built inside next()). A worker
// may claim s only while s < consumed + prefetch, which bounds the memory held by batches in flight.
// The stream runs across epoch boundaries (the next epoch's first batches are prefetched while the
// consumer finishes the current one); next() reports each boundary once by returning nullopt.
// A failure while building batch s is stored in its slot and thrown by the consumer when s is due, so
// every batch before it is still delivered, in order.

// Note [Pinned batches]
// With LoaderOptions::pin_memory the workers allocate each batch's images and labels with empty_pinned
// (page-locked host memory from the CUDA backend's pinned-host cache, allocated with pin_device current so a
// worker thread touches no other GPU) and fill them exactly as they fill
// pageable tensors, so the values are identical. The consumer's `batch.to(cuda)` is then one cudaMemcpyAsync
// per tensor on the current stream, each returning at once (ops/copy.cpp). Lifetime rule: the consumer may
// drop the batch as soon as it has issued the copy; the memory is not reused until the copy has completed,
// because every copy records an event against its pinned block and a freed block is handed out again only
// after its events have fired (Note [Pinned host memory] in src/cuda/runtime/pinned_host.cpp). What the consumer must not
// do is write into a batch's host tensors after starting its copy. Fresh blocks are only allocated while
// the cache warms up (prefetch + a few batches in flight); after that, batches recycle the same blocks.

RowSlice row_slice(int64_t batch_rows, int index, int count) {
  HT_CHECK(count >= 1 && index >= 0 && index < count, "row_slice: slice {} of {} does not exist", index, count);
  HT_CHECK(batch_rows >= count,
           "a batch of {} rows cannot be cut over {} ranks (each needs at least one row): make data.batch_size a "
           "multiple of the world size, or set the dataset size so that the last batch has enough rows",
           batch_rows, count);
  const int64_t base = batch_rows / count, extra = batch_rows % count;
  return {.start = index * base + std::min<int64_t>(index, extra), .rows = base + (index < extra ? 1 : 0)};
}

int64_t epoch_batches(int64_t rows, int64_t batch_size, DropLast drop_last, int64_t min_last_batch) {
  HT_CHECK(min_last_batch >= 1, "loader: min_last_batch must be >= 1, got {}", min_last_batch);
  const int64_t rest = rows % batch_size;
  const bool last = drop_last == DropLast::no && rest > 0 && rest >= min_last_batch;
  return rows / batch_size + (last ? 1 : 0);
}

std::string no_batch_reason(DropLast drop_last, int64_t min_last_batch) {
  return drop_last == DropLast::yes ? "drop_last keeps full batches only"
                                    : fmt::format("a batch needs at least {} rows", min_last_batch);
}

Batch slice_rows(const Batch& batch, RowSlice s) {
  Batch out;
  out.position = batch.position;
  out.global_rows = batch.global_rows > 0 ? batch.global_rows : batch.size();
  for (const auto& [key, t] : batch.tensors) {
    HT_CHECK(t.dim() >= 1 && t.size(0) >= s.start + s.rows, "slice_rows: tensor '{}' {} has no rows [{}, {})", key,
             t.describe(), s.start, s.start + s.rows);
    out.set(key, t.narrow(0, s.start, s.rows));
  }
  if (!batch.indices.empty())
    out.indices.assign(batch.indices.begin() + s.start, batch.indices.begin() + s.start + s.rows);
  return out;
}

int64_t Batch::size() const {
  return tensors.empty() ? static_cast<int64_t>(indices.size()) : tensors.begin()->second.size(0);
}

const Tensor& Batch::at(std::string_view key) const {
  const auto it = tensors.find(key);
  if (it != tensors.end()) return it->second;
  std::string have;
  for (const auto& [k, t] : tensors) have += (have.empty() ? "" : ", ") + k;
  HT_FAIL("the batch has no tensor '{}' (it has: {})", key, have.empty() ? "none" : have);
}

Batch& Batch::set(std::string_view key, Tensor t) {
  tensors.insert_or_assign(std::string(key), std::move(t));
  return *this;
}

Batch Batch::to(Device device) const {
  Batch out;
  for (const auto& [k, t] : tensors) out.tensors.emplace(k, to_device(t, device));
  out.indices = indices;
  out.position = position;
  out.global_rows = global_rows;
  return out;
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, Shuffle shuffle) {
  HT_CHECK(n >= 0, "epoch_order: negative size {}", n);
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle == Shuffle::off) return order;
  SampleRng rng = SampleRng::for_shuffle(seed, epoch);
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

// Note [Repeated augmentation]
// With LoaderOptions::repeats = k > 1 (Hoffer et al. 2020; torchvision's RASampler for one process, the
// --ra-sampler of its ViT recipes) epoch e's samples are the shuffled order with each index repeated k times in a
// row, cut to the dataset's size rounded down to a multiple of 256 (the whole size below 256): about 1/k of the
// images per epoch, each k times in the same or the next batch with independent augmentations, and an epoch of
// about the usual length. Position p holds the virtual index v = i + c·N (i = order[p / k], copy c = p % k, N
// the dataset's size): the sample is dataset index v mod N, drawn with SampleRng::for_sample(seed, e, v), so copy
// 0 draws what the sample draws without repeats and every copy its own stream. Sliced and resumed batches follow
// (Note [Sliced batches], [Loader ordering]): a row's bits depend only on (seed, e, v).
int64_t repeated_epoch_length(int64_t n) { return n >= 256 ? n / 256 * 256 : n; }

std::vector<int64_t> repeated_order(const std::vector<int64_t>& order, int64_t repeats) {
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t length = repeated_epoch_length(n);
  std::vector<int64_t> out(static_cast<std::size_t>(length));
  for (int64_t p = 0; p < length; ++p)
    out[static_cast<std::size_t>(p)] = order[static_cast<std::size_t>(p / repeats)] + (p % repeats) * n;
  return out;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions opts, LoaderPosition start)
    : dataset_(std::move(dataset)), opts_(std::move(opts)) {
  HT_CHECK(dataset_ != nullptr, "DataLoader: no dataset");
  const int64_t n = dataset_->size();
  HT_CHECK(n > 0, "DataLoader: the dataset is empty");
  HT_CHECK(opts_.batch_size > 0, "DataLoader: batch_size must be positive, got {}", opts_.batch_size);
  HT_CHECK(opts_.num_workers >= 0, "DataLoader: num_workers must be >= 0, got {}", opts_.num_workers);
  HT_CHECK(opts_.prefetch >= 1, "DataLoader: prefetch must be >= 1, got {}", opts_.prefetch);
  HT_CHECK(opts_.slice_count >= 1 && opts_.slice_index >= 0 && opts_.slice_index < opts_.slice_count,
           "DataLoader: slice {} of {} does not exist", opts_.slice_index, opts_.slice_count);
  HT_CHECK(opts_.repeats >= 1, "DataLoader: repeats must be >= 1, got {}", opts_.repeats);
  HT_CHECK(opts_.repeats == 1 || opts_.shuffle == Shuffle::on, "DataLoader: repeats without shuffling");
  HT_CHECK(n * opts_.repeats - 1 <= kMaxRngIndex, "DataLoader: {} samples x {} repeats is more than the data RNG "
           "supports", n, opts_.repeats);
  epoch_length_ = opts_.repeats > 1 ? repeated_epoch_length(n) : n;
  batches_per_epoch_ = epoch_batches(epoch_length_, opts_.batch_size, opts_.drop_last, opts_.min_last_batch);
  HT_CHECK(batches_per_epoch_ > 0, "DataLoader: {} samples per epoch in batches of {} give no batch ({})",
           epoch_length_, opts_.batch_size, no_batch_reason(opts_.drop_last, opts_.min_last_batch));
  seek(start);
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::seek(LoaderPosition pos) {
  HT_CHECK(pos.epoch >= 0 && pos.epoch <= kMaxRngEpoch, "DataLoader::seek: epoch {} is outside [0, {}]", pos.epoch,
           kMaxRngEpoch);
  HT_CHECK(pos.batch >= 0 && pos.batch <= batches_per_epoch_,
           "DataLoader::seek: batch {} is outside [0, {}] (batches per epoch with batch_size {})", pos.batch,
           batches_per_epoch_, opts_.batch_size);
  stop_workers();
  pos_ = pos;
  stream_start_ = pos;
  consumed_ = 0;
  failed_ = nullptr;
}

LoaderPosition DataLoader::position_of(int64_t sequence) const {
  const int64_t linear = stream_start_.epoch * batches_per_epoch_ + stream_start_.batch + sequence;
  return {linear / batches_per_epoch_, linear % batches_per_epoch_};
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::order_for(int64_t epoch) {
  std::lock_guard<std::mutex> lock(order_mu_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  std::vector<int64_t> o = epoch_order(dataset_->size(), opts_.seed, epoch, opts_.shuffle);
  if (opts_.repeats > 1) o = repeated_order(o, opts_.repeats);  // virtual indices (Note [Repeated augmentation])
  auto order = std::make_shared<const std::vector<int64_t>>(std::move(o));
  orders_[epoch] = order;
  while (orders_.size() > 3) orders_.erase(orders_.begin());  // keep the latest epochs only
  return order;
}

// Note [Sliced batches]
// Under data parallelism each rank trains on its slice of every global batch. If every rank made the whole
// batch and kept its slice, each would read and decode every sample (world-size times one process's data work;
// on ImageNet the JPEG decoding would bound the step). With LoaderOptions::slice_count > 1 the loader makes
// only its slice's rows: the epoch order is the whole dataset's, the batch's rows are cut by row_slice, and each
// sample's randomness is keyed by (seed, epoch, dataset index) (Note [Data randomness]), so every row has the
// bits it has in the whole batch. A batch_transform may read every row (Mixup/CutMix pair rows), so with one the
// whole batch is made, transformed and cut. Batch::global_rows says how many rows the whole batch has: the
// trainer weighs this rank's loss by its share of them and counts the global batch's throughput.
Batch DataLoader::make_batch(LoaderPosition pos) {
  const auto order = order_for(pos.epoch);  // virtual indices v: dataset index v mod n, augmentation key v
  const int64_t n = dataset_->size();
  const int64_t begin_all = pos.batch * opts_.batch_size;
  const int64_t whole = std::min(opts_.batch_size, epoch_length_ - begin_all);
  const bool sliced = opts_.slice_count > 1, cut_after = sliced && opts_.batch_transform;
  const RowSlice mine = sliced && !cut_after ? row_slice(whole, opts_.slice_index, opts_.slice_count)
                                             : RowSlice{0, whole};
  const int64_t begin = begin_all + mine.start, count = mine.rows;
  Batch b;
  b.position = pos;
  b.indices.assign(order->begin() + begin, order->begin() + begin + count);
  for (int64_t& i : b.indices) i %= n;  // the dataset indices; order holds the augmentation keys
  auto host_tensor = [&](const Shape& shape, DType dtype) {
    return opts_.pin_memory ? empty_pinned(shape, dtype, opts_.pin_device) : empty(shape, {dtype, Device::cpu()});
  };
  Tensor labels_t = host_tensor({count}, DType::i64);  // (B)
  int64_t* labels = labels_t.data<int64_t>();
  Tensor images;
  int64_t C = 0, H = 0, W = 0;  // geometry of row 0
  for (int64_t k = 0; k < count; ++k) {
    const int64_t idx = b.indices[static_cast<std::size_t>(k)];
    auto context = [&] {
      return fmt::format("data loader: epoch {}, batch {}, dataset index {} ({})", pos.epoch, pos.batch, idx,
                         dataset_->describe_sample(idx));
    };
    try {
      SampleRng rng = SampleRng::for_sample(opts_.seed, pos.epoch, (*order)[static_cast<std::size_t>(begin + k)]);
      const Sample s = dataset_->get(idx, rng);
      if (k == 0) {
        C = s.image.channels, H = s.image.height, W = s.image.width;
        opts_.normalize.check(C);
        images = host_tensor({count, C, H, W}, DType::f32);  // (B, C, H, W)
      }
      HT_CHECK(s.image.channels == C && s.image.height == H && s.image.width == W,
               "the image is {} but the first image of the batch is {}x{}x{}: give the dataset a transform that "
               "makes every image the same size (e.g. a crop)",
               s.image.describe(), C, H, W);
      normalize_into(s.image, opts_.normalize, images.data<float>() + k * C * H * W);
      labels[k] = s.label;
    } catch (const InternalError& e) {
      throw InternalError(fmt::format("{}: {}", context(), e.what()));
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: {}", context(), e.what()));
    }
  }
  b.set(batch_key::image, std::move(images));
  b.set(batch_key::label, std::move(labels_t));
  if (opts_.batch_transform) opts_.batch_transform(b);
  if (cut_after) return slice_rows(b, row_slice(whole, opts_.slice_index, opts_.slice_count));
  if (sliced) b.global_rows = whole;
  return b;
}

DataLoader::Slot DataLoader::make_slot(LoaderPosition pos) {
  Slot slot;
  try {
    slot.batch = make_batch(pos);
  } catch (...) {
    slot.error = std::current_exception();
  }
  return slot;
}

void DataLoader::start_workers() {
  HT_ASSERT(workers_.empty(), "DataLoader: workers already running");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    next_claim_ = 0;
    ready_.clear();
  }
  for (int i = 0; i < opts_.num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  ready_.clear();
  next_claim_ = 0;
}

void DataLoader::worker_loop() {
  for (;;) {
    int64_t s;
    {
      std::unique_lock<std::mutex> lock(mu_);
      space_cv_.wait(lock, [&] { return stop_ || next_claim_ < consumed_ + opts_.prefetch; });
      if (stop_) return;
      s = next_claim_++;
    }
    Slot slot = make_slot(position_of(s));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace(s, std::move(slot));
    }
    ready_cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  if (failed_) std::rethrow_exception(failed_);
  if (pos_.batch >= batches_per_epoch_) {
    pos_ = {pos_.epoch + 1, 0};
    return std::nullopt;
  }
  Slot slot;
  if (opts_.num_workers == 0) {
    slot = make_slot(pos_);
    ++consumed_;
  } else {
    if (workers_.empty()) start_workers();
    std::unique_lock<std::mutex> lock(mu_);
    ready_cv_.wait(lock, [&] { return ready_.count(consumed_) > 0; });
    auto node = ready_.extract(consumed_);
    slot = std::move(node.mapped());
    ++consumed_;
    lock.unlock();
    space_cv_.notify_all();
  }
  if (slot.error) {
    failed_ = slot.error;
    std::rethrow_exception(failed_);
  }
  HT_ASSERT(slot.batch && slot.batch->position == pos_, "DataLoader: batch ({}, {}) arrived at position ({}, {})",
            slot.batch ? slot.batch->position.epoch : -1, slot.batch ? slot.batch->position.batch : -1, pos_.epoch,
            pos_.batch);
  ++pos_.batch;
  return std::move(slot.batch);
}

}  // namespace ht::data
