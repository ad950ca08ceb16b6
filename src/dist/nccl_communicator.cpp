// The NCCL engine (dist/communicator.h): CUDA tensors, NCCL's collectives on the communicator's own stream,
// ordered after the caller's stream by events and joined back by events (Note [Asynchronous collectives]):
// nothing here blocks the host except barrier() and Work::synchronize(). Rank 0 makes the NCCL unique id and
// shares it through the store. Work::synchronize() polls the completion event and NCCL's asynchronous
// error; past the timeout it aborts the NCCL communicator, which releases the kernels stuck waiting for
// a dead peer, and throws (Note [Collective timeouts]). Since wait() never blocks the host, a step that
// only waits could block later in an unrelated host read; a watchdog thread therefore watches every
// collective's completion and aborts the communicator when one is not done within the timeout (or NCCL
// reports an error), so the stuck kernels return and the next collective raises the reason.
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "engines.h"
#include "hadatrain/core/error.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/dist/store.h"

#define HT_NCCL_CHECK(expr)                                                                            \
  do {                                                                                                 \
    const ncclResult_t ht_nccl_r_ = (expr);                                                            \
    if (ht_nccl_r_ != ncclSuccess) [[unlikely]]                                                        \
      HT_FAIL("NCCL call {} failed: {} ({})", #expr, ncclGetErrorString(ht_nccl_r_), ncclGetLastError(nullptr)); \
  } while (0)

namespace ht::dist {
namespace {

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::f8e4m3: return ncclFloat8e4m3;
    case DType::f8e5m2: return ncclFloat8e5m2;
    default: HT_FAIL("nccl: no collective over {} tensors", dtype_name(dt));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator& comm, cuda::Event done, std::vector<Tensor> keep, std::string what)
      : comm_(comm), done_(std::move(done)), keep_(std::move(keep)), what_(std::move(what)) {}
  ~NcclWork() override {
    if (!keep_.empty()) done_.wait(cuda::current_stream());  // frees in the caller's order stay safe
  }
  void wait() override {
    if (keep_.empty()) return;
    done_.wait(cuda::current_stream());
    keep_.clear();
  }
  void synchronize() override;

 private:
  NcclCommunicator& comm_;
  cuda::Event done_;
  std::vector<Tensor> keep_;  // the collective's tensors, alive until the caller's stream has waited
  std::string what_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Store& store, const CommunicatorOptions& o)
      : Communicator(o.timeout), rank_(o.rank), size_(o.size), device_(o.device), stream_(o.device.index) {
    cuda::DeviceGuard g(device_.index);
    HT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(int)));
    HT_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(int)));
    ncclUniqueId id;
    const std::string key = o.prefix + "/nccl_unique_id";
    if (o.rank == 0) {
      HT_NCCL_CHECK(ncclGetUniqueId(&id));
      store.set(key, std::vector<char>(id.internal, id.internal + sizeof id.internal));
    }
    const std::vector<char> bytes = store.get(key);
    HT_ASSERT(bytes.size() == sizeof id.internal, "nccl unique id of {} bytes", bytes.size());
    std::memcpy(id.internal, bytes.data(), bytes.size());
    HT_NCCL_CHECK(ncclCommInitRank(&comm_, o.size, id, o.rank));
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclCommunicator() override {
    {
      std::lock_guard lock(wd_mu_);
      wd_stop_ = true;
    }
    wd_cv_.notify_all();
    watchdog_.join();
    cuda::DeviceGuard g(device_.index);
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
    cudaStreamSynchronize(stream_.get());
    cudaFree(barrier_word_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* engine() const override { return "nccl"; }
  Device device() const override { return device_; }

  std::unique_ptr<Work> all_reduce(Tensor t, ReduceOp op) override {
    check_tensor("all_reduce", "tensor", t);
    count_bytes(Collective::all_reduce, static_cast<int64_t>(t.nbytes()));
    return enqueue(fmt::format("nccl all_reduce ({}) of {}", reduce_op_name(op), t.describe()), {t}, [&] {
      HT_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), nccl_op(op), comm_,
                                  stream_.get()));
    });
  }
  std::unique_ptr<Work> all_gather(Tensor input, Tensor out) override {
    check_tensor("all_gather", "input", input);
    check_tensor("all_gather", "out", out);
    HT_CHECK(out.dtype() == input.dtype() && out.numel() == input.numel() * size_,
             "all_gather: out must be {} x the input {}, got {}", size_, input.describe(), out.describe());
    count_bytes(Collective::all_gather, static_cast<int64_t>(out.nbytes()));
    return enqueue(fmt::format("nccl all_gather of {}", input.describe()), {input, out}, [&] {
      HT_NCCL_CHECK(ncclAllGather(input.data_ptr(), out.data_ptr(), input.nbytes(), ncclUint8, comm_, stream_.get()));
    });
  }
  std::unique_ptr<Work> reduce_scatter(Tensor input, Tensor out, ReduceOp op) override {
    check_tensor("reduce_scatter", "input", input);
    check_tensor("reduce_scatter", "out", out);
    HT_CHECK(out.dtype() == input.dtype() && out.numel() * size_ == input.numel(),
             "reduce_scatter: out must hold 1/{} of the input {}, got {}", size_, input.describe(), out.describe());
    count_bytes(Collective::reduce_scatter, static_cast<int64_t>(input.nbytes()));
    return enqueue(fmt::format("nccl reduce_scatter ({}) of {}", reduce_op_name(op), input.describe()), {input, out},
                   [&] {
                     HT_NCCL_CHECK(ncclReduceScatter(input.data_ptr(), out.data_ptr(), out.numel(),
                                                     nccl_type(input.dtype()), nccl_op(op), comm_, stream_.get()));
                   });
  }
  std::unique_ptr<Work> all_to_all(Tensor input, Tensor out) override {
    check_tensor("all_to_all", "input", input);
    check_tensor("all_to_all", "out", out);
    HT_CHECK(out.dtype() == input.dtype() && out.numel() == input.numel() && input.numel() % size_ == 0,
             "all_to_all: input and out must be {} equal chunks of one dtype, got {} and {}", size_, input.describe(),
             out.describe());
    count_bytes(Collective::all_to_all, static_cast<int64_t>(input.nbytes()));
    // One group of a send and a receive per peer (NCCL has no all-to-all call): NCCL runs them together.
    return enqueue(fmt::format("nccl all_to_all of {}", input.describe()), {input, out}, [&] {
      const std::size_t chunk = input.nbytes() / static_cast<std::size_t>(size_);
      const auto* in = static_cast<const char*>(input.data_ptr());
      auto* o = static_cast<char*>(out.data_ptr());
      HT_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        HT_NCCL_CHECK(ncclSend(in + r * chunk, chunk, ncclUint8, r, comm_, stream_.get()));
        HT_NCCL_CHECK(ncclRecv(o + r * chunk, chunk, ncclUint8, r, comm_, stream_.get()));
      }
      HT_NCCL_CHECK(ncclGroupEnd());
    });
  }
  std::unique_ptr<Work> broadcast(Tensor t, int root) override {
    check_tensor("broadcast", "tensor", t);
    HT_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of {}", root, size_);
    count_bytes(Collective::broadcast, static_cast<int64_t>(t.nbytes()), root);
    return enqueue(fmt::format("nccl broadcast from rank {} of {}", root, t.describe()), {t}, [&] {
      HT_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream_.get()));
    });
  }
  void barrier() override {
    // An all-reduce of one word after the caller's queued work, waited for on the host.
    HT_CHECK(!aborted_, "nccl barrier: the NCCL communicator was aborted by an earlier failure: {}", abort_reason());
    cuda::DeviceGuard g(device_.index);
    cuda::Event ready;
    ready.record(cuda::current_stream());
    ready.wait(stream_.get());
    HT_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclMax, comm_, stream_.get()));
    cuda::Event done;
    done.record(stream_.get());
    wait_for(done, "nccl barrier");
  }

  // Host wait for `done`, at most the timeout (Note [Collective timeouts]).
  void wait_for(const cuda::Event& done, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    while (!done.query()) {
      ncclResult_t async = ncclSuccess;
      HT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
        const std::string why = fmt::format(
            "{} on rank {} of {}: {}", what, rank_, size_,
            async != ncclSuccess ? fmt::format("NCCL reported {}", ncclGetErrorString(async))
                                 : fmt::format("not finished after {:g} s (dist.timeout_s): a rank exited or stalled",
                                               static_cast<double>(timeout().count()) / 1000.0));
        abort(why);
        HT_FAIL("{}; the NCCL communicator was aborted", why);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  template <typename F>
  std::unique_ptr<Work> enqueue(std::string what, std::vector<Tensor> keep, F&& call) {
    HT_CHECK(!aborted_, "{}: the NCCL communicator was aborted by an earlier failure: {}", what, abort_reason());
    cuda::DeviceGuard g(device_.index);
    cuda::Event ready;
    ready.record(cuda::current_stream());
    ready.wait(stream_.get());
    call();
    cuda::Event done;
    done.record(stream_.get());
    cuda::Event watched;
    watched.record(stream_.get());
    {
      std::lock_guard lock(wd_mu_);
      watched_.push_back({std::move(watched), what, std::chrono::steady_clock::now()});
    }
    return std::make_unique<NcclWork>(*this, std::move(done), std::move(keep), std::move(what));
  }

  void abort(const std::string& reason) {
    std::lock_guard lock(wd_mu_);
    if (aborted_.exchange(true)) return;
    reason_ = reason;
    ncclCommAbort(comm_);
  }
  std::string abort_reason() {
    std::lock_guard lock(wd_mu_);
    return reason_;
  }

  // The watchdog thread: drops finished collectives from the front of the queue; aborts on an NCCL error or
  // on the oldest unfinished collective passing the timeout.
  void watch() {
    std::unique_lock lock(wd_mu_);
    while (!wd_stop_) {
      wd_cv_.wait_for(lock, std::chrono::milliseconds(100));
      try {
        while (!watched_.empty() && watched_.front().event.query()) watched_.pop_front();
      } catch (const std::exception& e) {  // a CUDA error: the next call on the caller's side reports it
        spdlog::error("nccl watchdog, rank {} of {}: {}", rank_, size_, e.what());
        watched_.clear();
        continue;
      }
      if (aborted_ || comm_ == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      std::string why;
      if (async != ncclSuccess) {
        why = fmt::format("NCCL reported {}", ncclGetErrorString(async));
      } else if (!watched_.empty() && std::chrono::steady_clock::now() - watched_.front().issued > timeout()) {
        why = fmt::format("{} not finished after {:g} s (dist.timeout_s): a rank exited or stalled",
                          watched_.front().what, static_cast<double>(timeout().count()) / 1000.0);
      }
      if (why.empty()) continue;
      spdlog::error("nccl watchdog, rank {} of {}: {}; aborting the NCCL communicator", rank_, size_, why);
      aborted_ = true;
      reason_ = why;
      ncclCommAbort(comm_);
      watched_.clear();
    }
  }

  struct Watched {
    cuda::Event event;
    std::string what;
    std::chrono::steady_clock::time_point issued;
  };

  int rank_, size_;
  Device device_;
  cuda::Stream stream_;
  int* barrier_word_ = nullptr;  // device memory barrier() reduces
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::mutex wd_mu_;  // guards watched_, reason_, wd_stop_ and the abort itself
  std::condition_variable wd_cv_;
  std::deque<Watched> watched_;
  std::string reason_;
  bool wd_stop_ = false;
  std::thread watchdog_;  // last: started when the rest is ready
};

void NcclWork::synchronize() {
  comm_.wait_for(done_, what_);
  wait();
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const CommunicatorOptions& options) {
  return std::make_unique<NcclCommunicator>(store, options);
}

}  // namespace ht::dist
