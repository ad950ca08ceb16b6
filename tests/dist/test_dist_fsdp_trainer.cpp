// `hadatrain train` with dist.mode fsdp over Gloo, ranks forked with the launcher's variables set (as
// `hadatrain launch` sets them): the logged losses of a tiny LLaMA (AdamW, clipping by the global norm, one
// unit per decoder block) and of an MLP on images, sharded over 2 and 4 ranks, equal one process's with the
// same global batch within 1e-5 relative (the same products summed in another order: Note [Data-parallel
// equivalence]), with gradient accumulation too (communicating once per step), the clipped gradient norm is
// the one-process norm, and every rank logs the same losses; a 2-rank checkpoint resumes on 1 and 4 ranks.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dist_testing.h"
#include "dist_trainer_testing.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {


TrainerConfig tiny_lm(const std::string& name, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "optim.clip_grad_norm=0.5");
  return test::tiny_lm_run(test::scratch_dir() / name, extra);
}

TrainerConfig mlp(const std::string& name, std::vector<std::string> extra = {}) {
  return test::idx8_config(
      "fsdp_trainer_mlp.yaml",
      "run:\n  seed: 5\n"
      "data:\n  dataset: mnist\n  root: {root}\n  batch_size: 16\n  eval_batch_size: 16\n  num_workers: 0\n"
      "model:\n  name: mlp\n  hidden: [16, 16]\n"
      "optim:\n  name: adamw\n  lr: 0.01\n  weight_decay: 0.01\n  clip_grad_norm: 0.5\n"
      "train:\n  epochs: 2\n  log_every: 1\n",
      name, std::move(extra));
}

// A train record's `key` by step from metrics.jsonl.
std::vector<double> train_values(const fs::path& out_dir, const std::string& key) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "train") out.push_back(j.at(key).get<double>());
  }
  return out;
}
std::vector<double> losses(const fs::path& out_dir) { return train_values(out_dir, "loss"); }

using ht::test::set_rank_env;

using MakeConfig = TrainerConfig (*)(const std::string&, std::vector<std::string>);

// One process (dist.mode none) against `world` fsdp ranks; `extra` applies to both, but for its dist keys, which are
// fsdp's (a config error under dist.mode none) and go to the fsdp ranks only.
void check_fsdp_matches_one_process(MakeConfig make, const std::string& tag, int world, std::size_t steps,
                                    const std::vector<std::string>& extra = {}) {
  const std::string ref_name = tag + "_ref", name = fmt::format("{}_fsdp{}", tag, world);
  std::vector<std::string> ref_extra;
  for (const std::string& s : extra)
    if (s.rfind("dist.", 0) != 0) ref_extra.push_back(s);
  test::scratch_dir();  // made once, before the fork: every rank and run shares it
  make(ref_name, ref_extra);  // the image config file too
  const auto ref = ht::test::run_ranks(1, [&](const dist::DistEnv&) { run_training(make(ref_name, ref_extra)); });
  REQUIRE(ht::test::all_passed(ref));
  std::vector<std::string> sets = extra;
  for (const char* s : {"dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30"}) sets.push_back(s);
  const auto out = ht::test::run_ranks(world, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    run_training(make(name, sets));
  });
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  const auto expected = losses(test::scratch_dir() / ref_name);
  const auto got = losses(test::scratch_dir() / name);
  REQUIRE(expected.size() == steps);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("step " << i + 1 << ": " << world << " fsdp ranks " << got[i] << ", one process " << expected[i]);
    CHECK(std::abs(got[i] - expected[i]) <= 1e-5 * std::abs(expected[i]));
  }
  // The losses change over the steps (the updates reach the shards and are gathered again).
  CHECK(got.front() != got.back());
  // Clipping (optim.clip_grad_norm 0.5) saw the whole model's norm: the norm over every rank's shards.
  const auto norms = train_values(test::scratch_dir() / name, "grad_norm");
  const auto ref_norms = train_values(test::scratch_dir() / ref_name, "grad_norm");
  REQUIRE(norms.size() == ref_norms.size());
  CHECK(*std::max_element(ref_norms.begin(), ref_norms.end()) > 0.5);  // clipping acted
  for (std::size_t i = 0; i < norms.size(); ++i) {
    INFO("step " << i + 1 << ": grad_norm " << norms[i] << ", one process " << ref_norms[i]);
    CHECK(std::abs(norms[i] - ref_norms[i]) <= 1e-5 * ref_norms[i]);
  }
  for (int r = 1; r < world; ++r) CHECK(losses(test::scratch_dir() / name / fmt::format("rank{}", r)) == got);
}

}  // namespace

