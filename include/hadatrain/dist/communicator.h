// Communicator: the collectives that data parallelism and sharding are built from (all-reduce, all-gather, all-to-all,
// reduce-scatter, broadcast, barrier) over the ranks of one job, on tensors. Two engines implement it, both
// thin layers over a library's own collectives (no hand-written algorithms): Gloo for CPU tensors (so the
// sharding logic runs in CI with several processes and no GPU) and NCCL for CUDA tensors. Either may be left
// out of a build (compiled_engines() says which are in); make_communicator names what is missing.
//
// Note [Asynchronous collectives]
// Every collective returns a Work at once; the caller may not read the output, nor write the input, nor drop
// either tensor before calling wait() on it.
//   - NCCL: the collective is queued on the communicator's own stream after an event recorded on the
//     caller's current stream, so it starts when the work queued before it has produced its input; wait()
//     makes the caller's current stream wait for the collective's completion event: the host is never
//     blocked, so a step can queue collectives and compute and never synchronise. The Work keeps the tensors
//     alive until wait(), so a stream-ordered free on the caller's stream cannot hand their memory out
//     while the communicator's stream still uses it.
//   - Gloo: the collective runs on the communicator's worker thread (one thread: collectives run in the
//     order they were issued, the same order on every rank); wait() blocks until it is done and rethrows its
//     error. CPU work overlaps it while it runs.
// Collectives must be issued in the same order, with the same sizes, on every rank.
//
// Note [Collective timeouts]
// A rank that dies or stops issuing collectives must not leave the others waiting for ever: every blocking
// point (the store's waits, Gloo's transfers, NCCL's completion in synchronize()) gives up after the
// communicator's timeout (dist.timeout_s) with an error naming the collective, the engine, the rank and the
// timeout. A peer process that exits closes its sockets, which Gloo reports at once.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht::dist {

class Store;

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

// Note [Bytes on the wire]
// Every collective counts, on the rank that issues it, the bytes it sends and receives, computed from its
// tensors' element counts and dtype with the standard ring volumes for N ranks (what NCCL's ring algorithms
// move; not measured on the network):
//   all-gather, n = the output's bytes (N x the input): sends and receives (N-1)/N * n;
//   reduce-scatter, n = the input's bytes (N x the output): sends and receives (N-1)/N * n;
//   all-reduce of n bytes: sends and receives 2 (N-1)/N * n (a reduce-scatter, then an all-gather);
//   broadcast of n bytes: the root sends n, every other rank receives n;
//   all-to-all, n = the input's bytes (N chunks, one per destination): sends and receives (N-1)/N * n (its own
//   chunk stays).
// The Gloo engine's reduce-scatter is an all-reduce (Note in gloo_communicator.cpp): it counts as a
// reduce-scatter with the all-reduce's volume, 2 (N-1)/N * n, because that is what it moves. One rank: zero.
// Barriers count nothing.
enum class Collective { all_gather, reduce_scatter, all_reduce, broadcast, all_to_all };
inline constexpr int kCollectiveKinds = 5;
const char* collective_name(Collective c);

struct CommBytes {
  int64_t sent[kCollectiveKinds] = {}, received[kCollectiveKinds] = {};  // by Collective
  int64_t total_sent() const { return sent[0] + sent[1] + sent[2] + sent[3] + sent[4]; }
  int64_t total_received() const { return received[0] + received[1] + received[2] + received[3] + received[4]; }
};

// A collective in flight (Note [Asynchronous collectives]).
class Work {
 public:
  virtual ~Work() = default;
  // NCCL: the caller's current stream waits for the collective (no host block); Gloo: blocks until done.
  // Rethrows the collective's error. Calling it again does nothing.
  virtual void wait() = 0;
  // Blocks the host until the collective has finished (on CUDA: its completion event), at most the
  // communicator's timeout; then as wait().
  virtual void synchronize() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* engine() const = 0;  // "gloo" or "nccl"
  virtual Device device() const = 0;       // where its tensors live (cpu, or one CUDA device)

  // Every tensor is contiguous, on device(), and of the same dtype and size on every rank.
  // `tensor` becomes the reduction over ranks of `tensor` (in place).
  virtual std::unique_ptr<Work> all_reduce(Tensor tensor, ReduceOp op) = 0;
  // `out` (size() * input.numel() elements) becomes the ranks' inputs one after another, rank order.
  virtual std::unique_ptr<Work> all_gather(Tensor input, Tensor out) = 0;
  // `out` (input.numel() / size() elements) becomes this rank's chunk of the reduction of the inputs: the
  // reduction of every rank's input elements [rank*n, (rank+1)*n).
  virtual std::unique_ptr<Work> reduce_scatter(Tensor input, Tensor out, ReduceOp op) = 0;
  // input and out hold N equal chunks of c = input.numel() / size() elements (numel a multiple of size()); out's
  // chunk r becomes rank r's input chunk [rank*c, (rank+1)*c): each rank receives what every rank sent it, in
  // rank order (NCCL: grouped ncclSend / ncclRecv; Gloo: its alltoall).
  virtual std::unique_ptr<Work> all_to_all(Tensor input, Tensor out) = 0;
  // `tensor` becomes root's `tensor` on every rank.
  virtual std::unique_ptr<Work> broadcast(Tensor tensor, int root) = 0;
  // Returns when every rank has called it (blocks the host; on CUDA after this rank's queued collectives).
  virtual void barrier() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }

  // The bytes this rank's collectives sent and received since construction or reset_bytes() (Note [Bytes on
  // the wire]). Counted when a collective is issued, on the issuing thread.
  const CommBytes& bytes() const { return bytes_; }
  void reset_bytes() { bytes_ = CommBytes{}; }

 protected:
  explicit Communicator(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // The checks every engine makes on a collective's tensors: contiguous, on device(), equal dtypes.
  void check_tensor(const char* collective, const char* what, const Tensor& t) const;
  // Adds one collective of `nbytes` (as Note [Bytes on the wire] defines n for its kind) to bytes();
  // `root` is the broadcast's root. Engines call it from each collective.
  void count_bytes(Collective kind, int64_t nbytes, int root = 0);

 private:
  std::chrono::milliseconds timeout_;
  CommBytes bytes_;
};

// The engines this build has, in the order "gloo", "nccl".
std::vector<std::string> compiled_engines();

struct CommunicatorOptions {
  std::string engine;  // "gloo" (CPU tensors) or "nccl" (CUDA tensors)
  int rank = 0;
  int size = 1;
  Device device = Device::cpu();  // nccl: the CUDA device this rank uses
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string prefix = "default";  // store keys of this communicator start with "<prefix>/"
};

// Connects this rank to the others through `store` (which all ranks share: one rendezvous per prefix).
// An engine this build lacks is an error that names the engines it has.
std::unique_ptr<Communicator> make_communicator(Store& store, const CommunicatorOptions& options);

}  // namespace ht::dist
