// The Gloo engine's collectives with 2 and 4 processes (run_ranks forks them): every result compared with
// what the ranks' inputs make it by definition, computed in each rank from the same formula.
#include <cmath>

#include "dist_testing.h"
#include "hadatrain/dist/communicator.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"

using namespace ht;
using ht::test::expect;

namespace {

dist::ProcessGroup connect(const dist::DistEnv& env, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return dist::init_process_group(env, {.engine = "gloo", .device = Device::cpu(), .timeout = timeout});
}

// Rank r's input element i: distinct across ranks and elements, exact in f32 and bf16.
float input_value(int r, int64_t i) { return static_cast<float>((r + 1) * 4 + (i % 7)) * 0.25f; }

Tensor rank_input(int r, int64_t n, DType dt) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = input_value(r, i);
  return from_vector(v, {n}).to(dt);
}

void check_collectives(const dist::DistEnv& env) {
  auto pg = connect(env);
  dist::Communicator& c = *pg.comm;
  const int n = c.size(), r = c.rank();
  expect(n == env.world_size && r == env.rank, "rank and size as the environment says");
  const int64_t len = 12 * n;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    // all_reduce sum, avg, max
    Tensor s = rank_input(r, len, dt), a = rank_input(r, len, dt), m = rank_input(r, len, dt);
    auto ws = c.all_reduce(s, dist::ReduceOp::sum);
    auto wa = c.all_reduce(a, dist::ReduceOp::avg);
    auto wm = c.all_reduce(m, dist::ReduceOp::max);
    wm->wait();  // waited out of order: the worker ran them in issue order
    wa->wait();
    ws->wait();
    const auto sv = s.to(DType::f64).to_vector<double>(), av = a.to(DType::f64).to_vector<double>(),
               mv = m.to(DType::f64).to_vector<double>();
    for (int64_t i = 0; i < len; ++i) {
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += input_value(q, i);
      expect(sv[i] == sum, fmt::format("all_reduce sum {} [{}]: {} != {}", dtype_name(dt), i, sv[i], sum));
      expect(std::abs(av[i] - sum / n) <= (dt == DType::bf16 ? 0.02 : 1e-6) * sum / n,
             fmt::format("all_reduce avg {} [{}]: {} != {}", dtype_name(dt), i, av[i], sum / n));
      expect(mv[i] == input_value(n - 1, i), fmt::format("all_reduce max {} [{}]", dtype_name(dt), i));
    }
    // all_gather: the ranks' inputs in rank order
    const Tensor in = rank_input(r, 5, dt);
    Tensor gathered = zeros({5 * n}, {dt});
    c.all_gather(in, gathered)->wait();
    const auto gv = gathered.to(DType::f64).to_vector<double>();
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < 5; ++i)
        expect(gv[q * 5 + i] == input_value(q, i), fmt::format("all_gather {} rank {} [{}]", dtype_name(dt), q, i));
    // reduce_scatter: this rank's chunk of the sum
    const Tensor full_in = rank_input(r, len, dt);
    Tensor chunk = zeros({len / n}, {dt});
    c.reduce_scatter(full_in, chunk, dist::ReduceOp::sum)->wait();
    const auto cv = chunk.to(DType::f64).to_vector<double>();
    for (int64_t i = 0; i < len / n; ++i) {
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += input_value(q, r * (len / n) + i);
      expect(cv[i] == sum, fmt::format("reduce_scatter {} [{}]: {} != {}", dtype_name(dt), i, cv[i], sum));
    }
    // all_to_all: out's chunk q is rank q's input chunk r
    const Tensor sends = rank_input(r, 3 * n, dt);
    Tensor received = zeros({3 * n}, {dt});
    c.all_to_all(sends, received)->wait();
    const auto tv = received.to(DType::f64).to_vector<double>();
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < 3; ++i)
        expect(tv[q * 3 + i] == input_value(q, r * 3 + i), fmt::format("all_to_all {} from rank {} [{}]", dtype_name(dt), q, i));
    // broadcast from the last rank
    Tensor b = rank_input(r, 9, dt);
    c.broadcast(b, n - 1)->wait();
    const auto bv = b.to(DType::f64).to_vector<double>();
    for (int64_t i = 0; i < 9; ++i) expect(bv[i] == input_value(n - 1, i), "broadcast from the last rank");
  }
  // Integers reduce exactly too; all_gather moves bytes of any dtype.
  Tensor ids = from_vector(std::vector<int64_t>{r, 10 * r}, {2});
  c.all_reduce(ids, dist::ReduceOp::sum)->wait();
  expect(ids.to_vector<int64_t>()[1] == 10 * (n * (n - 1) / 2), "all_reduce of i64");
  c.barrier();
}

}  // namespace

