// Replicated data parallelism (dist/data_parallel.h): batch slices per rank and the bucketed gradient
// all-reduce.
#include "hadatrain/dist/data_parallel.h"

#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/tensor/factory.h"

namespace ht::dist {

RankSlice rank_slice(int64_t batch_rows, int rank, int world) { return data::row_slice(batch_rows, rank, world); }

data::Batch slice_batch(const data::Batch& batch, RankSlice s) { return data::slice_rows(batch, s); }

GradientReducer::GradientReducer(Communicator& comm, nn::ParameterStore& store, GradientReducerOptions o)
    : comm_(comm), store_(store) {
  HT_CHECK(o.bucket_mb > 0, "dist.bucket_mb: expected a size > 0, got {}", o.bucket_mb);
  const auto cap = static_cast<int64_t>(o.bucket_mb * (1 << 20));
  // Buckets of consecutive trainable parameters of one dtype and device, in store order (the same on every
  // rank). A frozen parameter (requires_grad false: train.freeze, a LoRA base) is in no bucket: it gets no
  // gradient, so the optimiser neither keeps state for it nor steps it (weight decay included), and no bytes
  // of it go on the wire.
  int64_t trainable = 0, trainable_numel = 0;
  for (std::size_t i = 0; i < store_.size(); ++i) {
    const Tensor& p = *store_.params()[i].param;
    if (!p.requires_grad()) continue;
    ++trainable;
    trainable_numel += p.numel();
    HT_CHECK(p.device() == comm_.device(), "data parallel: parameter '{}' is on {} but the {} communicator works on {}",
             store_.params()[i].name, to_string(p.device()), comm_.engine(), to_string(comm_.device()));
    const int64_t bytes = static_cast<int64_t>(storage_bytes(p.dtype(), p.numel()));
    if (buckets_.empty() || buckets_.back().dtype != p.dtype() ||
        (buckets_.back().numel > 0 &&
         static_cast<int64_t>(storage_bytes(p.dtype(), buckets_.back().numel)) + bytes > cap)) {
      Bucket fresh;
      fresh.dtype = p.dtype();
      fresh.device = p.device();
      buckets_.push_back(std::move(fresh));
    }
    Bucket& b = buckets_.back();
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
  }
  // Every rank must reduce the same parameters (the freeze rules come from the config, whose hash the ranks
  // compare; this also catches a model frozen differently in code): one all-reduce of (n, -n) for the count
  // and the elements gives each's maximum and minimum over ranks.
  Tensor agree = empty({4}, {DType::i64, Device::cpu()});
  int64_t* a = agree.data<int64_t>();
  a[0] = trainable, a[1] = -trainable, a[2] = trainable_numel, a[3] = -trainable_numel;
  agree = agree.to(comm_.device());
  comm_.all_reduce(agree, ReduceOp::max)->wait();
  const Tensor got = agree.to(Device::cpu());
  const int64_t* g = got.data<int64_t>();
  HT_CHECK(g[0] == -g[1] && g[2] == -g[3],
           "data parallel: the ranks disagree on which parameters train: this rank (rank {}) has {} trainable "
           "parameter(s) of {} elements, the ranks range over {}..{} parameter(s) of {}..{} elements (check "
           "train.freeze and model.lora on every rank)",
           comm_.rank(), trainable, trainable_numel, -g[1], g[0], -g[3], g[2]);
}

void GradientReducer::reduce(double weight) {
  struct InFlight {
    const Bucket* bucket;
    Tensor flat;
    std::unique_ptr<Work> work;
  };
  std::vector<InFlight> flights;
  bytes_ = 0;
  for (const Bucket& b : buckets_) {
    Tensor flat = zeros({b.numel}, {b.dtype, b.device});  // (numel) the bucket's gradients, one after another
    for (std::size_t k = 0; k < b.params.size(); ++k) {
      const Tensor& g = store_.params()[b.params[k]].param->grad();
      if (g.defined()) copy_(flat.narrow(0, b.offsets[k], g.numel()), g.reshape({g.numel()}));
    }
    if (weight != 1.0) mul_(flat, weight);
    bytes_ += static_cast<int64_t>(flat.nbytes());
    auto work = comm_.all_reduce(flat, ReduceOp::sum);
    flights.push_back({&b, flat, std::move(work)});
  }
  for (InFlight& f : flights) {
    f.work->wait();
    for (std::size_t k = 0; k < f.bucket->params.size(); ++k) {
      Tensor& p = *store_.params()[f.bucket->params[k]].param;
      const Tensor summed = f.flat.narrow(0, f.bucket->offsets[k], p.numel()).reshape(p.shape());
      if (p.grad().defined()) copy_(p.grad(), summed);
      else p.set_grad(summed.clone());
    }
  }
}

void GradientReducer::broadcast_state(int root) {
  std::vector<std::pair<Tensor, std::unique_ptr<Work>>> flights;
  for (const auto& [name, t] : store_.state_dict()) {
    HT_CHECK(t.is_contiguous(), "data parallel: '{}' {} is not contiguous and cannot be broadcast", name,
             t.describe());
    flights.emplace_back(t, comm_.broadcast(t, root));
  }
  for (auto& f : flights) f.second->wait();
}

}  // namespace ht::dist