TEST_CASE("train with dist.mode fsdp: a tiny LLaMA on 2 ranks logs one process's losses", "[dist][fsdp][trainer]") {
  check_fsdp_matches_one_process(tiny_lm, "lm", 2, 6);
}

TEST_CASE("train with dist.mode fsdp: gradient accumulation on 2 ranks logs one process's losses",
          "[dist][fsdp][trainer]") {
  check_fsdp_matches_one_process(tiny_lm, "lm_accum", 2, 6, {"train.grad_accum_steps=2"});
}

// A global batch of 5 rows on 2 ranks slices into 3 and 2 rows, fewer than the 3 micro-batches asked for on rank 1:
// every rank runs 2 (Note [Micro-batches on every rank]), so their forwards' gathers pair up, and the gradient is
// still the whole batch's.
TEST_CASE("train with dist.mode fsdp: gradient accumulation with more micro-batches than a rank's rows",
          "[dist][fsdp][trainer]") {
  check_fsdp_matches_one_process(tiny_lm, "lm_accum_uneven", 2, 4,
                                 {"data.batch_size=5", "train.grad_accum_steps=3", "train.max_steps=4"});
}

TEST_CASE("train with dist.mode fsdp: an MLP on images on 2 and 4 ranks logs one process's losses",
          "[dist][fsdp][trainer]") {
  check_fsdp_matches_one_process(mlp, "mlp", 2, 8);
  check_fsdp_matches_one_process(mlp, "mlp4", 4, 8, {"dist.fsdp_units=[1.]", "dist.prefetch=false"});
}

// A checkpoint written by 2 fsdp ranks (checkpoint.sharded, the default: each rank writes its shard file, rank 0
// publishes the step) resumed on 1 and on 4 ranks continues with the uninterrupted run's losses (within 1e-5
// relative: the sums' order differs with the world size; the checkpoint itself holds the exact f32 state).
TEST_CASE("train with dist.mode fsdp: a 2-rank checkpoint resumes on 1 and on 4 ranks", "[dist][fsdp][trainer]") {
  test::scratch_dir();  // made once, before the fork: every rank and run shares it
  const auto ref = ht::test::run_ranks(1, [](const dist::DistEnv&) { run_training(tiny_lm("ck_ref")); });
  REQUIRE(ht::test::all_passed(ref));
  const std::vector<std::string> fsdp = {"dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), fsdp.begin(), fsdp.end());
    return sets;
  };
  const auto two = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    run_training(tiny_lm("ck_two", with({"checkpoint.every_steps=3"})));
  });
  INFO("exit codes " << ht::test::exit_codes(two));
  REQUIRE(ht::test::all_passed(two));
  const fs::path step3 = test::scratch_dir() / "ck_two" / "checkpoints" / "step_3";
  REQUIRE(fs::exists(step3 / "model.safetensors"));
  CHECK_FALSE(fs::exists(test::scratch_dir() / "ck_two" / "rank1" / "checkpoints"));  // all in rank 0's checkpoint.dir
  const auto expected = losses(test::scratch_dir() / "ck_ref");
  REQUIRE(expected.size() == 6);
  for (const int world : {1, 4}) {
    const std::string name = fmt::format("ck_resume{}", world);
    const auto out = ht::test::run_ranks(world, [&](const dist::DistEnv& env) {
      set_rank_env(env);
      run_training(tiny_lm(name, with({})), ResumeFrom{.kind = ResumeFrom::Kind::path, .path = step3.string()});
    });
    INFO("exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
    const auto got = losses(test::scratch_dir() / name);
    REQUIRE(got.size() == 3);  // steps 4 to 6
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("step " << i + 4 << ": resumed on " << world << " rank(s) " << got[i] << ", uninterrupted " << expected[i + 3]);
      CHECK(std::abs(got[i] - expected[i + 3]) <= 1e-5 * std::abs(expected[i + 3]));
    }
  }
}

