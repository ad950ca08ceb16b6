// Multi-process tests without a launcher: run_ranks(n, body) forks n processes, gives each its DistEnv
// (rank, world size, a free port on 127.0.0.1 for rank 0's store) and runs body in it. A rank passes when
// body returns; an exception (or expect() failing) prints "rank R: message" on stderr and fails that rank.
// The parent waits at most `limit` for all of them, kills the rest past it (a hang fails the test in
// seconds instead of blocking CI) and returns each rank's outcome.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "hadatrain/dist/communicator.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::test {

struct RankOutcome {
  int exit_code = -1;  // 0: body returned; 1: it threw; 124: killed at the limit; 128+n: killed by signal n
};

std::vector<RankOutcome> run_ranks(int n, const std::function<void(const dist::DistEnv&)>& body,
                                   std::chrono::seconds limit = std::chrono::seconds(60));
// Each rank's exit codes as one string ("0 0 1 0") for a readable assertion message.
std::string exit_codes(const std::vector<RankOutcome>& outcomes);
bool all_passed(const std::vector<RankOutcome>& outcomes);

// Inside a rank: throws ht::Error with `message` unless `ok`.
void expect(bool ok, const std::string& message);

// A port on 127.0.0.1 no socket was bound to a moment ago.
int free_port();

// Inside a rank: sets the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) of `env` in
// this process's environment, for code that rendezvouses from them (the trainer).
void set_rank_env(const dist::DistEnv& env);

// One batch of a tiny LM's training data: (B, T) random token ids below `vocab` drawn from `gen`, and as targets
// (7 id + 3) mod vocab, a rule a model can learn. Both i64, the whole global batch.
struct RuleBatch {
  Tensor ids, targets;
};
RuleBatch rule_batch(Generator& gen, int64_t batch, int64_t seq, int64_t vocab);
// Keeps this rank's rows of a global batch (data::row_slice; all of them without a communicator) and returns
// their share of the global batch, the factor a rank's mean loss is weighted by.
double keep_rank_rows(RuleBatch& batch, const dist::Communicator* comm);

}  // namespace ht::test
