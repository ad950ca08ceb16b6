// The Gloo engine (dist/communicator.h): CPU tensors, collectives through Gloo's own algorithms over TCP,
// run in issue order on one worker thread (Note [Asynchronous collectives]). Gloo has no reduce-scatter
// in its option-style API, so reduce_scatter is Gloo's all-reduce into a scratch tensor followed by a copy
// of this rank's chunk: twice the bytes of a true reduce-scatter, which is NCCL's business on GPUs; here
// it keeps the CPU engine's results equal to what NCCL computes. Ring all-reduce leaves every rank with the
// same bits (each chunk is reduced once and then copied).
#include "engines.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "hadatrain/core/error.h"
#include "hadatrain/dist/store.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/scalar_types.h"

namespace ht::dist {
namespace {

// Gloo's rendezvous through hadatrain's store.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(dist::Store& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) store_.get(k);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  dist::Store& store_;
};

template <typename T, typename Op>
void reduce_loop(void* c, const void* a, const void* b, std::size_t n, Op op) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = op(x[i], y[i]);
}

template <typename T>
gloo::AllreduceOptions::Func reduce_func(ReduceOp op) {
  if (op == ReduceOp::max)
    return [](void* c, const void* a, const void* b, std::size_t n) {
      reduce_loop<T>(c, a, b, n, [](T x, T y) { return static_cast<float>(x) < static_cast<float>(y) ? y : x; });
    };
  return [](void* c, const void* a, const void* b, std::size_t n) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      reduce_loop<T>(c, a, b, n, [](T x, T y) { return T(static_cast<float>(x) + static_cast<float>(y)); });
    else
      reduce_loop<T>(c, a, b, n, [](T x, T y) { return static_cast<T>(x + y); });
  };
}

gloo::AllreduceOptions::Func reduce_func_for(DType dt, ReduceOp op) {
  switch (dt) {
    case DType::f32: return reduce_func<float>(op);
    case DType::f64: return reduce_func<double>(op);
    case DType::bf16: return reduce_func<bf16>(op);
    case DType::f16: return reduce_func<f16>(op);
    case DType::i32: return reduce_func<int32_t>(op);
    case DType::i64: return reduce_func<int64_t>(op);
    default: HT_FAIL("gloo: no reduction over {} tensors (f32, f64, bf16, f16, i32 or i64)", dtype_name(dt));
  }
}

// x /= n in place (ReduceOp::avg after the sum).
void divide(const Tensor& t, int n) {
  const double d = n;
  switch (t.dtype()) {
    case DType::f32: for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] /= static_cast<float>(d); break;
    case DType::f64: for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] /= d; break;
    case DType::bf16:
      for (int64_t i = 0; i < t.numel(); ++i) t.data<bf16>()[i] = bf16(static_cast<float>(t.data<bf16>()[i]) / d);
      break;
    case DType::f16:
      for (int64_t i = 0; i < t.numel(); ++i) t.data<f16>()[i] = f16(static_cast<float>(t.data<f16>()[i]) / d);
      break;
    default: HT_FAIL("gloo: ReduceOp avg needs a floating-point tensor, got {}", dtype_name(t.dtype()));
  }
}