// Bytes on the wire per step (Note [Bytes on the wire] in dist/communicator.h) in metrics.jsonl, against the
// formula for the MLP's parameters (shapes read from a one-process checkpoint) on 2 ranks: per parameter of
// n elements, chunk = ceil(n / N), an all-gather of N chunks sends (N-1) chunk f32 values, Gloo's
// reduce-scatter (an all-reduce) 2 (N-1) chunk; with reshard_after_forward every unit but the forward's last
// is gathered again in backward; the loss (f32) and the clipping norm (f64) are one all-reduce each.
TEST_CASE("train with dist.mode fsdp logs the bytes on the wire of each step", "[dist][fsdp][trainer]") {
  test::scratch_dir();
  const auto one = ht::test::run_ranks(1, [](const dist::DistEnv&) {
    run_training(mlp("bytes_shapes", {"train.max_steps=1", "checkpoint.every_steps=1"}));
  });
  REQUIRE(ht::test::all_passed(one));
  const auto shapes = io::load_safetensors(test::scratch_dir() / "bytes_shapes" / "checkpoints" / "step_1" / "model.safetensors");
  constexpr int64_t kWorld = 2;
  int64_t chunks = 0, chunks_last_unit = 0;
  std::string last_unit;
  for (const auto& [name, t] : shapes.tensors) {
    const int64_t chunk = (t.numel() + kWorld - 1) / kWorld;
    chunks += chunk;
    const std::string unit = name.substr(0, name.rfind('.'));  // the layer ("5" of "5.weight"): its unit
    if (unit > last_unit) last_unit = unit, chunks_last_unit = 0;
    if (unit == last_unit) chunks_last_unit += chunk;
  }
  for (const bool reshard : {false, true}) {
    const std::string name = reshard ? "bytes_reshard" : "bytes_kept";
    const auto out = ht::test::run_ranks(kWorld, [&](const dist::DistEnv& env) {
      set_rank_env(env);
      run_training(mlp(name, {"dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30", "train.max_steps=3",
                              fmt::format("dist.reshard_after_forward={}", reshard)}));
    });
    INFO("exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
    const int64_t gathered = reshard ? 2 * chunks - chunks_last_unit : chunks;
    const double all_gather = static_cast<double>((kWorld - 1) * 4 * gathered);
    const double reduce_scatter = static_cast<double>(2 * (kWorld - 1) * 4 * chunks);
    const double all_reduce = 2.0 * ((kWorld - 1) * 4 / kWorld) + 2.0 * ((kWorld - 1) * 8 / kWorld);
    for (const fs::path dir : {test::scratch_dir() / name, test::scratch_dir() / name / "rank1"}) {
      INFO(dir.string() << ", reshard_after_forward " << reshard << ", " << chunks << " chunk elements, "
                        << chunks_last_unit << " in " << last_unit);
      const auto ag = train_values(dir, "comm_bytes_all_gather");
      REQUIRE(ag.size() == 3);
      for (std::size_t i = 0; i < ag.size(); ++i) {
        CHECK(ag[i] == all_gather);
        CHECK(train_values(dir, "comm_bytes_reduce_scatter")[i] == reduce_scatter);
        CHECK(train_values(dir, "comm_bytes_all_reduce")[i] == all_reduce);
        CHECK(train_values(dir, "comm_bytes_broadcast")[i] == 0);
        CHECK(train_values(dir, "comm_bytes")[i] == all_gather + reduce_scatter + all_reduce);
      }
    }
  }
}

// checkpoint.sharded (the default under fsdp): each rank writes shard-<rank>-of-<N>.safetensors into the
// step's folder (model.safetensors keeps only what is not sharded), published when every shard is durable.
// Resumed on the same world size it continues bit for bit; on another world size (2 -> 1, 2 -> 4, 4 -> 2)
// and under ddp within 1e-5 relative (the sums' order changes with the world size); `hadatrain eval` reads
// it and scores the weights exactly as the plain checkpoint (checkpoint.sharded=false) of the same run.
TEST_CASE("train with dist.mode fsdp writes sharded checkpoints that resume on any world size",
          "[dist][fsdp][trainer]") {
  test::scratch_dir();
  const std::vector<std::string> fsdp = {"dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30"};
  auto with = [&](std::vector<std::string> sets, const std::vector<std::string>& mode) {
    sets.insert(sets.end(), mode.begin(), mode.end());
    return sets;
  };
  auto run = [&](int world, const std::string& name, const std::vector<std::string>& sets, const fs::path& from = {}) {
    const auto out = ht::test::run_ranks(world, [&](const dist::DistEnv& env) {
      set_rank_env(env);
      if (from.empty()) run_training(tiny_lm(name, sets));
      else run_training(tiny_lm(name, sets), ResumeFrom{.kind = ResumeFrom::Kind::path, .path = from.string()});
    });
    INFO(name << ": exit codes " << ht::test::exit_codes(out));
    REQUIRE(ht::test::all_passed(out));
    return losses(test::scratch_dir() / name);
  };
  const auto two = run(2, "sh_two", with({"checkpoint.every_steps=3", "checkpoint.keep_last=0"}, fsdp));
  const auto four = run(4, "sh_four", with({"checkpoint.every_steps=3", "checkpoint.keep_last=0"}, fsdp));
  REQUIRE(two.size() == 6);
  REQUIRE(four.size() == 6);
  const fs::path root2 = test::scratch_dir() / "sh_two" / "checkpoints", step3 = root2 / "step_3";
  for (const char* f : {"shard-0-of-2.safetensors", "shard-1-of-2.safetensors", "model.safetensors", "state.json"})
    CHECK(fs::exists(step3 / f));
  CHECK_FALSE(fs::exists(step3 / "optimizer.safetensors"));  // the optimiser state is in the shards
  CHECK(io::load_safetensors(step3 / "model.safetensors").tensors.empty());  // a LLaMA: every tensor is sharded
  CHECK(io::latest_checkpoint_step(root2) == std::optional<int64_t>(6));
  for (const auto& e : fs::directory_iterator(root2)) CHECK(e.path().extension() != ".tmp");
  const auto shard = io::load_safetensors(step3 / "shard-1-of-2.safetensors");
  const auto meta = nlohmann::json::parse(shard.metadata.at("hadatrain_fsdp"));
  CHECK(meta.at("world_size") == 2);
  CHECK(meta.at("step") == 3);
  CHECK(meta.at("chunks").at("model/lm_head.weight").get<int64_t>() * 2 >=
        numel_of(Shape(meta.at("shapes").at("model/lm_head.weight").get<std::vector<int64_t>>())));

  auto tail_matches = [](const std::vector<double>& got, const std::vector<double>& ref, double rtol, const std::string& what) {
    REQUIRE(got.size() == 3);  // steps 4 to 6
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO(what << ", step " << i + 4 << ": " << got[i] << ", uninterrupted " << ref[i + 3]);
      if (rtol == 0) CHECK(got[i] == ref[i + 3]);
      else CHECK(std::abs(got[i] - ref[i + 3]) <= rtol * std::abs(ref[i + 3]));
    }
  };
  tail_matches(run(2, "sh_2to2", with({}, fsdp), step3), two, 0.0, "2 -> 2 ranks, bit for bit");
  tail_matches(run(1, "sh_2to1", {}, step3), two, 1e-5, "2 ranks -> one process");
  tail_matches(run(4, "sh_2to4", with({}, fsdp), step3), two, 1e-5, "2 -> 4 ranks");
  tail_matches(run(2, "sh_4to2", with({}, fsdp), test::scratch_dir() / "sh_four" / "checkpoints" / "step_3"), four, 1e-5,
               "4 -> 2 ranks");
  tail_matches(run(2, "sh_2toddp", with({}, {"dist.mode=ddp", "dist.engine=gloo", "dist.timeout_s=30"}), step3), two,
               1e-5, "2 fsdp -> 2 ddp ranks");

  // The same run with plain checkpoints: the same losses, and evaluation scores both checkpoints alike.
  const auto plain = run(2, "sh_plain", with({"checkpoint.every_steps=3", "checkpoint.sharded=false"}, fsdp));
  CHECK(plain == two);
  const fs::path plain3 = test::scratch_dir() / "sh_plain" / "checkpoints" / "step_3";
  CHECK(fs::exists(plain3 / "optimizer.safetensors"));
  CHECK_FALSE(fs::exists(plain3 / "shard-0-of-2.safetensors"));
  const EvalResult sharded_eval = run_evaluation(tiny_lm("sh_eval", {}), step3.string());
  const EvalResult plain_eval = run_evaluation(tiny_lm("sh_eval", {}), plain3.string());
  CHECK(sharded_eval.total > 0);
  CHECK(sharded_eval.loss == plain_eval.loss);
}

