// Replicated data parallelism (dist.mode: ddp): every rank holds the whole model and optimiser, computes
// the gradients of its slice of the global batch, and the gradients are summed over ranks, each weighted by
// its rank's share of the batch's rows, so every rank applies the same update as one process on the whole
// batch (Note [Data-parallel equivalence]).
//
// Note [Data-parallel equivalence]
// The loader's order is the same for every world size (data.batch_size is the global batch; the shuffle
// depends only on the seed and epoch). A global batch of B rows is cut into world-size slices of consecutive
// rows, sizes as even as possible (the first B mod N one row larger; data::row_slice). Rank r computes the mean
// loss over its rows, g_r, and the reducer forms sum_r (rows_r / B) g_r, the gradient of the mean over all
// B rows. So 2 processes with data.batch_size B compute the same step as 1 process with B, up to the order
// in which the sums are taken (float addition is not associative): the per-row products are identical, the
// reduction order differs. Layers whose forward mixes rows (batch norm) see only their rank's rows, as
// PyTorch's DDP without SyncBatchNorm does; such a model's steps differ from one process's.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hadatrain/data/loader.h"
#include "hadatrain/dist/communicator.h"
#include "hadatrain/nn/parameter_store.h"

namespace ht::dist {

// Every rank's `tensors` become rank `root`'s (all broadcasts issued, then waited for). Each must be contiguous:
// an error names the tensor otherwise. Empty tensors are skipped.
void broadcast_tensors(Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& tensors, int root);

struct GradientReducerOptions {
  double bucket_mb = 25.0;  // dist.bucket_mb: gradients are flattened into buckets of about this size
};

// Sums the gradients of a parameter store's parameters over the ranks of a communicator, bucket by bucket.
class GradientReducer {
 public:
  GradientReducer(Communicator& comm, nn::ParameterStore& store, GradientReducerOptions options = {});

  // Every trainable parameter's gradient becomes sum over ranks of weight_r * grad_r, where `weight` is this
  // rank's (e.g. its share of the batch's rows). A trainable parameter without a gradient counts as zeros and
  // gets the sum. Frozen parameters (requires_grad false when the reducer was built) are left alone: no
  // gradient, no bytes; the ranks are checked to agree on them at construction.
  // Issues the buckets arm() has not issued yet, then waits for all; on NCCL nothing blocks the host.
  void reduce(double weight);
  // Before the backward whose gradients reduce() will sum (the step's last, under gradient accumulation):
  // buckets are then all-reduced during that backward, as soon as their gradients are in (Note [Reduction during
  // backward]). reduce(weight) must follow with the same weight.
  void arm(double weight);
  // Buckets the last reduce() issued during the backward (the rest after it).
  std::size_t issued_during_backward() const { return issued_in_backward_; }
  // Every rank's parameters and buffers (state_dict) become rank `root`'s: run once after building the
  // model, so that ranks start equal whatever their initialisation.
  void broadcast_state(int root = 0);
  // Bytes this rank put into all-reduces in the last reduce() (the buckets' sizes; a stale bucket's twice).
  int64_t bytes_last_reduce() const { return bytes_; }
  std::size_t buckets() const { return buckets_.size(); }
  // Bytes of one reduction of every bucket: the trainable parameters' gradients (frozen ones have none).
  int64_t bucket_bytes() const;

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into the store, in store order
    std::vector<int64_t> offsets;     // element offset of each in the flat buffer
    int64_t numel = 0;
    DType dtype = DType::f32;
    Device device = Device::cpu();
  };
  struct InFlight {
    Tensor flat;  // (numel) the bucket's weighted gradients, one after another; the sum once waited for
    std::unique_ptr<Work> work;
  };
  // What the gradient hooks share with the reducer; the hooks hold it weakly, so a hook that outlives the
  // reducer does nothing.
  struct Armed {
    bool on = false;
    double weight = 1.0;
    std::vector<char> received;   // per store parameter: its gradient arrived in this backward
    std::vector<int64_t> missing; // per bucket: its parameters whose gradient has not arrived
    std::vector<char> stale;      // per bucket: a gradient arrived again after the bucket was issued
  };
  void begin(double weight);
  void on_gradient(std::size_t param);  // a bucket parameter's post-accumulate hook
  void issue(std::size_t bucket);
  Communicator& comm_;
  nn::ParameterStore& store_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // per store parameter; npos for a frozen one
  std::shared_ptr<Armed> armed_ = std::make_shared<Armed>();
  std::vector<InFlight> flights_;  // per bucket
  std::size_t next_ = 0;           // buckets [next_, size) are issued (they go in decreasing order)
  std::size_t issued_in_backward_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace ht::dist