// Runs the communicator's collectives one at a time, in the order they were queued.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::future<void> push(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    auto f = task.get_future();
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_all();
    return f;
  }

 private:
  void loop() {
    while (true) {
      std::packaged_task<void()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

class GlooWork final : public Work {
 public:
  GlooWork(std::future<void> f, std::string what) : f_(std::move(f)), what_(std::move(what)) {}
  void wait() override {
    if (!f_.valid()) return;
    try {
      f_.get();
    } catch (const gloo::Exception& e) {
      HT_FAIL("{} failed: {} (a rank exited or stalled past dist.timeout_s)", what_, e.what());
    }
  }
  void synchronize() override { wait(); }

 private:
  std::future<void> f_;
  std::string what_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(Store& store, const CommunicatorOptions& o) : Communicator(o.timeout) {
    // The address the other ranks reach this one at: the interface GLOO_SOCKET_IFNAME names (as PyTorch
    // reads it), else this host's name; one rank talks only to itself.
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface && o.size > 1) {
      attr.iface = iface;
    } else if (o.size > 1) {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      attr.hostname = host;
    } else {
      attr.hostname = "127.0.0.1";
    }
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
      ctx->setTimeout(o.timeout);
      GlooStore gs(store);
      gloo::rendezvous::PrefixStore prefixed(o.prefix + "/gloo", gs);
      ctx->connectFullMesh(prefixed, device_);
      ctx_ = ctx;
    } catch (const gloo::Exception& e) {
      HT_FAIL("gloo: rank {} of {} could not connect to the other ranks: {}", o.rank, o.size, e.what());
    }
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  const char* engine() const override { return "gloo"; }
  Device device() const override { return Device::cpu(); }

  std::unique_ptr<Work> all_reduce(Tensor t, ReduceOp op) override {
    check_tensor("all_reduce", "tensor", t);
    count_bytes(Collective::all_reduce, static_cast<int64_t>(t.nbytes()));
    auto fn = reduce_func_for(t.dtype(), op);
    return submit(fmt::format("gloo all_reduce ({}) of {}", reduce_op_name(op), t.describe()), [=, this] {
      if (size() > 1) {
        gloo::AllreduceOptions opts(ctx_);
        set_output(opts, t);
        opts.setReduceFunction(fn);
        opts.setTag(next_tag());
        gloo::allreduce(opts);
      }
      if (op == ReduceOp::avg && size() > 1) divide(t, size());
    });
  }

  std::unique_ptr<Work> all_gather(Tensor input, Tensor out) override {
    check_tensor("all_gather", "input", input);
    check_tensor("all_gather", "out", out);
    HT_CHECK(out.dtype() == input.dtype() && out.numel() == input.numel() * size(),
             "all_gather: out must be {} x the input {}, got {}", size(), input.describe(), out.describe());
    count_bytes(Collective::all_gather, static_cast<int64_t>(out.nbytes()));
    return submit(fmt::format("gloo all_gather of {}", input.describe()), [=, this] {
      if (out.nbytes() == 0) return;  // nothing to move, and Gloo's allgather divides by the output's size
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      opts.setTag(next_tag());
      gloo::allgather(opts);
    });
  }

  std::unique_ptr<Work> reduce_scatter(Tensor input, Tensor out, ReduceOp op) override {
    check_tensor("reduce_scatter", "input", input);
    check_tensor("reduce_scatter", "out", out);
    HT_CHECK(out.dtype() == input.dtype() && out.numel() * size() == input.numel(),
             "reduce_scatter: out must hold 1/{} of the input {}, got {}", size(), input.describe(), out.describe());
    // Gloo runs an all-reduce: its volume (Note [Bytes on the wire]).
    count_bytes(Collective::reduce_scatter, 2 * static_cast<int64_t>(input.nbytes()));
    const Tensor scratch = input.clone();
    auto fn = reduce_func_for(input.dtype(), op);
    return submit(fmt::format("gloo reduce_scatter ({}) of {}", reduce_op_name(op), input.describe()), [=, this] {
      if (size() > 1) {
        gloo::AllreduceOptions opts(ctx_);
        set_output(opts, scratch);
        opts.setReduceFunction(fn);
        opts.setTag(next_tag());
        gloo::allreduce(opts);
      }
      const std::size_t chunk = out.nbytes();
      if (chunk > 0)  // an empty tensor's data pointer is null, which memcpy must not get
        std::memcpy(out.data_ptr(), static_cast<const char*>(scratch.data_ptr()) + chunk * rank(), chunk);
      if (op == ReduceOp::avg && size() > 1) divide(out, size());
    });
  }

  std::unique_ptr<Work> all_to_all(Tensor input, Tensor out) override {
    check_tensor("all_to_all", "input", input);
    check_tensor("all_to_all", "out", out);
    HT_CHECK(out.dtype() == input.dtype() && out.numel() == input.numel() && input.numel() % size() == 0,
             "all_to_all: input and out must be {} equal chunks of one dtype, got {} and {}", size(), input.describe(),
             out.describe());
    count_bytes(Collective::all_to_all, static_cast<int64_t>(input.nbytes()));
    return submit(fmt::format("gloo all_to_all of {}", input.describe()), [=, this] {
      if (size() == 1) {
        if (input.nbytes() > 0) std::memcpy(out.data_ptr(), input.data_ptr(), input.nbytes());
        return;
      }
      gloo::AlltoallOptions opts(ctx_);
      opts.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      opts.setTag(next_tag());
      gloo::alltoall(opts);
    });
  }

  std::unique_ptr<Work> broadcast(Tensor t, int root) override {
    check_tensor("broadcast", "tensor", t);
    HT_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of {}", root, size());
    count_bytes(Collective::broadcast, static_cast<int64_t>(t.nbytes()), root);
    return submit(fmt::format("gloo broadcast from rank {} of {}", root, t.describe()), [=, this] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
      opts.setRoot(root);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    submit("gloo barrier", [this] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    })->wait();
  }

 private:
  // Gloo's all-reduce counts elements of a C++ type of the dtype's width; the reduction function reads them
  // as the dtype.
  static void set_output(gloo::AllreduceOptions& opts, const Tensor& t) {
    switch (itemsize(t.dtype())) {
      case 2: opts.setOutput(static_cast<uint16_t*>(t.data_ptr()), static_cast<std::size_t>(t.numel())); break;
      case 4: opts.setOutput(static_cast<uint32_t*>(t.data_ptr()), static_cast<std::size_t>(t.numel())); break;
      case 8: opts.setOutput(static_cast<uint64_t*>(t.data_ptr()), static_cast<std::size_t>(t.numel())); break;
      default: HT_FAIL("gloo: no reduction over {}", dtype_name(t.dtype()));
    }
  }
  uint32_t next_tag() { return tag_++; }  // only the worker thread calls it
  std::unique_ptr<Work> submit(std::string what, std::function<void()> job) {
    return std::make_unique<GlooWork>(worker_.push(std::move(job)), std::move(what));
  }

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 0;
  Worker worker_;  // last: joined before the context goes
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(Store& store, const CommunicatorOptions& options) {
  return std::make_unique<GlooCommunicator>(store, options);
}

}  // namespace ht::dist