TEST_CASE("gloo collectives on 2 processes", "[dist]") {
  const auto out = ht::test::run_ranks(2, check_collectives, std::chrono::seconds(60));
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("gloo collectives on 4 processes", "[dist]") {
  const auto out = ht::test::run_ranks(4, check_collectives, std::chrono::seconds(60));
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("gloo collectives with one process", "[dist]") {
  // World size 1: every collective is the identity (reduce_scatter's chunk is the whole input).
  const auto out = ht::test::run_ranks(1, check_collectives, std::chrono::seconds(30));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("a collective's tensors are checked before anything is sent", "[dist]") {
  const auto out = ht::test::run_ranks(1, [](const dist::DistEnv& env) {
    auto pg = connect(env);
    Tensor t = zeros({4, 3});
    bool threw = false;
    try {
      pg.comm->all_reduce(t.transpose(0, 1), dist::ReduceOp::sum);
    } catch (const Error& e) {
      threw = std::string(e.what()).find("must be contiguous") != std::string::npos;
    }
    expect(threw, "a transposed tensor is refused naming contiguity");
    threw = false;
    try {
      pg.comm->all_gather(zeros({3}), zeros({4}));
    } catch (const Error& e) {
      threw = std::string(e.what()).find("out must be 1 x the input") != std::string::npos;
    }
    expect(threw, "an all_gather output of the wrong size is refused");
  });
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("an engine the build lacks is named with the engines it has", "[dist]") {
  const auto engines = dist::compiled_engines();
  REQUIRE(std::find(engines.begin(), engines.end(), "gloo") != engines.end());
  if (std::find(engines.begin(), engines.end(), "nccl") == engines.end()) {
    dist::TcpStore store({.port = 0, .is_server = true});
    REQUIRE_THROWS_WITH(dist::make_communicator(store, {.engine = "nccl", .device = Device::cpu()}),
                        HasSubstr("this build of hadatrain has no nccl engine (it has: gloo)"));
  }
  dist::TcpStore store({.port = 0, .is_server = true});
  REQUIRE_THROWS_WITH(dist::make_communicator(store, {.engine = "mpi"}),
                      HasSubstr("dist.engine: expected gloo or nccl, got 'mpi'"));
}

// Note [Bytes on the wire]: each collective's bytes from its sizes and the ring volumes, per kind.
TEST_CASE("every collective counts its bytes on the wire by the ring formulas", "[dist]") {
  for (int world : {2, 4}) {
    const auto out = ht::test::run_ranks(world, [](const dist::DistEnv& env) {
      auto pg = connect(env);
      dist::Communicator& c = *pg.comm;
      const int64_t n = c.size();
      c.reset_bytes();
      Tensor shard = rank_input(c.rank(), 10, DType::f32), gathered = empty({10 * n}, {DType::f32});  // 40 B per rank
      c.all_gather(shard, gathered)->wait();
      Tensor grads = rank_input(c.rank(), 8 * n, DType::bf16), mine = empty({8}, {DType::bf16});  // 16 n B in
      c.reduce_scatter(grads, mine, dist::ReduceOp::sum)->wait();
      Tensor sum = rank_input(c.rank(), 6, DType::f64);  // 48 B
      c.all_reduce(sum, dist::ReduceOp::sum)->wait();
      Tensor root = rank_input(0, 5, DType::f32);  // 20 B from rank 1
      c.broadcast(root, 1)->wait();
      Tensor sends = rank_input(c.rank(), 6 * n, DType::f32), received = empty({6 * n}, {DType::f32});  // 24 n B in
      c.all_to_all(sends, received)->wait();
      c.barrier();
      const dist::CommBytes& b = c.bytes();
      auto at = [](const int64_t* v, dist::Collective k) { return v[static_cast<int>(k)]; };
      const int64_t ag = (n - 1) * 40, rs = 2 * (n - 1) * 16, ar = 2 * (n - 1) * 48 / n;  // gloo's rs is an all-reduce
      expect(at(b.sent, dist::Collective::all_gather) == ag && at(b.received, dist::Collective::all_gather) == ag,
             fmt::format("all_gather: {} sent, {} received, expected {}", at(b.sent, dist::Collective::all_gather),
                         at(b.received, dist::Collective::all_gather), ag));
      expect(at(b.sent, dist::Collective::reduce_scatter) == rs && at(b.received, dist::Collective::reduce_scatter) == rs,
             fmt::format("reduce_scatter: {} sent, expected {}", at(b.sent, dist::Collective::reduce_scatter), rs));
      expect(at(b.sent, dist::Collective::all_reduce) == ar && at(b.received, dist::Collective::all_reduce) == ar,
             fmt::format("all_reduce: {} sent, expected {}", at(b.sent, dist::Collective::all_reduce), ar));
      const bool is_root = c.rank() == 1;
      expect(at(b.sent, dist::Collective::broadcast) == (is_root ? 20 : 0) &&
                 at(b.received, dist::Collective::broadcast) == (is_root ? 0 : 20),
             "broadcast: the root sends 20 B, the others receive them");
      const int64_t a2a = (n - 1) * 24;  // (N-1)/N of the input: the rank's own chunk stays
      expect(at(b.sent, dist::Collective::all_to_all) == a2a && at(b.received, dist::Collective::all_to_all) == a2a,
             fmt::format("all_to_all: {} sent, expected {}", at(b.sent, dist::Collective::all_to_all), a2a));
      expect(b.total_sent() == ag + rs + ar + a2a + (is_root ? 20 : 0), "the total is the sum of the kinds");
      c.reset_bytes();
      expect(c.bytes().total_sent() == 0 && c.bytes().total_received() == 0, "reset_bytes zeroes the counts");
    });
    INFO(world << " ranks, exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
}

// A collective of zero elements is valid and moves nothing (Gloo's own allgather would divide by zero); the
// collectives after it still pair up across the ranks.
TEST_CASE("collectives of empty tensors complete and leave the ranks in step", "[dist]") {
  for (int world : {1, 2, 4}) {
    const auto out = ht::test::run_ranks(world, [](const dist::DistEnv& env) {
      auto pg = connect(env);
      dist::Communicator& c = *pg.comm;
      const int n = c.size();
      for (DType dt : {DType::f32, DType::bf16}) {
        c.all_reduce(zeros({0}, {dt}), dist::ReduceOp::sum)->wait();
        c.all_reduce(zeros({0}, {dt}), dist::ReduceOp::avg)->wait();
        c.all_gather(zeros({0}, {dt}), zeros({0}, {dt}))->wait();
        c.reduce_scatter(zeros({0}, {dt}), zeros({0}, {dt}), dist::ReduceOp::max)->wait();
        c.all_to_all(zeros({0}, {dt}), zeros({0}, {dt}))->wait();
        c.broadcast(zeros({0}, {dt}), n - 1)->wait();
      }
      Tensor gathered = zeros({3 * n});
      c.all_gather(rank_input(c.rank(), 3, DType::f32), gathered)->wait();
      const auto gv = gathered.to_vector<float>();
      for (int q = 0; q < n; ++q)
        expect(gv[3 * q + 2] == input_value(q, 2), fmt::format("all_gather after the empty ones: chunk {}", q));
      c.barrier();
    });
    INFO(world << " ranks, exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
  }
}