// An interrupted sharded save leaves its shards in step_<N>.shards.tmp: the checkpoint before it stays the
// one to resume, and the next save removes the leftover.
TEST_CASE("an interrupted sharded save leaves the previous checkpoint the latest", "[dist][fsdp][trainer]") {
  test::scratch_dir();
  const fs::path root = test::scratch_dir() / "sh_crash" / "checkpoints";
  const auto out = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    run_training(tiny_lm("sh_crash", {"checkpoint.every_steps=3", "train.max_steps=3", "dist.mode=fsdp",
                                      "dist.engine=gloo", "dist.timeout_s=30"}));
  });
  REQUIRE(ht::test::all_passed(out));
  // What a crash between the ranks' shard writes and the publication leaves: one shard, no step_6.
  fs::create_directories(root / "step_6.shards.tmp");
  fs::copy_file(root / "step_3" / "shard-0-of-2.safetensors", root / "step_6.shards.tmp" / "shard-0-of-2.safetensors");
  CHECK(io::latest_checkpoint_step(root) == std::optional<int64_t>(3));
  CHECK(io::list_checkpoints(root) == std::vector<int64_t>{3});
  const auto resumed = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    run_training(tiny_lm("sh_crash", {"checkpoint.every_steps=3", "dist.mode=fsdp", "dist.engine=gloo",
                                      "dist.timeout_s=30"}),
                 ResumeFrom{.kind = ResumeFrom::Kind::latest});
  });
  REQUIRE(ht::test::all_passed(resumed));
  CHECK(io::latest_checkpoint_step(root) == std::optional<int64_t>(6));
  CHECK_FALSE(fs::exists(root / "step_6.shards.tmp"));
  CHECK(fs::exists(root / "step_6" / "shard-1-of-2.safetensors"));
}

