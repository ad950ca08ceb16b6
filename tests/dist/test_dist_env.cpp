// Rendezvous variables (dist/rendezvous.h): torchrun's, Slurm's, none, and malformed ones.
#include <map>

#include "hadatrain/dist/rendezvous.h"
#include "support/catch.h"

using namespace ht;

namespace {
dist::GetEnv env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& n) -> std::optional<std::string> {
    const auto it = vars.find(n);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}
}  // namespace

TEST_CASE("torchrun variables", "[dist]") {
  const auto e = dist::dist_env_from_environment(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                         {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}}));
  CHECK(e.source == "torchrun");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "node7");
  CHECK(e.master_port == 1234);
}

TEST_CASE("no variables: one process", "[dist]") {
  const auto e = dist::dist_env_from_environment(env_of({}));
  CHECK(e.source == "none");
  CHECK(e.world_size == 1);
  CHECK(e.rank == 0);
}

TEST_CASE("Slurm variables, the server on the first node of the list", "[dist]") {
  const auto e = dist::dist_env_from_environment(
      env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
              {"SLURM_NODELIST", "gpu[003-004,010],cpu01"}}));
  CHECK(e.source == "slurm");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 16);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "gpu003");
  CHECK(e.master_port == 29500);
  // MASTER_ADDR wins over the node list.
  CHECK(dist::dist_env_from_environment(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                                {"SLURM_NODELIST", "a1"}, {"MASTER_ADDR", "10.0.0.1"}}))
            .master_addr == "10.0.0.1");
}

TEST_CASE("first host of Slurm node lists", "[dist]") {
  CHECK(dist::first_slurm_host("node01") == "node01");
  CHECK(dist::first_slurm_host("node01,node02") == "node01");
  CHECK(dist::first_slurm_host("gpu[07-09]") == "gpu07");
  CHECK(dist::first_slurm_host("gpu[12,3-4]-ib") == "gpu12-ib");
}

TEST_CASE("malformed variables are errors naming them", "[dist]") {
  REQUIRE_THROWS_WITH(dist::dist_env_from_environment(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
                      HasSubstr("RANK 2 is not below WORLD_SIZE 2"));
  REQUIRE_THROWS_WITH(dist::dist_env_from_environment(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})),
                      HasSubstr("environment variable RANK='x' is not an integer"));
  REQUIRE_THROWS_WITH(dist::dist_env_from_environment(env_of({{"RANK", "0"}})),
                      HasSubstr("RANK is set but WORLD_SIZE is not"));
  REQUIRE_THROWS_WITH(
      dist::dist_env_from_environment(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}})),
      HasSubstr("MASTER_PORT 70000 is not a TCP port"));
}
