// What the engines share (dist/communicator.h): tensor checks, the list of compiled engines and the choice
// of engine by name.
#include "hadatrain/dist/communicator.h"

#include <pthread.h>

#include <csignal>

#include <algorithm>

#include "engines.h"
#include "hadatrain/core/error.h"

namespace ht::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_reduce: return "all_reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::all_to_all: return "all_to_all";
  }
  return "?";
}

void Communicator::count_bytes(Collective kind, int64_t nbytes, int root) {
  const int64_t n = size();
  if (n <= 1) return;
  const auto k = static_cast<std::size_t>(kind);
  const int64_t ring = (n - 1) * nbytes / n;  // nbytes is N x a chunk for the gather, scatter and all-to-all kinds
  switch (kind) {
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all:
      bytes_.sent[k] += ring, bytes_.received[k] += ring;
      break;
    case Collective::all_reduce:
      bytes_.sent[k] += 2 * ring, bytes_.received[k] += 2 * ring;
      break;
    case Collective::broadcast:
      if (rank() == root) bytes_.sent[k] += nbytes;
      else bytes_.received[k] += nbytes;
      break;
  }
}

void Communicator::check_tensor(const char* collective, const char* what, const Tensor& t) const {
  HT_CHECK(t.defined(), "{} ({}): the {} tensor is undefined", collective, engine(), what);
  HT_CHECK(t.is_contiguous(), "{} ({}): the {} tensor {} must be contiguous", collective, engine(), what,
           t.describe());
  HT_CHECK(t.device() == device(), "{} ({}): the {} tensor {} is not on {}, this communicator's device", collective,
           engine(), what, t.describe(), to_string(device()));
}

std::vector<std::string> compiled_engines() {
  std::vector<std::string> e;
#ifdef HADATRAIN_HAVE_GLOO
  e.emplace_back("gloo");
#endif
#ifdef HADATRAIN_HAVE_NCCL
  e.emplace_back("nccl");
#endif
  return e;
}

// Note [A peer's closed socket]
// A rank that dies closes its sockets; a peer that then writes to one gets EPIPE and, unless SIGPIPE is blocked or
// ignored in the writing thread, the signal, whose default action ends the process without a word (exit status 141)
// before the transport can report the failure. Gloo's TCP pairs write with writev, which has no MSG_NOSIGNAL (our
// store's sends pass it), so without more a rank whose peer exited can be killed instead of getting the collective's
// error (test_dist_failures shows it under load). SIGPIPE is synchronous, sent to the thread that wrote, and a thread
// starts with its creator's signal mask; so the engine is built with SIGPIPE blocked in this thread: the connections
// made now and every thread the engine starts (Gloo's event loop and our collective worker, NCCL's proxy threads and
// our watchdog), which do all of the engine's later writes, get EPIPE instead, the transport throws and the
// collective's error names what failed. This thread's mask is restored afterwards (a SIGPIPE its own connecting writes
// left pending is dropped first), so the process's disposition is untouched: a rank whose standard output is a closed
// pipe (`hadatrain launch ... | head`) still ends at its next write.
namespace {
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &before_);
  }
  ~SigpipeBlocked() {
    if (!sigismember(&before_, SIGPIPE)) {  // blocked here: drop what this thread's writes raised
      const timespec now{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &now) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_{}, before_{};
};
}  // namespace

std::unique_ptr<Communicator> make_communicator(Store& store, const CommunicatorOptions& o) {
  const SigpipeBlocked quiet_pipes;  // for the engine's threads (Note [A peer's closed socket])
  const auto have = compiled_engines();
  std::string list;
  for (const auto& e : have) list += (list.empty() ? "" : ", ") + e;
  HT_CHECK(o.engine == "gloo" || o.engine == "nccl", "dist.engine: expected gloo or nccl, got '{}'", o.engine);
  HT_CHECK(std::find(have.begin(), have.end(), o.engine) != have.end(),
           "dist.engine {}: this build of hadatrain has no {} engine (it has: {}); {}", o.engine, o.engine,
           list.empty() ? "none" : list,
           o.engine == "gloo" ? "install libgloo-dev and rebuild" : "build with CUDA and NCCL (libnccl-dev)");
  HT_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "dist: rank {} is not in a world of size {}", o.rank,
           o.size);
#ifdef HADATRAIN_HAVE_GLOO
  if (o.engine == "gloo") {
    HT_CHECK(o.device.is_cpu(), "dist.engine gloo works on CPU tensors; train.device is {} (use nccl)",
             to_string(o.device));
    return make_gloo_communicator(store, o);
  }
#endif
#ifdef HADATRAIN_HAVE_NCCL
  if (o.engine == "nccl") {
    HT_CHECK(o.device.is_cuda(), "dist.engine nccl works on CUDA tensors; train.device is {} (use gloo)",
             to_string(o.device));
    return make_nccl_communicator(store, o);
  }
#endif
  HT_FAIL("dist.engine {}: not built", o.engine);
}

}  // namespace ht::dist
