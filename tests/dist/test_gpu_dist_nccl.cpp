// The NCCL engine on one GPU (world size 1, in this process): every collective on CUDA tensors gives what
// its definition gives, a Work's wait() orders the caller's stream after the collective without a host
// synchronisation (a kernel queued after wait() reads the result), the tensors' checks, and replicated
// data parallelism of an MLP on CUDA, with the reduction after or during backward, is bit-equal to training
// alone (one rank adds nothing).
#include "hadatrain/cuda/context.h"
#include "hadatrain/dist/data_parallel.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

namespace {
const Device kGpu = Device::cuda(0);

dist::ProcessGroup one_rank() {
  return dist::init_process_group({.master_port = 0}, {.engine = "nccl", .device = kGpu,
                                                       .timeout = std::chrono::seconds(60)});
}
}  // namespace

TEST_CASE("nccl collectives with one rank", "[dist]") {
  auto pg = one_rank();
  dist::Communicator& c = *pg.comm;
  REQUIRE(std::string(c.engine()) == "nccl");
  REQUIRE(c.size() == 1);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor x = test::random_tensor({1000}, 3, DType::f64).to(dt);
    Tensor a = x.to(kGpu);
    c.all_reduce(a, dist::ReduceOp::sum)->wait();
    // A kernel queued after wait() on the caller's stream sees the result.
    CHECK(test::compare(mul(a, 2.0).to(Device::cpu()), mul(x, 2.0), 0, 0).empty());
    Tensor g = zeros({1000}, {dt, kGpu});
    c.all_gather(x.to(kGpu), g)->wait();
    CHECK(test::compare(g.to(Device::cpu()), x, 0, 0).empty());
    Tensor r = zeros({1000}, {dt, kGpu});
    c.reduce_scatter(x.to(kGpu), r, dist::ReduceOp::avg)->synchronize();
    CHECK(test::compare(r.to(Device::cpu()), x, 0, 0).empty());
    Tensor t = zeros({1000}, {dt, kGpu});  // all_to_all with one rank: its own chunk, through ncclSend / ncclRecv
    c.all_to_all(x.to(kGpu), t)->wait();
    CHECK(test::compare(t.to(Device::cpu()), x, 0, 0).empty());
    Tensor b = x.to(kGpu);
    c.broadcast(b, 0)->wait();
    CHECK(test::compare(b.to(Device::cpu()), x, 0, 0).empty());
  }
  c.barrier();
  REQUIRE_THROWS_WITH(c.all_reduce(zeros({3}), dist::ReduceOp::sum), HasSubstr("is not on cuda:0"));
}

TEST_CASE("ddp on one GPU rank is bit-equal to training alone", "[dist]") {
  auto pg = one_rank();
  // overlap: the buckets are all-reduced from the gradient hooks during backward (GradientReducer::arm, Note
  // [Reduction during backward]): the copies into the buckets on the compute stream, the all-reduce on the
  // communicator's stream after their event, the copies back after wait().
  auto run = [&](bool ddp, bool overlap = false) {
    Generator gen(9);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(32, 64, nn::Bias::yes, gen));
    m->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
    m->push_back(std::make_shared<nn::Linear>(64, 4, nn::Bias::yes, gen));
    m->to(kGpu);
    auto store = nn::ParameterStore::attach(*m);
    auto opt = optim::make_adamw(store, {});
    dist::GradientReducer reducer(*pg.comm, *store, {.bucket_mb = 0.01});
    if (ddp) reducer.broadcast_state(0);
    const Tensor x = test::random_tensor({16, 32}, 4, DType::f32).to(kGpu);
    const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}, {16}, {DType::i64}).to(kGpu);
    for (int step = 0; step < 5; ++step) {
      opt->zero_grad();
      const Tensor loss = cross_entropy(m->forward(x), y);
      if (overlap) reducer.arm(1.0);
      loss.backward();
      if (ddp) reducer.reduce(1.0);
      if (overlap) CHECK(reducer.issued_during_backward() == reducer.buckets());
      opt->step(1e-2);
    }
    return store->state_dict();
  };
  const auto alone = run(false), ddp = run(true), overlapped = run(true, true);
  for (const auto& [name, t] : alone) {
    CHECK(test::compare(ddp.at(name).to(Device::cpu()), t.to(Device::cpu()), 0, 0).empty());
    CHECK(test::compare(overlapped.at(name).to(Device::cpu()), t.to(Device::cpu()), 0, 0).empty());
  }
}
