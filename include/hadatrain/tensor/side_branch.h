// Side branches: device work that runs beside the work queued after it, on a second stream.
//
// Note [Side branches]
// Two chains of kernels that do not read each other's results (HLQ's g_x and g_w products of one layer) run one
// after the other on one stream, although each leaves much of the GPU idle while its small kernels run
// (quantisers, projections, rescaling passes). A SideBranch forks the current stream: the side stream first waits
// for everything queued so far (so a SideBranch is made after the work whose results the branch reads), then run()
// queues its work there while the host goes on queuing the other chain on the current stream. wait(mark) makes the
// current stream wait for the side work queued before mark() was called, join() for all of it. A recorded step
// graph gets the same shape: two branches of nodes between the fork and the join.
//
// Memory (Note [Stream-ordered frees] in cuda/caching_allocator.h): a tensor allocated inside run() belongs to the
// side stream and is freed in its order, which is right for the branch's temporaries. A tensor the branch produces
// for later use must be named in wait() or join(): its free moves to the current stream, after every later use
// there. The caller keeps every tensor the branch reads alive until join() (the inputs were allocated on the current
// stream and would otherwise be freed in its order while the branch may still read them). While a step is recorded,
// each tensor allocated in the branch must be freed inside it or named in wait() or join(), because a free left on
// the side stream after the join would be recorded as an unjoined branch.
//
// The side stream and its cuBLASLt workspace are one per thread and device, and a recorded branch's GEMMs keep that
// workspace's address: branches forked from two streams whose work overlaps (an eager branch forked from one stream
// while a step graph with branches replays on another) would share it. The trainer and the benchmarks run eager
// steps and replays on one stream (cuda/graph.h), which orders them.
//
// On the CPU, when the caller turns it off, or while a step is recorded on a thread that has not made its side
// stream yet (the side stream and its cuBLASLt workspace are made outside recordings; the eager steps before a
// recording make them), run() runs its work in place and join() does nothing.
#pragma once
#include <initializer_list>
#include <memory>
#include <utility>

#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/tensor.h"

namespace ht {

class SideBranch {
 public:
  // Forks the current stream of `device` when `enabled` and the device is a CUDA device.
  SideBranch(Device device, bool enabled);
  // Joins without handing tensors over if join() was not called (an exception left the caller).
  ~SideBranch();
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;

  // True when run() queues its work on a side stream.
  bool concurrent() const { return backend_ != nullptr; }

  // Calls f() with the side stream current (in place when not concurrent) and returns its result.
  template <class F>
  decltype(auto) run(F&& f) {
    Entered on(backend_.get());
    return std::forward<F>(f)();
  }

  // A point in the branch: the work run() has queued so far.
  struct Mark {
    int id = 0;
  };
  Mark mark();
  // The current stream waits for the work before `m` (not for what run() queued after it), and `produced` are
  // handed over to it as by join(); the branch stays open.
  void wait(Mark m, std::initializer_list<Tensor> produced);

  // The current stream waits for the branch; `produced` (tensors run() made that are used after the branch;
  // undefined ones are skipped) are freed in the current stream's order from now on. Call once.
  void join(std::initializer_list<Tensor> produced);

 private:
  struct Entered {
    explicit Entered(BranchBackend* b) : b(b) {
      if (b) b->enter();
    }
    ~Entered() {
      if (b) b->leave();
    }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;
    BranchBackend* b;
  };
  std::unique_ptr<BranchBackend> backend_;
};

}  // namespace ht