// Note [One save's shards]: a checkpoint folder whose shard files come from different saves (a leftover of another
// world size, a shard copied in from another step, model.safetensors of another step than its shards) is an error
// naming the folder, the files and what differs, in --resume, eval and the library; never a model joined from them.
TEST_CASE("a sharded checkpoint folder that mixes saves is an error naming the files", "[dist][fsdp][trainer]") {
  test::scratch_dir();
  const fs::path root = test::scratch_dir() / "sh_mixed" / "checkpoints";
  const auto out = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    run_training(tiny_lm("sh_mixed", {"checkpoint.every_steps=2", "checkpoint.keep_last=0", "train.max_steps=4",
                                      "dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30"}));
  });
  REQUIRE(ht::test::all_passed(out));
  REQUIRE(fs::exists(root / "step_4" / "shard-1-of-2.safetensors"));
  // A folder made from step_2, with one file replaced or added, as a hand copy would.
  auto mixed = [&](const std::string& name, const std::string& from_step4, const std::string& as) {
    const fs::path dir = test::scratch_dir() / "sh_mixed" / name;
    fs::copy(root / "step_2", dir, fs::copy_options::recursive);
    fs::copy_file(root / "step_4" / from_step4, dir / as, fs::copy_options::overwrite_existing);
    return dir;
  };
  auto resume_error = [&](const fs::path& dir) {
    return test::error_of([&] {
      run_training(tiny_lm("sh_mixed_resume", {}), ResumeFrom{.kind = ResumeFrom::Kind::path, .path = dir.string()});
    });
  };
  auto eval_error = [&](const fs::path& dir) {
    return test::error_of([&] { run_evaluation(tiny_lm("sh_mixed_eval", {}), dir.string()); });
  };

  // A leftover shard of a 4-rank save beside the 2-rank save's.
  const fs::path worlds = mixed("worlds", "shard-0-of-2.safetensors", "shard-0-of-4.safetensors");
  const std::string world_error = "fsdp: the sharded checkpoint " + worlds.string() +
                                  " holds the shards of 2 world sizes: shard-0-of-2.safetensors, "
                                  "shard-1-of-2.safetensors of 2 ranks; shard-0-of-4.safetensors of 4 ranks";
  CHECK_THAT(resume_error(worlds), HasSubstr(world_error));
  CHECK_THAT(eval_error(worlds), HasSubstr(world_error));
  CHECK_THAT(test::error_of([&] { dist::consolidate_sharded(worlds); }), HasSubstr(world_error));
  CHECK_THAT(test::error_of([&] { load_llama_source(find_llama_source(worlds)); }), HasSubstr(world_error));  // convert

  // Rank 1's shard of step 4 in step 2's folder.
  const fs::path steps = mixed("steps", "shard-1-of-2.safetensors", "shard-1-of-2.safetensors");
  const std::string step_error = "fsdp: the shards of the sharded checkpoint " + steps.string() +
                                 " were written at different steps (shard-0-of-2.safetensors at step 2, "
                                 "shard-1-of-2.safetensors at step 4)";
  CHECK_THAT(resume_error(steps), HasSubstr(step_error));
  CHECK_THAT(eval_error(steps), HasSubstr(step_error));

  // Both shards of step 4 beside step 2's model.safetensors and state.json.
  const fs::path model = mixed("model", "shard-1-of-2.safetensors", "shard-1-of-2.safetensors");
  fs::copy_file(root / "step_4" / "shard-0-of-2.safetensors", model / "shard-0-of-2.safetensors",
                fs::copy_options::overwrite_existing);
  const std::string model_error = "fsdp: the sharded checkpoint " + model.string() +
                                  " mixes saves: its model.safetensors is of step 2 but its shards "
                                  "(shard-*-of-2.safetensors) were written at step 4";
  CHECK_THAT(resume_error(model), HasSubstr(model_error));
  CHECK_THAT(eval_error(model), HasSubstr(model_error));
  CHECK_NOTHROW(dist::consolidate_sharded(model));  // the shards alone are one save's

  // Rank 1's shard of another model (its layout metadata says so).
  const fs::path tensors = mixed("tensors", "shard-1-of-2.safetensors", "unused.safetensors");
  io::SafetensorsContents shard1 = io::load_safetensors(tensors / "shard-1-of-2.safetensors");
  auto layout = nlohmann::json::parse(shard1.metadata.at("hadatrain_fsdp"));
  layout["shapes"]["model/lm_head.weight"] = {3, 5};
  shard1.metadata["hadatrain_fsdp"] = layout.dump();
  io::save_safetensors(tensors / "shard-1-of-2.safetensors", io::TensorList(shard1.tensors.begin(), shard1.tensors.end()),
                       shard1.metadata);
  CHECK_THAT(eval_error(tensors), HasSubstr("fsdp: the shards of the sharded checkpoint " + tensors.string() +
                                            " hold different tensors: 'model/lm_head.weight' is "));
  CHECK_THAT(eval_error(tensors), HasSubstr(" but [3,5] in shard-1-of-2.safetensors"));

  // A name no save writes.
  const fs::path rank = mixed("rank", "shard-1-of-2.safetensors", "shard-2-of-2.safetensors");
  CHECK_THAT(eval_error(rank), HasSubstr("fsdp: the sharded checkpoint " + rank.string() +
                                         " holds shard-2-of-2.safetensors, which names rank 2 of 2"));
  // The untouched folders still load.
  CHECK(dist::consolidate_sharded(root / "step_2").world_size == 2);
  CHECK(run_evaluation(tiny_lm("sh_mixed_eval", {}), (root / "step_4").string()).total > 0);
}

