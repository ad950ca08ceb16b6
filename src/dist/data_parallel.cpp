// Replicated data parallelism (dist/data_parallel.h): batch slices per rank and the bucketed gradient
// all-reduce.
#include "hadatrain/dist/data_parallel.h"

#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/tensor/factory.h"

namespace ht::dist {

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
  bucket_of_.assign(store_.size(), static_cast<std::size_t>(-1));
  for (std::size_t k = 0; k < buckets_.size(); ++k)
    for (const std::size_t i : buckets_[k].params) bucket_of_[i] = k;
  flights_.resize(buckets_.size());
  const std::weak_ptr<Armed> hooked = armed_;
  for (const Bucket& b : buckets_)
    for (const std::size_t i : b.params)
      store_.params()[i].param->register_post_accumulate_hook([this, hooked, i](Tensor&) {
        if (const auto a = hooked.lock(); a && a->on) on_gradient(i);
      });
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

int64_t GradientReducer::bucket_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += static_cast<int64_t>(storage_bytes(b.dtype, b.numel));
  return bytes;
}

// Note [Reduction during backward]
// Backward produces the gradients roughly in reverse store order, so the buckets (consecutive parameters in store
// order) fill from the last to the first. Armed before the step's last backward, each bucket parameter's
// post-accumulate hook counts its gradient in; bucket k is issued (its gradients copied into a flat buffer,
// weighted, all-reduced asynchronously) as soon as it and every bucket after it are complete, so the buckets
// always go out in decreasing order: the same order on every rank whatever the timing, as collectives need.
// On NCCL the all-reduce waits on the compute stream's event for the copies (Note [Asynchronous collectives])
// and runs beside the rest of the backward; on Gloo it runs on the communicator's thread. reduce() issues the
// buckets backward left incomplete (a parameter without a gradient in that backward: unused, or used only in
// an earlier micro-batch) and waits for all. A gradient that arrives again after its bucket went out (a weight
// shared by two activation-checkpointed segments, whose recomputed backwards each accumulate it) marks the
// bucket stale: reduce() waits for it and issues it again with the final gradients, in decreasing order too,
// and every rank runs the same graph, so the same buckets go stale everywhere. The summed buckets equal those
// of a reduction after backward bit for bit: the same buffers, summed in the same order.
void GradientReducer::begin(double weight) {
  Armed& a = *armed_;
  a.weight = weight;
  a.received.assign(store_.size(), 0);
  a.missing.resize(buckets_.size());
  for (std::size_t k = 0; k < buckets_.size(); ++k) a.missing[k] = static_cast<int64_t>(buckets_[k].params.size());
  a.stale.assign(buckets_.size(), 0);
  next_ = buckets_.size();
  issued_in_backward_ = 0;
  bytes_ = 0;
}

void GradientReducer::arm(double weight) {
  begin(weight);
  armed_->on = true;
}

void GradientReducer::on_gradient(std::size_t param) {
  Armed& a = *armed_;
  const std::size_t k = bucket_of_[param];
  if (a.received[param]) {  // a second gradient in this backward
    if (k >= next_) a.stale[k] = 1;
    return;
  }
  a.received[param] = 1;
  --a.missing[k];
  while (next_ > 0 && a.missing[next_ - 1] == 0) {
    issue(--next_);
    ++issued_in_backward_;
  }
}

void GradientReducer::issue(std::size_t k) {
  const Bucket& b = buckets_[k];
  Tensor flat = empty({b.numel}, {b.dtype, b.device});  // (numel) the bucket's gradients, one after another
  for (std::size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = *store_.params()[b.params[j]].param;
    const Tensor slot = flat.narrow(0, b.offsets[j], p.numel());
    if (p.grad().defined()) copy_(slot, p.grad().reshape({p.numel()}));
    else fill_(slot, 0.0);  // a trainable parameter without a gradient counts as zeros
  }
  if (armed_->weight != 1.0) mul_(flat, armed_->weight);
  bytes_ += static_cast<int64_t>(flat.nbytes());
  std::unique_ptr<Work> work = comm_.all_reduce(flat, ReduceOp::sum);
  flights_[k] = {flat, std::move(work)};
}

void GradientReducer::reduce(double weight) {
  if (armed_->on) {
    HT_ASSERT(weight == armed_->weight, "GradientReducer: armed with weight {}, reduced with {}", armed_->weight,
              weight);
    armed_->on = false;
  } else {
    begin(weight);
  }
  while (next_ > 0) issue(--next_);
  for (std::size_t k = buckets_.size(); k-- > 0;) {
    if (!armed_->stale[k]) continue;
    flights_[k].work->wait();
    issue(k);
  }
  for (std::size_t k = buckets_.size(); k-- > 0;) {
    InFlight& f = flights_[k];
    f.work->wait();
    const Bucket& b = buckets_[k];
    // Each gradient becomes its slot of the summed buffer (a contiguous view of the parameter's dtype and shape)
    // instead of a copy of it: one write and one read of every gradient fewer per step. The slots are disjoint,
    // so an in-place update of one gradient (clipping, the optimiser) changes no other; the buffer lives while
    // a gradient views it, and zero_grad drops them.
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      Tensor& p = *store_.params()[b.params[j]].param;
      p.set_grad(f.flat.narrow(0, b.offsets[j], p.numel()).reshape(p.shape()));
    }
    f = {};
  }
}

void broadcast_tensors(Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& tensors, int root) {
  std::vector<std::unique_ptr<Work>> flights;
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    HT_CHECK(t.is_contiguous(), "data parallel: '{}' {} is not contiguous and cannot be broadcast", name,
             t.describe());
    mark_written(t);  // Note [Storage versions]: the collective writes it in place
    flights.push_back(comm.broadcast(t, root));
  }
  for (auto& f : flights) f->wait();
}

void GradientReducer::broadcast_state(int root) {
  const std::map<std::string, Tensor> state = store_.state_dict();
  broadcast_tensors(comm_, {state.begin(), state.end()}, root);
}

}  // namespace ht::dist
