// Failure behaviour (Note [Collective timeouts]): a rank that exits or stalls makes the others fail with an
// error within the timeout, never hang; ranks that disagree are named. Each case forks its ranks with a
// short dist timeout and asserts both the error text and that it came in time.
#include <unistd.h>

#include <thread>

#include "dist_testing.h"
#include "hadatrain/core/error.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"

using namespace ht;
using ht::test::expect;
using Clock = std::chrono::steady_clock;

namespace {

dist::ProcessGroup connect(const dist::DistEnv& env, std::chrono::milliseconds timeout) {
  return dist::init_process_group(env, {.engine = "gloo", .device = Device::cpu(), .timeout = timeout});
}

// Runs `f`, expects an ht::Error containing `text` within `within`.
template <typename F>
void expect_error(F&& f, const std::string& text, std::chrono::milliseconds within) {
  const auto t0 = Clock::now();
  try {
    f();
  } catch (const Error& e) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    expect(std::string(e.what()).find(text) != std::string::npos,
           fmt::format("the error should say '{}', it says: {}", text, e.what()));
    expect(took <= within, fmt::format("the error came after {} ms, expected within {} ms", took.count(),
                                       within.count()));
    return;
  }
  throw Error(fmt::format("no error; expected one saying '{}'", text));
}

}  // namespace

TEST_CASE("a rank that exits makes the other's collective fail at once", "[dist]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env, std::chrono::seconds(30));
    pg.comm->barrier();
    if (env.rank == 1) ::_exit(3);  // dies without a word
    Tensor t = ones({1024});
    // The closed connection is seen well before the 30 s timeout.
    expect_error([&] { pg.comm->all_reduce(t, dist::ReduceOp::sum)->wait(); }, "gloo all_reduce (sum) of f32 (1024)",
                 std::chrono::seconds(10));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(out[0].exit_code == 0);
  REQUIRE(out[1].exit_code == 3);
}

TEST_CASE("a rank that stalls makes the other's collective fail after dist.timeout_s", "[dist]") {
  const auto out = ht::test::run_ranks(2, [](const dist::DistEnv& env) {
    auto pg = connect(env, std::chrono::milliseconds(1500));
    pg.comm->barrier();
    if (env.rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(5));  // alive but not taking part
      ::_exit(0);
    }
    Tensor t = ones({16});
    const auto t0 = Clock::now();
    expect_error([&] { pg.comm->all_reduce(t, dist::ReduceOp::sum)->wait(); }, "exited or stalled past dist.timeout_s",
                 std::chrono::milliseconds(4500));
    expect(Clock::now() - t0 >= std::chrono::milliseconds(1400), "the error came before the timeout");
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("a rank that never arrives at the rendezvous stops the others with an error naming the wait", "[dist]") {
  const auto out = ht::test::run_ranks(3, [](const dist::DistEnv& env) {
    if (env.rank == 2) return;  // never connects
    expect_error([&] { connect(env, std::chrono::milliseconds(1000)); }, "was not set by another rank within 1 s",
                 std::chrono::seconds(5));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("ranks whose configs differ are named at the start", "[dist]") {
  const auto out = ht::test::run_ranks(3, [](const dist::DistEnv& env) {
    auto pg = connect(env, std::chrono::seconds(10));
    dist::check_same_on_all_ranks(*pg.store, env, "same thing", "abc");
    expect_error([&] { dist::check_same_on_all_ranks(*pg.store, env, "config hash", env.rank == 2 ? "f00d" : "beef"); },
                 "the ranks disagree on the config hash: rank 2 has f00d but rank 0 has beef",
                 std::chrono::seconds(5));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

// Note [Comparing the ranks' configs]: every rank names the first rank that differs, what differs (the caller's
// description of the two texts) and the other ranks that differ too.
TEST_CASE("ranks whose texts differ are described by the caller, the other differing ranks named", "[dist]") {
  const auto out = ht::test::run_ranks(4, [](const dist::DistEnv& env) {
    auto pg = connect(env, std::chrono::seconds(10));
    const std::string text = env.rank == 1 || env.rank == 3 ? "lr: 0.2" : "lr: 0.1";
    const auto describe = [](const std::string& reference, const std::string& other, int rank) {
      return fmt::format("[{}] of rank {} against [{}]", other, rank, reference);
    };
    expect_error([&] { dist::check_same_on_all_ranks(*pg.store, env, "config", text, describe); },
                 "the ranks disagree on the config: [lr: 0.2] of rank 1 against [lr: 0.1] (rank(s) 3 differ from rank 0 "
                 "too); every rank must run the same command (check the arguments and --set overrides of rank 1)",
                 std::chrono::seconds(5));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}

TEST_CASE("a store client without a server gives up after the timeout naming the address", "[dist]") {
  const int port = ht::test::free_port();
  const auto t0 = Clock::now();
  REQUIRE_THROWS_WITH(dist::TcpStore({.host = "127.0.0.1", .port = port, .timeout = std::chrono::milliseconds(300)}),
                      HasSubstr(fmt::format("cannot reach rank 0's store at 127.0.0.1:{} within 0.3 s", port)));
  REQUIRE(Clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("the store sets, waits for, and counts keys across processes", "[dist]") {
  const auto out = ht::test::run_ranks(4, [](const dist::DistEnv& env) {
    dist::TcpStore store({.host = env.master_addr, .port = env.master_port, .is_server = env.rank == 0,
                          .world_size = env.world_size, .timeout = std::chrono::seconds(10)});
    store.set_string("from/" + std::to_string(env.rank), std::string(env.rank + 1, 'x'));
    for (int r = 0; r < env.world_size; ++r)
      expect(store.get_string("from/" + std::to_string(r)) == std::string(r + 1, 'x'), "the value rank r set");
    store.add("count", env.rank + 1);
    store.set_string("added/" + std::to_string(env.rank), "");
    for (int r = 0; r < env.world_size; ++r) store.get("added/" + std::to_string(r));
    expect(store.add("count", 0) == 10, "1+2+3+4 after every rank added");
    store.set_string("done/" + std::to_string(env.rank), "");
    if (env.rank == 0)  // the server stays until every client is done with it
      for (int r = 0; r < env.world_size; ++r) store.get("done/" + std::to_string(r));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
}