// A rank that cannot write its shard (a full disk, injected on rank 1 for step 2's shard) makes every rank take
// the same course at once: with on_save_failure continue all train on and the next save works; with stop all
// stop with the reason, rank 1 naming the disk and rank 0 naming rank 1, instead of rank 0 waiting out
// dist.timeout_s in a barrier rank 1 never reached.
TEST_CASE("a shard that cannot be written stops or continues every rank alike", "[dist][fsdp][trainer]") {
  test::scratch_dir();
  auto full_disk_on_rank1 = [](const dist::DistEnv& env) {
    if (env.rank != 1) return;
    io::set_write_fault_hook([](const fs::path& target, std::size_t) -> std::optional<io::WriteFault> {
      if (target.filename() == "shard-1-of-2.safetensors" && target.parent_path().filename() == "step_2.shards.tmp")
        return io::WriteFault{.bytes_written = 0, .error = ENOSPC};
      return std::nullopt;
    });
  };
  const std::vector<std::string> fsdp = {"dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30",
                                         "checkpoint.every_steps=2", "train.max_steps=4"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), fsdp.begin(), fsdp.end());
    return sets;
  };
  const auto goes_on = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    full_disk_on_rank1(env);
    run_training(tiny_lm("sh_full_continue", with({"checkpoint.on_save_failure=continue"})));
  });
  INFO("continue: exit codes " << ht::test::exit_codes(goes_on));
  REQUIRE(ht::test::all_passed(goes_on));
  const fs::path root = test::scratch_dir() / "sh_full_continue" / "checkpoints";
  CHECK(io::list_checkpoints(root) == std::vector<int64_t>{4});
  CHECK(losses(test::scratch_dir() / "sh_full_continue").size() == 4);

  const auto t0 = std::chrono::steady_clock::now();
  const auto stops = ht::test::run_ranks(2, [&](const dist::DistEnv& env) {
    set_rank_env(env);
    full_disk_on_rank1(env);
    const std::string err = test::error_of([&] { run_training(tiny_lm("sh_full_stop", with({}))); });
    ht::test::expect(err.find("the checkpoint of step 2") != std::string::npos &&
                         err.find("Training stopped") != std::string::npos,
                     "the error names the step and the policy; got: " + err);
    ht::test::expect(env.rank == 1 ? err.find("No space left on device") != std::string::npos
                                   : err.find("rank(s) 1 could not write its shard") != std::string::npos,
                     "the error says what failed where; got: " + err);
  });
  INFO("stop: exit codes " << ht::test::exit_codes(stops));
  CHECK(ht::test::all_passed(stops));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));  // not dist.timeout_s in a barrier
  CHECK(io::list_checkpoints(test::scratch_dir() / "sh_full_stop" / "checkpoints").empty());
}

// Note [Agreeing on a stop] under fsdp: a stop request only rank 0 sees stops both ranks after the same step, whose
// sharded checkpoint they write together (every rank's shard, rank 0's publication), and both return with the signal.
TEST_CASE("under fsdp a stop request one rank sees stops every rank after the same step", "[dist][fsdp][trainer]") {
  test::scratch_dir();
  const auto out = ht::test::run_stop_seen_by_rank0(
      [] {
        return tiny_lm("fsdp_stop",
                       {"dist.mode=fsdp", "dist.engine=gloo", "dist.timeout_s=30", "checkpoint.every_steps=100"});
      },
      SIGINT);
  INFO("exit codes " << ht::test::exit_codes(out));
  REQUIRE(ht::test::all_passed(out));
  const fs::path step2 = test::scratch_dir() / "fsdp_stop" / "checkpoints" / "step_2";
  CHECK(fs::exists(step2 / "shard-0-of-2.safetensors"));
  CHECK(fs::exists(step2 / "shard-1-of-2.safetensors"));
  CHECK(io::list_checkpoints(test::scratch_dir() / "fsdp_stop" / "checkpoints") == std::vector<int64_t>{2});
}
